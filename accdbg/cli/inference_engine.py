"""``--inference_engine``: flags in, :func:`run_inference_engine` out.

Flags of the reference tool that have no meaning with onnxruntime-qnn (SDK paths, device ids,
converter/lib-generator arguments) are accepted so existing command lines keep working, and
each one given is logged as ignored; those that would change results refuse to run.
"""

from __future__ import annotations

import argparse
import logging

from accdbg.cli import args as A
from accdbg.engines import run_inference_engine
from accdbg.engines.options import (
    OUTPUT_DATA_TYPES,
    PRECISIONS,
    STAGES,
    BackendOptions,
    DumpOptions,
    EngineConfig,
    InputOptions,
    LayerFilter,
    QuantOptions,
)
from accdbg.engines.qnn import ARCHITECTURES, RUNTIMES, qnn_version
from accdbg.engines.quantize import QUANTIZERS
from accdbg.errors import AccdbgError

NAME = "inference_engine"
HELP = "run the model on the QNN runtime (HTP) and dump every intermediate tensor"
log = logging.getLogger("accdbg")

IGNORED = (
    "engine_path",
    "deviceId",
    "host_device",
    "engine_version",
    "offline_prepare",
    "lib_name",
    "binaries_dir",
    "model_name",
    "input_data_type",
    "log_level",
    "extra_runtime_args",
    "compiler_config",
    "qnn_model_net_json",
)


CONVERTER_ARTEFACTS = ("qnn_model_cpp_path", "qnn_model_bin_path", "extra_converter_args")


def add_quantizer_arguments(group) -> None:
    """The quantizer's flags, one declaration for the engine and the fix search's baseline:
    bitwidths, quantizer schemes, per-channel weights (defaults: :class:`QuantOptions`)."""
    Q = QuantOptions
    group.add_argument("-abw", "--act_bitwidth", type=int, choices=(8, 16), default=Q.act_bitwidth)
    group.add_argument(
        "-wbw",
        "--weights_bitwidth",
        type=int,
        choices=(4, 8, 16),
        default=Q.weights_bitwidth,
        help="4: int4 weights (per channel, symmetric) on Conv 1x1, Gemm and MatMul - where "
        "HTP runs int4 - and 8-bit weights on the other layers",
    )
    group.add_argument(
        "--weight_block_size",
        type=int,
        default=Q.weight_block_size,
        help="with -wbw 4: int4 weights in blocks of N input channels (LPBQ); onnxruntime-qnn "
        "runs them on MatMul with 16-bit activations only",
    )
    group.add_argument("-pq", "--param_quantizer", choices=QUANTIZERS, default=Q.param_quantizer)
    group.add_argument("--act_quantizer", choices=QUANTIZERS, default=Q.act_quantizer)
    group.add_argument("--per_channel_quantization", action="store_true", default=Q.per_channel)
    group.add_argument(
        "--keep_removable_activations",
        action="store_true",
        default=Q.keep_activations,
        help="keep every Relu/Clip as a node (onnxruntime's quantizer folds one into its "
        "output's encoding, exact only when that encoding starts at its bound)",
    )


class EngineArgs(A.ArgGroup):
    """The inference-engine flags (shared with the end-to-end wrapper), parsed into an
    :class:`~accdbg.engines.options.EngineConfig`. ``runtime_required``: ``-r`` must be given
    (the ``--inference_engine`` component, as in the reference tool); else it defaults."""

    def __init__(self, runtime_required: bool = True):
        self.runtime_required = runtime_required
        # the --inference_engine component itself (the wrapper shares the rest): the reference
        # spells --golden_dir_for_mapping also --golden_output_reference_directory and passes
        # the engine a --default_verifier; the wrapper has flags of those names of its own
        self.component = runtime_required

    def add(self, parser: argparse.ArgumentParser) -> None:
        B = BackendOptions
        core = parser.add_argument_group("core arguments")
        core.add_argument(
            "-r",
            "--runtime",
            choices=RUNTIMES,
            default=None if self.runtime_required else B.runtime,
            required=self.runtime_required,
            help="htp/dsp*: QNN HTP (x86 emulation here); gpu; cpu",
        )
        core.add_argument(
            "-a",
            "--architecture",
            choices=ARCHITECTURES,
            type=A.spelled_as(ARCHITECTURES),
            default=B.architecture,
            help=f"host/device architecture (default {B.architecture}: HTP emulation on this host)",
        )
        core.add_argument(
            "-l",
            "--input_list",
            help="qnn-net-run input list: one inference per line; every line also calibrates the "
            "quantization (source stage, and layerwise/cumulative-layerwise)" + A.INPUT_LIST_FORMAT,
        )
        core.add_argument(
            "-nif",
            "--use_native_input_files",
            action="store_true",
            default=InputOptions.use_native_input_files,
            help="the input files (-i, -l) hold the ONNX model inputs' own types (int64 token "
            "ids, float16...), as qnn-net-run's flag; without it they are float32 - unless -i "
            "names a type - and are converted to the model's (whole numbers checked for an "
            "integer input). A QDQ model's inputs are float: its files are float32 either way",
        )
        core.add_argument(
            "--stage",
            choices=STAGES,
            default=EngineConfig.stage,
            help="source: float ONNX quantized here; converted: your QDQ ONNX; compiled: EPContext ONNX",
        )
        core.add_argument(
            "--engine",
            default=B.engine,
            type=str.lower,
            help="qnn (default, the real QNN runtime) or simulation (onnxruntime CPU fake-quant, not QNN)",
        )
        self._add_quantization(parser)
        self._add_dump(parser)
        self._add_compatibility(parser)

    def _add_quantization(self, parser: argparse.ArgumentParser) -> None:
        Q = QuantOptions
        q = parser.add_argument_group("quantization (source stage)")
        add_quantizer_arguments(q)
        q.add_argument(
            "-bbw",
            "--bias_bitwidth",
            type=int,
            choices=(8, 32),
            default=Q.bias_bitwidth,
            help="32 (QNN's QDQ path takes int32 biases only)",
        )
        q.add_argument(
            "-qo",
            "--quantization_overrides",
            help="AIMET encodings JSON (legacy or 1.0.0) to apply",
        )
        q.add_argument(
            "--ignore_encodings", action="store_true", help="ignore --quantization_overrides"
        )
        q.add_argument(
            "--precision",
            choices=PRECISIONS,
            default=Q.precision,
            help="fp16: the float model on HTP in fp16, no quantization",
        )
        q.add_argument(
            "--algorithms", help="('cle' is not available through onnxruntime quantization)"
        )
        q.add_argument(
            "-rqs",
            "--restrict_quantization_steps",
            default=Q.restrict_quantization_steps,
            metavar="'MIN MAX'",
            help="two hexadecimal literals, e.g. '-0x80 0x7F' (8-bit) or '-0x8000 0x7F7F' "
            "(16-bit): the tensors of that bitwidth get scale = (max - min) / (MAX - MIN) steps "
            "(onnxruntime's own ranges, quantized again with the restricted steps as fixed "
            "encodings; honoured as is where onnxruntime's steps are the same)",
        )
        q.add_argument(
            "-fbw",
            "--float_bias_bitwidth",
            type=int,
            choices=(16, 32),
            default=Q.float_bias_bitwidth,
            help="biases of a float run (--precision fp16): 16 rounds the Conv/Gemm biases to "
            "fp16 values; 32 keeps them fp32, and HTP's fp16 mode decides (onnxruntime-qnn has "
            "no bias-precision option)",
        )

    def _add_dump(self, parser: argparse.ArgumentParser) -> None:
        B, D = BackendOptions, DumpOptions
        d = parser.add_argument_group("debug output")
        d.add_argument(
            "--debug_mode_off",
            action="store_true",
            help="dump only the graph outputs (or, instead, those -o and the input list's '#' "
            "line name, as QNN produces them)",
        )
        d.add_argument(
            "-odt", "--output_data_type", choices=OUTPUT_DATA_TYPES, default=D.output_data_type
        )
        d.add_argument(
            "-nof",
            "--use_native_output_files",
            action="store_true",
            default=D.use_native_output_files,
            help="the dumped files in the graph's native type (the quantized integers as QNN "
            "produced them), as qnn-net-run's flag: -odt native_only (with -odt "
            "float_and_native, both)",
        )
        d.add_argument(
            "--add_layer_outputs",
            help="comma-separated outputs: dump only these (and --add_layer_types)",
        )
        d.add_argument(
            "--add_layer_types",
            help="comma-separated op types: dump only these (and --add_layer_outputs)",
        )
        d.add_argument("--skip_layer_types", help="comma-separated op types not to dump")
        d.add_argument("--skip_layer_outputs", help="comma-separated outputs not to dump")
        d.add_argument(
            "--profiling_level",
            choices=("basic", "detailed"),
            help="QNN profiling, written to qnn_profiling.csv",
        )
        d.add_argument(
            "--perf_profile", help="HTP performance mode, e.g. burst, balanced, high_performance"
        )
        d.add_argument("--soc_model", help="QNN SoC model id (default: one matching -r dspvNN)")
        d.add_argument(
            "--extra_contextbin_args",
            default=B.extra_contextbin_args,
            metavar="'ARG1=VALUE1;ARG2=VALUE2'",
            help="qnn-context-binary-generator's arguments: profiling_level and config_file "
            "(a qnn-net-run config) become the QNN execution provider's options; the others "
            "have no counterpart (onnxruntime-qnn makes the context itself), said in one line",
        )
        d.add_argument(
            "--qnn_netruntime_config_file",
            "--qnn_netrun_config_file",
            dest="qnn_netruntime_config_file",
            default=B.qnn_netruntime_config_file,
            metavar="FILE",
            help="qnn-net-run's JSON config: context_priority and the HTP backend extensions' "
            "vtcm_mb, O, fp16_relaxed_precision, soc_model, dsp_arch, device_id, perf_profile, "
            "rpc_control_latency become provider options; what has no counterpart is named "
            "in one line",
        )
        d.add_argument(
            "--disable_cpu_fallback",
            action="store_true",
            help="fail when any node would fall back to the CPU instead of running on QNN",
        )
        d.add_argument(
            "--golden_dir_for_mapping",
            *(
                ("--golden_output_reference_directory", "--goldenOutputReferenceDirectory")
                if self.component
                else ()
            ),
            dest="golden_dir_for_mapping",
            help="golden tensors folder, for a best-effort tensor mapping",
        )
        d.add_argument(
            "--framework_model_path",
            help="the float model, for the tensor mapping in the converted stage",
        )
        d.add_argument("--print_version", action="store_true", help="print the QNN version used")

    def _add_compatibility(self, parser: argparse.ArgumentParser) -> None:
        compat = parser.add_argument_group(
            "accepted for compatibility (no effect with onnxruntime-qnn)"
        )
        for flags, dest in (
            (("-p", "--engine_path"), "engine_path"),
            (("--deviceId",), "deviceId"),
            (("--host_device",), "host_device"),
            (("--engine_version",), "engine_version"),
            (("--lib_name",), "lib_name"),
            (("-bd", "--binaries_dir"), "binaries_dir"),
            (("-qmn", "--model_name"), "model_name"),
            (("-idt", "--input_data_type"), "input_data_type"),
            (("--log_level",), "log_level"),
            (("--extra_runtime_args",), "extra_runtime_args"),
            (("--compiler_config",), "compiler_config"),
            (("--qnn_model_net_json",), "qnn_model_net_json"),
            (("--extra_converter_args",), "extra_converter_args"),
            (("-qmcpp", "--qnn_model_cpp_path"), "qnn_model_cpp_path"),
            (("-qmbin", "--qnn_model_bin_path"), "qnn_model_bin_path"),
        ):
            compat.add_argument(*flags, dest=dest, default=None)
        compat.add_argument("--offline_prepare", action="store_true")
        if self.component:
            compat.add_argument(
                "--default_verifier",
                "--defaultVerifier",
                dest="default_verifier",
                action="append",
                nargs="+",
                default=None,
                help="(verification's: the engine runs no verifier; logged as ignored)",
            )
        compat.add_argument(
            "-qmb", "--qnn_model_binary_path", help="compiled stage: the EPContext ONNX model"
        )

    def parse(self, args: argparse.Namespace) -> EngineConfig:
        """The typed options; flags without effect are logged, those that would change the
        results are refused."""
        for dest in IGNORED:
            if getattr(args, dest, None) not in (None, False):
                log.info("ignored: --%s (no effect with onnxruntime-qnn)", dest)
        if getattr(args, "default_verifier", None):
            log.info(
                "ignored: --default_verifier (the inference engine compares nothing; "
                "--verification or the end-to-end run verify its dumps)"
            )
        if any(getattr(args, dest) for dest in CONVERTER_ARTEFACTS):
            raise AccdbgError(
                "-qmcpp/-qmbin/--extra_converter_args are QNN converter artefacts, which onnxruntime-qnn cannot run; "
                "give the QDQ ONNX model with -m and --stage converted"
            )
        if args.algorithms:
            raise AccdbgError(
                f"--algorithms {args.algorithms!r}: not available through onnxruntime quantization"
            )
        if args.print_version:
            log.info("%s", qnn_version())
        config = EngineConfig(
            stage=args.stage,
            quant=QuantOptions(
                act_bitwidth=args.act_bitwidth,
                weights_bitwidth=args.weights_bitwidth,
                weight_block_size=args.weight_block_size,
                bias_bitwidth=args.bias_bitwidth,
                act_quantizer=args.act_quantizer,
                param_quantizer=args.param_quantizer,
                per_channel=args.per_channel_quantization,
                keep_activations=args.keep_removable_activations,
                quantization_overrides=args.quantization_overrides,
                ignore_encodings=args.ignore_encodings,
                precision=args.precision,
                restrict_quantization_steps=args.restrict_quantization_steps,
                float_bias_bitwidth=args.float_bias_bitwidth,
            ),
            backend=BackendOptions(
                engine=args.engine,
                runtime=args.runtime,
                architecture=args.architecture,
                soc_model=args.soc_model,
                perf_profile=args.perf_profile,
                profiling_level=args.profiling_level,
                disable_cpu_fallback=args.disable_cpu_fallback,
                extra_contextbin_args=args.extra_contextbin_args,
                qnn_netruntime_config_file=args.qnn_netruntime_config_file,
            ),
            layers=LayerFilter(
                args.add_layer_outputs,
                args.add_layer_types,
                args.skip_layer_types,
                args.skip_layer_outputs,
            ),
            dump=DumpOptions(
                debug=not args.debug_mode_off,
                output_data_type=args.output_data_type,
                golden_dir_for_mapping=args.golden_dir_for_mapping,
                use_native_output_files=args.use_native_output_files,
            ),
            inputs=InputOptions(use_native_input_files=args.use_native_input_files),
        )
        for line in config.notes():  # once: the options are made here
            log.info("%s", line)
        return config


MODEL = A.ModelArgs(required=False, framework_default="onnx")
ENGINE = EngineArgs(runtime_required=True)
COMMON = A.CommonArgs(NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    MODEL.add(parser)
    ENGINE.add(parser)
    MODEL.group.add_argument(
        "--memory_budget_mb",
        type=float,
        default=A.FrameworkOptions.memory_budget_mb,
        help="most megabytes of exposed tensors per run; beyond it the dump is split",
    )
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    model, config, place = MODEL.parse(args), ENGINE.parse(args), COMMON.parse(args)
    if model.framework != "onnx":
        raise AccdbgError(
            f"-f {args.framework[0]}: the inference engine runs ONNX models; convert it first (see README: other frameworks)"
        )
    model_path = (
        args.qnn_model_binary_path
        if config.stage == "compiled" and args.qnn_model_binary_path
        else model.model_path
    )
    result = run_inference_engine(
        model_path=model_path,
        input_list=args.input_list,
        input_tensors=model.input_tensors,
        config=config,
        framework_model_path=args.framework_model_path,
        memory_budget_mb=args.memory_budget_mb,
        options_record=A.options_dict(args),
        allow_nonfinite_inputs=model.allow_nonfinite_inputs,
        output_tensors=model.output_tensors,
        **place.keywords(),
    )
    log.info("results: %s", ", ".join(str(p) for p in result.results))
    return 0
