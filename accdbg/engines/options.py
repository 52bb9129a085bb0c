"""The inference engine's options, typed: one dataclass per concept, defaults written once.

The CLI parses its argument groups into these objects (:mod:`accdbg.cli.args`), the Python API
builds them from plain keywords (:meth:`EngineConfig.from_keywords`), and every component that
runs or prepares a model - the inference engine, the snooping algorithms, oneshot - takes an
:class:`EngineConfig`. A new engine option is one field here (and its flag in the CLI group).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from accdbg.engines.base import Engine, EngineOptions, get_engine
from accdbg.errors import AccdbgError

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

    @property
    def quantizes(self) -> bool:
        return self.precision != "fp16"

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
        from accdbg.engines.quantize import check_quantizer_options

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
        )


# what HTP's integer kernels take (Qualcomm's HTP op definitions; onnxruntime-qnn's QDQ path):
# activations in 8 or 16 bits, weights in 4, 8 or 16, biases in 32 (or 8 with 8-bit weights)
HTP_ACTIVATION_BITS = (8, 16)
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

    def engine_options(self, precision: str) -> EngineOptions:
        """The picklable options a worker process builds its session from."""
        return EngineOptions(
            runtime=self.runtime,
            architecture=self.architecture,
            precision=precision,
            soc_model=self.soc_model,
            profiling_level=self.profiling_level,
            disable_cpu_fallback=self.disable_cpu_fallback,
            perf_profile=self.perf_profile,
        )


@dataclass(frozen=True)
class DumpOptions:
    """What an engine run writes besides the model's outputs."""

    debug: bool = True  # every intermediate activation, not only the graph outputs
    output_data_type: str = "float_only"
    golden_dir_for_mapping: str | None = None

    def check(self) -> None:
        if self.output_data_type not in OUTPUT_DATA_TYPES:
            raise AccdbgError(
                f"-odt {self.output_data_type!r} is not known; expected one of: "
                f"{', '.join(OUTPUT_DATA_TYPES)}"
            )


GROUPS = {
    "quant": QuantOptions,
    "backend": BackendOptions,
    "layers": LayerFilter,
    "dump": DumpOptions,
}


@dataclass(frozen=True)
class EngineConfig:
    """Every option of the inference engine, by concept; what oneshot and snooping take too."""

    stage: str = "source"
    quant: QuantOptions = field(default_factory=QuantOptions)
    backend: BackendOptions = field(default_factory=BackendOptions)
    layers: LayerFilter = field(default_factory=LayerFilter)
    dump: DumpOptions = field(default_factory=DumpOptions)

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
        return cls(stage=stage, **{g: GROUPS[g](**kw) for g, kw in per_group.items()})

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
        return self.backend.engine_options(self.quant.precision)

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
