"""``--inference_engine``: flags in, :func:`run_inference_engine` out.

Flags of the reference tool that have no meaning with onnxruntime-qnn (SDK paths, device ids,
converter/lib-generator arguments) are accepted so existing command lines keep working, and
each one given is logged as ignored; those that would change results refuse to run.
"""

from __future__ import annotations

import argparse
import logging

from accdbg.cli import args as A
from accdbg.core.inputs import parse_input_tensor
from accdbg.engines import run_inference_engine
from accdbg.engines.qnn import ARCHITECTURES, RUNTIMES, qnn_version
from accdbg.engines.quantize import QUANTIZERS
from accdbg.engines.run import OUTPUT_DATA_TYPES, STAGES
from accdbg.errors import AccdbgError
from accdbg.frameworks.versions import check_framework

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
    "qnn_netrun_config_file",
    "extra_runtime_args",
    "compiler_config",
    "qnn_model_net_json",
)


def split_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def add_engine_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """The inference-engine flags, shared with the end-to-end wrapper."""
    core = parser.add_argument_group("core arguments")
    core.add_argument(
        "-r",
        "--runtime",
        choices=RUNTIMES,
        default="htp" if not required else None,
        required=required,
        help="htp/dsp*: QNN HTP (x86 emulation here); gpu; cpu",
    )
    core.add_argument(
        "-a",
        "--architecture",
        choices=ARCHITECTURES,
        default="x86_64-linux-clang",
        help="host/device architecture (default x86_64-linux-clang: HTP emulation on this host)",
    )
    core.add_argument(
        "-l",
        "--input_list",
        help="qnn-net-run input list: one inference per line; every line also calibrates the "
        "quantization (source stage, and layerwise/cumulative-layerwise)",
    )
    core.add_argument(
        "--stage",
        choices=STAGES,
        default="source",
        help="source: float ONNX quantized here; converted: your QDQ ONNX; compiled: EPContext ONNX",
    )
    core.add_argument(
        "--engine",
        default="qnn",
        type=str.lower,
        help="qnn (default, the real QNN runtime) or simulation (onnxruntime CPU fake-quant, not QNN)",
    )
    q = parser.add_argument_group("quantization (source stage)")
    q.add_argument("-abw", "--act_bitwidth", type=int, choices=(8, 16), default=8)
    q.add_argument("-wbw", "--weights_bitwidth", type=int, choices=(8, 16), default=8)
    q.add_argument(
        "-bbw",
        "--bias_bitwidth",
        type=int,
        choices=(8, 32),
        default=32,
        help="32 (QNN's QDQ path takes int32 biases only)",
    )
    q.add_argument("-pq", "--param_quantizer", choices=QUANTIZERS, default="tf")
    q.add_argument("--act_quantizer", choices=QUANTIZERS, default="tf")
    q.add_argument("--per_channel_quantization", action="store_true")
    q.add_argument(
        "-qo", "--quantization_overrides", help="AIMET encodings JSON (legacy or 1.0.0) to apply"
    )
    q.add_argument(
        "--ignore_encodings", action="store_true", help="ignore --quantization_overrides"
    )
    q.add_argument(
        "--precision",
        choices=("int8", "fp16"),
        default="int8",
        help="fp16: the float model on HTP in fp16, no quantization",
    )
    q.add_argument("--algorithms", help="('cle' is not available through onnxruntime quantization)")
    d = parser.add_argument_group("debug output")
    d.add_argument("--debug_mode_off", action="store_true", help="dump only the graph outputs")
    d.add_argument("-odt", "--output_data_type", choices=OUTPUT_DATA_TYPES, default="float_only")
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
        "--disable_cpu_fallback",
        action="store_true",
        help="fail when any node would fall back to the CPU instead of running on QNN",
    )
    d.add_argument(
        "--golden_dir_for_mapping", help="golden tensors folder, for a best-effort tensor mapping"
    )
    d.add_argument(
        "--framework_model_path",
        help="the float model, for the tensor mapping in the converted stage",
    )
    d.add_argument("--print_version", action="store_true", help="print the QNN version used")
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
        (("--qnn_netrun_config_file",), "qnn_netrun_config_file"),
        (("--extra_runtime_args",), "extra_runtime_args"),
        (("--compiler_config",), "compiler_config"),
        (("--qnn_model_net_json",), "qnn_model_net_json"),
        (("--extra_converter_args",), "extra_converter_args"),
        (("-qmcpp", "--qnn_model_cpp_path"), "qnn_model_cpp_path"),
        (("-qmbin", "--qnn_model_bin_path"), "qnn_model_bin_path"),
    ):
        compat.add_argument(*flags, dest=dest, default=None)
    compat.add_argument("--offline_prepare", action="store_true")
    compat.add_argument(
        "-qmb", "--qnn_model_binary_path", help="compiled stage: the EPContext ONNX model"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model arguments")
    g.add_argument(
        "-m", "--model_path", help="the ONNX model (float for source, QDQ for converted)"
    )
    g.add_argument(
        "-f", "--framework", nargs="+", default=["onnx"], help="framework of the model (onnx)"
    )
    g.add_argument(
        "-i",
        "--input_tensor",
        nargs="+",
        action="append",
        default=[],
        metavar="INPUT_TENSOR",
        help='"name" dims path [dtype]: input dims (and a single inference when no -l)',
    )
    g.add_argument(
        "-o",
        "--output_tensor",
        action="append",
        default=[],
        help="graph output name (informational)",
    )
    A.add_allow_nonfinite(g)
    add_engine_arguments(parser)
    g.add_argument(
        "--memory_budget_mb",
        type=float,
        default=4096,
        help="most megabytes of exposed tensors per run; beyond it the dump is split",
    )
    A.add_common(parser, NAME)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """API keyword arguments from parsed engine flags (shared with the wrapper)."""
    for dest in IGNORED:
        if getattr(args, dest, None) not in (None, False):
            log.info("ignored: --%s (no effect with onnxruntime-qnn)", dest)
    if args.qnn_model_cpp_path or args.qnn_model_bin_path or args.extra_converter_args:
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
    return dict(
        runtime=args.runtime,
        architecture=args.architecture,
        engine=args.engine,
        act_bitwidth=args.act_bitwidth,
        weights_bitwidth=args.weights_bitwidth,
        bias_bitwidth=args.bias_bitwidth,
        act_quantizer=args.act_quantizer,
        param_quantizer=args.param_quantizer,
        per_channel=args.per_channel_quantization,
        quantization_overrides=args.quantization_overrides,
        ignore_encodings=args.ignore_encodings,
        precision=args.precision,
        debug=not args.debug_mode_off,
        output_data_type=args.output_data_type,
        add_layer_outputs=split_list(args.add_layer_outputs),
        add_layer_types=split_list(args.add_layer_types),
        skip_layer_types=split_list(args.skip_layer_types),
        skip_layer_outputs=split_list(args.skip_layer_outputs),
        profiling_level=args.profiling_level,
        perf_profile=args.perf_profile,
        soc_model=args.soc_model,
        disable_cpu_fallback=args.disable_cpu_fallback,
        golden_dir_for_mapping=args.golden_dir_for_mapping,
    )


def run(args: argparse.Namespace) -> int:
    if check_framework(args.framework) != "onnx":
        raise AccdbgError(
            f"-f {args.framework[0]}: the inference engine runs ONNX models; convert it first (see README: other frameworks)"
        )
    model = (
        args.qnn_model_binary_path
        if args.stage == "compiled" and args.qnn_model_binary_path
        else args.model_path
    )
    result = run_inference_engine(
        model_path=model,
        input_list=args.input_list,
        input_tensors=[parse_input_tensor(v) for v in args.input_tensor],
        stage=args.stage,
        framework_model_path=args.framework_model_path,
        working_dir=args.working_dir,
        output_dirname=args.output_dirname,
        memory_budget_mb=args.memory_budget_mb,
        options_record=A.options_dict(args),
        allow_nonfinite_inputs=args.allow_nonfinite_inputs,
        **engine_kwargs(args),
    )
    log.info("results: %s", ", ".join(str(p) for p in result.results))
    return 0
