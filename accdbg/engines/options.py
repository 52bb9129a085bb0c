"""The inference engine's options, typed: one dataclass per concept, defaults written once.

The CLI parses its argument groups into these objects (:mod:`accdbg.cli.args`), the Python API
builds them from plain keywords (:meth:`EngineConfig.from_keywords`), and every component that
runs or prepares a model - the inference engine, the snooping algorithms, oneshot - takes an
:class:`EngineConfig`. A new engine option is one field here (and its flag in the CLI group).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from accdbg.engines.base import Engine, EngineOptions, get_engine
from accdbg.engines.provider_options import Mapped, contextbin_args, netrun_config
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg")

STAGES = ("source", "converted", "compiled")
OUTPUT_DATA_TYPES = ("float_only", "native_only", "float_and_native")
PRECISIONS = ("int8", "fp16")


def names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``'a, b'`` or ``['a', 'b']`` -> ``('a', 'b')`` (comma-separated flags and API lists alike)."""
    if not value:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(s for s in (str(i).strip() for i in items) if s)


@dataclass(frozen=True)
class QuantOptions:
    """How the float model becomes the model QNN runs (source stage): quantized, or fp16."""

    act_bitwidth: int = 8
    weights_bitwidth: int = 8
    bias_bitwidth: int = 32
    act_quantizer: str = "tf"
    param_quantizer: str = "tf"
    per_channel: bool = False
    # Relu/Clip kept as nodes, not folded into their output's encoding (QDQKeepRemovableActivations)
    keep_activations: bool = False
    quantization_overrides: str | None = None  # -qo: AIMET encodings applied as overrides
    ignore_encodings: bool = False
    precision: str = "int8"  # fp16: no quantization, the float model on HTP in fp16
    # -rqs 'MIN MAX' (hex literals): scale = (max - min) / (MAX - MIN) steps
    restrict_quantization_steps: str | None = None
    float_bias_bitwidth: int | None = None  # -fbw 16|32: biases of a float (fp16) run
    # --weight_block_size N (-wbw 4 only): int4 weights in blocks of N along their input
    # channels (onnxruntime's BlockSize; HTP's LPBQ): see accdbg.engines.int4
    weight_block_size: int | None = None

    def __post_init__(self) -> None:
        """The flags whose bad values need no model to be told: one line at once (the CLI's
        parse, the API's keywords)."""
        if self.float_bias_bitwidth is not None and self.float_bias_bitwidth not in (16, 32):
            raise AccdbgError(
                f"-fbw/--float_bias_bitwidth {self.float_bias_bitwidth!r}: expected 16 or 32"
            )
        if self.restrict_quantization_steps is not None:
            parse_steps(self.restrict_quantization_steps)
        block = self.weight_block_size
        if block is not None and (
            isinstance(block, bool) or not isinstance(block, int) or block < 1
        ):
            raise AccdbgError(
                f"--weight_block_size {block!r}: expected a whole number of weights, 1 or more"
            )

    @property
    def quantizes(self) -> bool:
        return self.precision != "fp16"

    @property
    def quantization_steps(self) -> int | None:
        """``MAX - MIN`` of ``-rqs`` (checked), or None."""
        if self.restrict_quantization_steps is None:
            return None
        low, high = parse_steps(self.restrict_quantization_steps)
        return high - low

    @property
    def restricted_bits(self) -> int | None:
        """The bitwidth whose tensors ``-rqs`` applies to: the fewest bits holding its steps."""
        steps = self.quantization_steps
        return None if steps is None else (8 if steps <= 255 else 16)

    def own_steps(self) -> dict[str, int]:
        """The steps onnxruntime's quantizer gives the tensors ``-rqs`` applies to, by kind:
        2**bits - 1 on its unsigned (asymmetric) grids, 2**bits - 2 on its signed symmetric
        ones (-(2**(bits-1) - 1) .. 2**(bits-1) - 1)."""
        bits, out = self.restricted_bits, {}
        for kind, width, symmetric in (
            ("activations", self.act_bitwidth, False),  # symmetric activations stay unsigned
            ("weights", self.weights_bitwidth, self.param_quantizer == "symmetric"),
        ):
            if width == bits:
                out[kind] = 2**bits - (2 if symmetric else 1)
        return out

    @property
    def overrides(self) -> Path | None:
        """The ``-qo`` file in effect (None when not given or ignored)."""
        if self.quantization_overrides is None or self.ignore_encodings:
            return None
        return Path(self.quantization_overrides)

    def check(self) -> None:
        """One-line errors for bad values, before anything runs."""
        if self.precision not in PRECISIONS:
            raise AccdbgError(f"--precision {self.precision!r} is not known; expected int8 or fp16")
        if not self.quantizes:
            return
        if self.restrict_quantization_steps is not None and not self.own_steps():
            raise AccdbgError(
                f"-rqs/--restrict_quantization_steps {self.restrict_quantization_steps!r} is "
                f"{self.quantization_steps} steps, a {self.restricted_bits}-bit range; -abw "
                f"{self.act_bitwidth} and -wbw {self.weights_bitwidth} quantize no "
                f"{self.restricted_bits}-bit tensor"
            )
        from accdbg.engines.int4 import check_block_size
        from accdbg.engines.quantize import check_quantizer_options

        check_block_size(self.weight_block_size, self.weights_bitwidth, self.act_bitwidth)
        check_quantizer_options(
            self.act_bitwidth,
            self.weights_bitwidth,
            self.bias_bitwidth,
            self.act_quantizer,
            self.param_quantizer,
        )
        if self.overrides is not None:
            if not self.overrides.is_file():
                raise AccdbgError(
                    f"-qo/--quantization_overrides {str(self.quantization_overrides)!r} does not exist"
                )
            from accdbg.encodings.aimet import read_aimet

            check_htp_bitwidths(read_aimet(self.overrides), str(self.quantization_overrides))

    def describe(self) -> str:
        return (
            f"A{self.act_bitwidth}W{self.weights_bitwidth}, {self.act_quantizer}/{self.param_quantizer}"
            f"{', per-channel' if self.per_channel else ''}"
            f"{f', {self.quantization_steps} steps' if self.restricts_steps else ''}"
        )

    @property
    def restricts_steps(self) -> bool:
        """``-rqs`` asks for steps onnxruntime's own encodings do not have (a second pass)."""
        steps = self.quantization_steps
        return (
            self.quantizes
            and steps is not None
            and any(own != steps for own in self.own_steps().values())
        )

    def notes(self, stage: str) -> list[str]:
        """What ``-rqs`` and ``-fbw`` do here, one line each (logged once by the caller)."""
        out = []
        if self.restrict_quantization_steps is not None:
            flag = f"-rqs/--restrict_quantization_steps {self.restrict_quantization_steps!r}"
            if stage != "source" or not self.quantizes:
                why = "the model is not quantized here" if stage == "source" else (
                    f"--stage {stage} runs the model's own encodings"
                )  # fmt: skip
                out.append(f"ignored: {flag} ({why})")
            else:
                own = self.own_steps()
                steps, bits = self.quantization_steps, self.restricted_bits
                kinds = " and ".join(own)
                if not self.restricts_steps:
                    out.append(
                        f"{flag}: {steps} steps for the {bits}-bit {kinds}, what onnxruntime's "
                        "encodings already have (honoured as they are)"
                    )
                else:
                    mine = ", ".join(f"{k} {v}" for k, v in own.items())
                    out.append(
                        f"{flag}: the {bits}-bit {kinds} get scale = (max - min) / {steps} "
                        f"(onnxruntime's steps: {mine}): quantized once for onnxruntime's "
                        "ranges, then again with those ranges over the restricted steps as "
                        "fixed encodings; the integers span the steps from the grid's lowest "
                        "value (a symmetric grid keeps its zero point)"
                    )
        fbw = self.float_bias_bitwidth
        if fbw is not None:
            flag = f"-fbw/--float_bias_bitwidth {fbw}"
            if self.quantizes or stage != "source":
                out.append(
                    f"ignored: {flag} (applies to a float run, --precision fp16; quantized "
                    "biases are int32, -bbw)"
                )
            elif fbw == 16:
                out.append(
                    f"{flag}: the Conv/ConvTranspose/Gemm biases are rounded to fp16 values in "
                    "the model HTP runs (onnxruntime-qnn has no bias-precision option; HTP's "
                    "fp16 mode, enable_htp_fp16_precision, runs the rest in fp16)"
                )
            else:
                out.append(
                    f"{flag}: the biases stay fp32 in the model HTP runs; onnxruntime-qnn has "
                    "no bias-precision option, and HTP's fp16 mode (enable_htp_fp16_precision) "
                    "computes the graph in fp16 - a 32-bit bias cannot be asked of it"
                )
        return out


def parse_steps(text: str) -> tuple[int, int]:
    """``'-0x80 0x7F'`` -> ``(-128, 127)``: two hex literals (a negative one with its minus
    sign, as the reference guide asks), MIN below MAX, at most 16 bits of steps apart."""
    flag = "-rqs/--restrict_quantization_steps"
    parts = str(text).replace(",", " ").split()
    try:
        if len(parts) != 2:
            raise ValueError
        low, high = (int(p, 16) for p in parts)
    except ValueError:
        raise AccdbgError(
            f"{flag} {text!r}: expected 'MIN MAX', two hexadecimal literals, e.g. '-0x80 0x7F' "
            "(8 bits) or '-0x8000 0x7F7F' (16 bits)"
        ) from None
    if not low < high or high - low > 2**16 - 1:
        raise AccdbgError(f"{flag} {text!r}: MAX - MIN must be 1 to 65535 steps; got {high - low}")
    return low, high


# what HTP's integer kernels take (Qualcomm's HTP op definitions; onnxruntime-qnn's QDQ path):
# activations in 8 or 16 bits, weights in 4, 8 or 16, biases in 32 (or 8 with 8-bit weights)
HTP_ACTIVATION_BITS = (8, 16)
# onnxruntime-qnn's provider option that makes HTP take block-quantized int4 weights (LPBQ)
BLOCK_QUANT_OPTION = "enable_block_quant_weight_optimization"
HTP_PARAM_BITS = (4, 8, 16, 32)


def check_htp_bitwidths(encodings, where: str) -> None:
    """``-qo`` encodings HTP cannot run refused before anything is written: a one-line error
    naming the tensor, its bitwidth and what HTP takes (an activation in 4 bits would be
    accepted by the quantizer, then refused at session creation as ``tensor(uint4)``)."""
    for kind, table, allowed in (
        ("activation", encodings.activations, HTP_ACTIVATION_BITS),
        ("parameter", encodings.params, HTP_PARAM_BITS),
    ):
        for name, enc in table.items():
            if enc.is_float:
                if enc.bitwidth not in (16, 32):
                    raise AccdbgError(
                        f"-qo/--quantization_overrides {where!r}: {kind} {name!r} is float "
                        f"{enc.bitwidth}-bit; HTP computes float tensors in 16 or 32 bits"
                    )
                continue
            if enc.bitwidth not in allowed:
                raise AccdbgError(
                    f"-qo/--quantization_overrides {where!r}: {kind} {name!r} has bitwidth "
                    f"{enc.bitwidth}; HTP takes {kind}s in {' or '.join(map(str, allowed))} bits"
                )


@dataclass(frozen=True)
class LayerFilter:
    """Which layer outputs are dumped (engine) or debugged (snooping): ``add_*`` restrict to
    the named outputs / op types (their union), ``skip_*`` remove."""

    add_layer_outputs: tuple[str, ...] = ()
    add_layer_types: tuple[str, ...] = ()
    skip_layer_types: tuple[str, ...] = ()
    skip_layer_outputs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, names(getattr(self, f.name)))

    def skip_reason(self, tensor_names: Iterable[str], op_type: str) -> str | None:
        """Why a layer known by ``tensor_names`` (its output's names) is left out, or None."""
        given = set(tensor_names)
        op = op_type.lower()
        add_t = {t.lower() for t in self.add_layer_types}
        if (self.add_layer_outputs or add_t) and not (
            given & set(self.add_layer_outputs) or op in add_t
        ):
            return "not in --add_layer_outputs/--add_layer_types"
        if given & set(self.skip_layer_outputs) or op in {t.lower() for t in self.skip_layer_types}:
            return "in --skip_layer_outputs/--skip_layer_types"
        return None


@dataclass(frozen=True)
class BackendOptions:
    """Which engine runs the model, on which QNN backend and how."""

    engine: str = "qnn"  # or "simulation": onnxruntime CPU fake-quant, labelled "not QNN"
    # the backend defaults are EngineOptions' (what a worker process gets), written once there
    runtime: str = EngineOptions.runtime
    architecture: str = EngineOptions.architecture
    soc_model: str | None = None
    perf_profile: str | None = None
    profiling_level: str | None = None
    disable_cpu_fallback: bool = False
    # the reference's arguments of qnn-context-binary-generator ('k=v;k2=v2') and qnn-net-run's
    # config file: mapped onto provider options where onnxruntime-qnn has them
    extra_contextbin_args: str | None = None
    qnn_netruntime_config_file: str | None = None

    def mapped(self) -> Mapped:
        """The provider options the two QNN-tool flags map to (files read, values checked)."""
        out = Mapped()
        if self.qnn_netruntime_config_file:
            out.merge(
                netrun_config(self.qnn_netruntime_config_file), "--qnn_netruntime_config_file"
            )
        if self.extra_contextbin_args:
            out.merge(contextbin_args(self.extra_contextbin_args), "--extra_contextbin_args")
        return out

    def provider_options(self, precision: str) -> tuple[dict[str, str], str | None]:
        """The mapped provider options that the run's flags do not set themselves, and the
        profiling level (``--profiling_level``, else a mapped one); a mapped value that
        contradicts a flag is a one-line error naming both."""
        mapped = self.mapped()
        options = dict(mapped.options)
        profiling = options.pop("profiling_level", None)
        arch = self.runtime[len("dspv") :] if self.runtime.startswith("dspv") else None
        flags = {
            "soc_model": (self.soc_model, "--soc_model"),
            "htp_performance_mode": (self.perf_profile, "--perf_profile"),
            "htp_arch": (arch, f"-r {self.runtime}"),
            "enable_htp_fp16_precision": ("1" if precision == "fp16" else None, "--precision fp16"),
        }
        for option, (given, flag) in flags.items():
            if given is not None and option in options and options[option] != str(given):
                raise AccdbgError(
                    f"{mapped.sources[option]} (-> {option} {options[option]}) contradicts "
                    f"{flag} ({option} {given}); give one"
                )
        if profiling is not None and self.profiling_level and profiling != self.profiling_level:
            raise AccdbgError(
                f"--extra_contextbin_args profiling_level={profiling} contradicts "
                f"--profiling_level {self.profiling_level}; give one"
            )
        level = self.profiling_level or (profiling if profiling != "off" else None)
        return options, level

    def notes(self) -> list[str]:
        """What the two QNN-tool flags became, one line each (logged once by the caller)."""
        out = []
        for flag, given, read in (
            ("--qnn_netruntime_config_file", self.qnn_netruntime_config_file, netrun_config),
            ("--extra_contextbin_args", self.extra_contextbin_args, contextbin_args),
        ):
            if given:
                out.append(read(given).line(flag))
        return out

    def engine_options(self, precision: str) -> EngineOptions:
        """The picklable options a worker process builds its session from."""
        extra, profiling = self.provider_options(precision)
        return EngineOptions(
            runtime=self.runtime,
            architecture=self.architecture,
            precision=precision,
            soc_model=self.soc_model,
            profiling_level=profiling,
            disable_cpu_fallback=self.disable_cpu_fallback,
            perf_profile=self.perf_profile,
            extra_provider_options=extra,
        )


@dataclass(frozen=True)
class DumpOptions:
    """What an engine run writes besides the model's outputs."""

    debug: bool = True  # every intermediate activation, not only the graph outputs
    output_data_type: str = "float_only"
    golden_dir_for_mapping: str | None = None
    use_native_output_files: bool = False  # -nof: qnn-net-run's name for -odt native_only

    @property
    def data_type(self) -> str:
        """What the dumps hold: ``-odt``, where ``-nof`` makes the default float_only
        native_only (with float_and_native both stay)."""
        if self.use_native_output_files and self.output_data_type == "float_only":
            return "native_only"
        return self.output_data_type

    def check(self) -> None:
        if self.output_data_type not in OUTPUT_DATA_TYPES:
            raise AccdbgError(
                f"-odt {self.output_data_type!r} is not known; expected one of: "
                f"{', '.join(OUTPUT_DATA_TYPES)}"
            )


@dataclass(frozen=True)
class InputOptions:
    """How the input files are read (qnn-net-run's convention)."""

    # -nif: the files hold the model inputs' own types; without it they are float32 (unless
    # -i names a type) and converted to them
    use_native_input_files: bool = False


GROUPS = {
    "quant": QuantOptions,
    "backend": BackendOptions,
    "layers": LayerFilter,
    "dump": DumpOptions,
    "inputs": InputOptions,
}


@dataclass(frozen=True)
class EngineConfig:
    """Every option of the inference engine, by concept; what oneshot and snooping take too."""

    stage: str = "source"
    quant: QuantOptions = field(default_factory=QuantOptions)
    backend: BackendOptions = field(default_factory=BackendOptions)
    layers: LayerFilter = field(default_factory=LayerFilter)
    dump: DumpOptions = field(default_factory=DumpOptions)
    inputs: InputOptions = field(default_factory=InputOptions)

    @classmethod
    def keyword_names(cls) -> tuple[str, ...]:
        return ("stage", *(f.name for g in GROUPS.values() for f in fields(g)))

    @classmethod
    def from_keywords(cls, **keywords: Any) -> EngineConfig:
        """The flat keywords of the Python API (``runtime='htp', act_bitwidth=16, ...``) into
        their groups; an unknown keyword is a one-line error listing the known ones."""
        per_group: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
        owner = {f.name: g for g, c in GROUPS.items() for f in fields(c)}
        stage = keywords.pop("stage", None) or "source"
        for key, value in keywords.items():
            if key not in owner:
                raise AccdbgError(
                    f"engine option {key!r} is not known; expected some of: "
                    f"{', '.join(sorted(cls.keyword_names()))}"
                )
            if value is not None:
                per_group[owner[key]][key] = str(value) if isinstance(value, Path) else value
        config = cls(stage=stage, **{g: GROUPS[g](**kw) for g, kw in per_group.items()})
        for line in config.notes():
            log.info("%s", line)
        return config

    @classmethod
    def coerce(cls, value: EngineConfig | Mapping[str, Any] | None) -> EngineConfig:
        """An :class:`EngineConfig` as is; a dict of API keywords (or None) converted."""
        if isinstance(value, EngineConfig):
            return value
        return cls.from_keywords(**dict(value or {}))

    def keywords(self) -> dict[str, Any]:
        """Flat ``{keyword: value}``: the inverse of :meth:`from_keywords` (for records)."""
        out: dict[str, Any] = {"stage": self.stage}
        for g in GROUPS:
            obj = getattr(self, g)
            out.update({f.name: getattr(obj, f.name) for f in fields(obj)})
        return out

    def with_quant(self, **changes: Any) -> EngineConfig:
        """A copy with other quantization options (a fix search's variants)."""
        return replace(self, quant=replace(self.quant, **changes))

    def engine_options(self) -> EngineOptions:
        options = self.backend.engine_options(self.quant.precision)
        if self.quant.quantizes and self.quant.weight_block_size and self.stage == "source":
            # HTP runs block-quantized int4 weights as LPBQ only when asked to
            extra = {**options.extra_provider_options, BLOCK_QUANT_OPTION: "1"}
            options = replace(options, extra_provider_options=extra)
        return options

    def check(self) -> Engine:
        """The options that do not depend on the model, checked (no model is read); returns
        the engine, its host checked."""
        if self.stage not in STAGES:
            raise AccdbgError(
                f"--stage {self.stage!r} is not known; expected one of: {', '.join(STAGES)}"
            )
        self.dump.check()
        if self.quant.precision not in PRECISIONS:
            raise AccdbgError(
                f"--precision {self.quant.precision!r} is not known; expected int8 or fp16"
            )
        eng = get_engine(self.backend.engine)
        eng.check_host(self.engine_options())
        if self.stage == "source":
            self.quant.check()
        return eng

    def notes(self) -> list[str]:
        """One line for each option of the reference tool that does something other than
        there (or nothing): what is done instead. Logged once per run, where the options
        are made (the command line's parse, :meth:`from_keywords`)."""
        return [*self.quant.notes(self.stage), *self.backend.notes()]
