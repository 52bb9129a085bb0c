"""TFLite, TensorFlow and PyTorch models to ONNX for the inference engine, with the tensor mapping.

The QNN engine takes ONNX. Other frameworks reach it through their maintained converters:
``tf2onnx`` for TFLite (quantized models dequantized, so the engine quantizes a float model)
and TensorFlow frozen graphs, ``torch.onnx`` (the ``torch.export`` based exporter) for PyTorch.

The mapping says which ONNX tensor holds which golden tensor of framework diagnosis:
``{onnx tensor name: framework tensor name}``. tf2onnx keeps TensorFlow/TFLite tensor names,
so names are matched directly, following a fused activation that tf2onnx split into its own
node. torch.onnx names each ONNX value after a node of the exported program, whose
``nn_module_stack`` says which module call produced it. NHWC activations usually become NCHW
in ONNX: ``permutations[onnx name]`` gives the axes for ``np.transpose`` that bring the ONNX
tensor to the framework's layout (absent when they already agree). Golden tensors without an
ONNX counterpart (fused away by a converter) are listed in ``unmapped`` with the reason.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import re
import subprocess
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from accdbg.core import onnx_model as om
from accdbg.core.inputs import InputTensor
from accdbg.core.isolate import child_env, guarded_module_command, run_isolated
from accdbg.core.run_dir import write_json_atomic
from accdbg.errors import AccdbgError
from accdbg.frameworks.base import FrameworkRunner, RunnerOptions, get_runner_class
from accdbg.frameworks.layouts import NHWC, LaidOutTensorInfo, align, onnx_layouts, static_shapes
from accdbg.frameworks.names import first_line
from accdbg.frameworks.versions import install_hint

log = logging.getLogger("accdbg.convert")

CONVERSION_FILE = "conversion.json"
DEFAULT_OPSET = 17
# activations tf2onnx splits out of a TFLite op's fused_activation_function
_FUSED_ACTIVATIONS = {"Relu", "Clip", "Tanh"}


@dataclass
class Conversion:
    """An ONNX model standing for a framework model, and how their tensors correspond."""

    framework: str
    model_path: str
    onnx_path: Path
    converter: str
    tensor_mapping: dict[str, str]  # onnx tensor -> framework tensor
    permutations: dict[str, list[int]] = field(default_factory=dict)  # onnx tensor -> axes
    input_names: dict[str, str] = field(default_factory=dict)  # -i name -> onnx input
    input_layouts: dict[str, str | None] = field(default_factory=dict)  # onnx input -> layout
    unmapped: dict[str, str] = field(default_factory=dict)  # framework tensor -> why

    def renamed(self, inputs: Sequence[InputTensor]) -> list[InputTensor]:
        """The ``-i`` tensors named as the ONNX model's inputs."""
        return [replace(t, name=self.input_names.get(t.name, t.name)) for t in inputs]

    def to_json(self) -> dict:
        data = asdict(self)
        data["onnx_path"] = str(self.onnx_path)
        return {"format": "accdbg-conversion/1", **data}

    def save(self, path: Path) -> Path:
        write_json_atomic(path, self.to_json())
        return path


def load_conversion(path: str | os.PathLike) -> Conversion:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    data.pop("format", None)
    data["onnx_path"] = Path(data["onnx_path"])
    return Conversion(**data)


Converter = Callable[[FrameworkRunner, Path, Sequence[str], int], Conversion]
CONVERTERS: dict[str, Converter] = {}
# converters whose framework loads (and runs) the model natively: they run in a child Python,
# so a crash there is an error, not the end of the tool (tf2onnx is a child of that child)
IN_CHILD: set[str] = set()


def converter(framework: str, in_child: bool = False) -> Callable[[Converter], Converter]:
    def add(fn: Converter) -> Converter:
        CONVERTERS[framework] = fn
        if in_child:
            IN_CHILD.add(framework)
        return fn

    return add


def convert_to_onnx(
    framework: str,
    model_path: str | Path,
    inputs: Sequence[InputTensor],
    out_dir: str | Path,
    output_tensors: Sequence[str] = (),
    opset: int = DEFAULT_OPSET,
) -> Conversion:
    """Convert the model to ``<out_dir>/<stem>.onnx``; write ``<out_dir>/conversion.json``.

    ``inputs`` are the ``-i`` tensors of framework diagnosis (names, dims, data): they fix the
    shapes, and PyTorch traces the model with them. A quantized TFLite model becomes a float
    ONNX model (tf2onnx ``--dequantize``): the engine quantizes it with its own encodings.
    """
    name = framework.strip().lower()
    get_runner_class(name)  # an unknown framework is named before anything runs
    if name not in CONVERTERS:
        raise AccdbgError(f"converting {name!r} models to ONNX is not supported")
    out = Path(out_dir).expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    args = (name, Path(model_path).expanduser().absolute(), list(inputs), out, list(output_tensors),
            opset)  # fmt: skip
    if name in IN_CHILD:
        conversion = run_isolated(
            _convert, *args, what=f"converting {str(model_path)!r} to ONNX",
            who=f"the {name} converter", log_hint="the log (-v)",
        )  # fmt: skip
    else:
        conversion = _convert(*args)
    conversion.model_path = str(model_path)
    conversion.save(out / CONVERSION_FILE)
    log.info(
        "%s -> %s with %s: %d tensors mapped, %d unmapped",
        model_path,
        conversion.onnx_path,
        conversion.converter,
        len(conversion.tensor_mapping),
        len(conversion.unmapped),
    )
    return conversion


def _convert(
    name: str,
    model_path: Path,
    inputs: list[InputTensor],
    out: Path,
    outputs: list[str],
    opset: int,
) -> Conversion:
    """Load the model with its framework's runner and convert it (in this process or a child)."""
    runner = get_runner_class(name)(model_path, inputs, RunnerOptions())
    runner.activate()
    try:
        runner.check_outputs(outputs)
        return CONVERTERS[name](runner, out, outputs, opset)
    finally:
        runner.deactivate()


# ---------------------------------------------------------------- ONNX: nothing to convert


@converter("onnx")
def _onnx(runner, out: Path, outputs, opset: int) -> Conversion:
    names = [i.name for i in runner.tensors()]
    return Conversion(
        framework="onnx",
        model_path=str(runner.model_path),
        onnx_path=runner.model_path,
        converter="none",
        tensor_mapping={n: n for n in names},
        input_names={t.name: t.name for t in runner.inputs},
    )


# ---------------------------------------------------------------- tf2onnx: TFLite, TensorFlow


def _require_tf2onnx(framework: str) -> str:
    missing = [m for m in ("tf2onnx", "tensorflow") if importlib.util.find_spec(m) is None]
    if missing:
        raise AccdbgError(
            f"converting {framework} models to ONNX needs tf2onnx and TensorFlow ({', '.join(missing)} "
            f"missing): {install_hint('tensorflow')}"
        )
    return f"tf2onnx {importlib.metadata.version('tf2onnx')}"


def _run_tf2onnx(args: list[str], model_path: Path) -> None:
    """tf2onnx's command line in a child process: its documented interface (``--dequantize``
    exists only there), and TensorFlow's logging and memory stay out of this process."""
    env = child_env(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore"))
    cmd = guarded_module_command("tf2onnx.convert", *args)
    log.debug("running %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    log.debug("tf2onnx output:\n%s", proc.stderr[-20000:])
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.search(r"(Error|Exception)\b", ln)]
        reason = (errors or lines or ["no output"])[-1]
        raise AccdbgError(
            f"{str(model_path)!r} cannot be converted to ONNX, so it cannot reach the QNN engine: "
            f"tf2onnx failed with {reason}"
        )


def _check_ops(model: onnx.ModelProto, framework: str, model_path: Path) -> None:
    """Ops tf2onnx left unconverted make a model the engine cannot run: say so now."""
    unknown = sorted(
        {
            n.op_type
            for n in model.graph.node
            if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)
        }
        | {
            f"{n.domain}.{n.op_type}"
            for n in model.graph.node
            if n.domain not in ("", "ai.onnx", "com.microsoft")
        }
    )
    if unknown:
        raise AccdbgError(
            f"{framework} model {str(model_path)!r} cannot be converted to ONNX: tf2onnx has no ONNX "
            f"equivalent for {', '.join(unknown)}; it cannot reach the QNN engine through ONNX"
        )


# LiteRT's resource variables: a streaming model's state, kept inside the interpreter
STATE_OPS = {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"}


@converter("tflite", in_child=True)  # LiteRT computes the sparse weights dense
def _tflite(runner, out: Path, outputs, opset: int) -> Conversion:
    from accdbg.frameworks.tflite_runner import densified

    tool = _require_tf2onnx("tflite")
    onnx_path = out / f"{runner.model_path.stem}.onnx"
    dense = out / f"{runner.model_path.stem}.dense.tflite"  # tf2onnx reads no sparse weights
    made = densified(runner.model_path, dense)
    source = dense if made else runner.model_path
    if made:
        log.info("%s: %d sparse weight tensors made dense for tf2onnx", runner.model_path, made)
        tool += f" (after {made} sparse weight tensors were made dense)"
    args = ["--tflite", str(source), "--output", str(onnx_path), "--opset", str(opset),
            "--dequantize"]  # fmt: skip
    try:
        _run_tf2onnx(args, runner.model_path)
    except AccdbgError as exc:
        state = sorted({op["op_name"] for op in runner.interpreter._get_ops_details()} & STATE_OPS)
        if not state:
            raise
        raise AccdbgError(
            f"{exc}; the model keeps state between calls in variables ({', '.join(state)}: a "
            "streaming model), which tf2onnx does not convert - export it stateless, its state "
            "as inputs and outputs"
        ) from None
    return _by_name(runner, "tflite", onnx_path, tool, dict(runner.feed_names))


@converter("tensorflow", in_child=True)  # TensorFlow loads the graph natively
def _tensorflow(runner, out: Path, outputs, opset: int) -> Conversion:
    from accdbg.frameworks.tensorflow_runner import tensor_name

    tool = _require_tf2onnx("tensorflow")
    onnx_path = out / f"{runner.model_path.stem}.onnx"
    wanted = [tensor_name(o) for o in outputs] or runner.graph_outputs
    dims = {t.name: t.dims for t in runner.inputs}
    spec = ",".join(
        f"{tf_name}[{','.join(map(str, dims[given]))}]"
        for given, tf_name in runner.feed_names.items()
    )
    args = ["--graphdef", str(runner.model_path), "--output", str(onnx_path), "--opset", str(opset),
            "--inputs", spec, "--outputs", ",".join(wanted)]  # fmt: skip
    _run_tf2onnx(args, runner.model_path)
    return _by_name(runner, "tensorflow", onnx_path, tool, dict(runner.feed_names))


def _by_name(
    runner, framework: str, onnx_path: Path, tool: str, inputs: dict[str, str]
) -> Conversion:
    """tf2onnx keeps the framework's tensor names: match them, then line up the layouts."""
    model = om.load_model(onnx_path, "converted model")
    _check_ops(model, framework, runner.model_path)
    model = om.infer_shapes(model)
    infos: list[LaidOutTensorInfo] = runner.tensors()
    fw_names = {i.name for i in infos}
    produced = {o for n in model.graph.node for o in n.output if o}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in model.graph.node:
        for i in node.input:
            consumers[i].append(node)
    shapes = static_shapes(model)
    input_layouts = {
        vi.name: NHWC if len(om.dims_of(vi)) == 4 else None for vi in om.real_inputs(model)
    }
    layouts = onnx_layouts(model, input_layouts)
    conv = Conversion(framework, str(runner.model_path), onnx_path, tool, {}, input_names=inputs,
                      input_layouts=input_layouts)  # fmt: skip
    for info in infos:
        # a dequantized model keeps the float value in "<name>_prequant", ahead of a Quantize
        name = next((c for c in (f"{info.name}_prequant", info.name) if c in produced), None)
        if name is None:
            conv.unmapped[info.name] = (
                "no ONNX tensor of that name (the converter fused or removed it)"
            )
            continue
        name = _after_fused_activation(name, consumers, fw_names)
        perm = align(shapes.get(name), layouts.get(name), info.shape, info.layout)
        if perm is None:
            conv.unmapped[info.name] = (
                f"ONNX tensor {name!r} has shape {list(shapes.get(name, ()))}, not {list(info.shape or ())}"
            )
            continue
        if name in conv.tensor_mapping:
            conv.unmapped[info.name] = (
                f"ONNX tensor {name!r} already stands for {conv.tensor_mapping[name]!r}"
            )
            continue
        conv.tensor_mapping[name] = info.name
        if perm:
            conv.permutations[name] = list(perm)
    return conv


def _after_fused_activation(name: str, consumers, fw_names: set[str]) -> str:
    """tf2onnx turns ``CONV_2D(fused RELU) -> t`` into ``Conv -> t; Relu -> new``: the framework's
    ``t`` is then the activation's output, which carries a generated name."""
    while True:
        users = consumers.get(name, [])
        if len(users) != 1 or users[0].op_type not in _FUSED_ACTIVATIONS:
            return name
        nxt = users[0].output[0]
        if nxt in fw_names or nxt.endswith("_prequant") and nxt[: -len("_prequant")] in fw_names:
            return name
        name = nxt


# ---------------------------------------------------------------- torch.onnx: PyTorch


@converter("pytorch", in_child=True)
def _pytorch(runner, out: Path, outputs, opset: int) -> Conversion:
    torch = runner.torch
    if importlib.util.find_spec("onnxscript") is None:
        raise AccdbgError(
            f"converting PyTorch models to ONNX needs onnxscript: {install_hint('pytorch')}"
        )
    infos = runner.tensors()  # names the golden tensors (one forward pass)
    onnx_path = out / f"{_stem(runner.model_path)}.onnx"
    feeds = {t.name: t.load() for t in runner.inputs}
    args = tuple(torch.from_numpy(np.array(feeds[n])) for n in runner.input_order)
    model = runner.loaded.exported if runner.loaded.exported is not None else runner.loaded.module
    chatter = io.StringIO()
    torch_log = logging.getLogger("torch.onnx")
    level = torch_log.level
    torch_log.setLevel(logging.ERROR)  # "torchvision is not installed" and the like
    try:
        with contextlib.redirect_stdout(chatter), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter prints its progress and warns a lot
            program = torch.onnx.export(
                model, args, str(onnx_path), dynamo=True, optimize=False,
                input_names=list(runner.input_order),
                opset_version=max(opset, 18),  # the exporter's lowest
                external_data=_too_big(model),
            )  # fmt: skip
    except Exception as exc:
        raise AccdbgError(
            f"torch.onnx could not export {str(runner.model_path)!r}: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    finally:
        torch_log.setLevel(level)
        log.debug("torch.onnx output:\n%s", chatter.getvalue())
    model_proto = om.load_model(onnx_path, "exported model")
    values = {o for n in model_proto.graph.node for o in n.output if o}
    graph_outputs = [o.name for o in model_proto.graph.output]
    groups = _module_calls(program.exported_program)
    conv = Conversion(
        "pytorch", str(runner.model_path), onnx_path, f"torch.onnx {torch.__version__} (dynamo)", {},
        input_names={n: n for n in runner.input_order},
        input_layouts={n: None for n in runner.input_order},
    )  # fmt: skip
    for info in infos:
        origin = runner.origins[info.name]
        if origin.module == "":
            onnx_name = (
                graph_outputs[origin.output_index]
                if origin.output_index < len(graph_outputs)
                else None
            )
            reason = "the exported model has fewer outputs"
        else:
            onnx_name, reason = _module_output(
                groups.get((origin.module, origin.call), []), origin, info
            )
        if onnx_name is not None and onnx_name not in values and onnx_name not in graph_outputs:
            onnx_name, reason = None, "the exporter folded it away"
        if onnx_name is None:
            conv.unmapped[info.name] = reason
        elif onnx_name in conv.tensor_mapping:
            conv.unmapped[info.name] = (
                f"ONNX tensor {onnx_name!r} already stands for {conv.tensor_mapping[onnx_name]!r}"
            )
        else:
            conv.tensor_mapping[onnx_name] = info.name
    return conv


def _stem(path: Path) -> str:
    return re.sub(r"\.py:.*$", "", path.name).removesuffix(".pt2") or "model"


def _too_big(model) -> bool:
    try:
        params = model.state_dict().values()
    except Exception:
        return False
    return sum(p.numel() * p.element_size() for p in params) > om.TWO_GIB // 2


def _module_calls(exported) -> dict[tuple[str, int], list]:
    """``(module path, call number) -> graph nodes`` from each node's ``nn_module_stack``."""
    groups: dict[tuple[str, int], list] = defaultdict(list)
    for node in exported.graph.nodes:
        if node.op != "call_function":
            continue
        for key, (fqn, _cls) in (node.meta.get("nn_module_stack") or {}).items():
            m = re.search(r"@(\d+)$", key)
            groups[(fqn, int(m.group(1)) if m else 0)].append(node)
    return groups


def _module_output(nodes: list, origin, info) -> tuple[str | None, str]:
    """The node whose value leaves the module call and has the golden tensor's shape."""
    if not nodes:
        return None, "no exported op belongs to this module call"
    inside = set(nodes)
    leaving = [n for n in nodes if any(u not in inside for u in n.users)]
    shaped = [
        n
        for n in leaving
        if tuple(getattr(n.meta.get("val"), "shape", ())) == tuple(info.shape or ())
    ]
    if origin.outputs == 1:
        if shaped:
            return shaped[-1].name, ""
        return None, "no exported value of this module call has its shape"
    tensors = [n for n in leaving if hasattr(n.meta.get("val"), "shape")]
    if len(tensors) == origin.outputs:
        node = tensors[origin.output_index]
        if tuple(node.meta["val"].shape) == tuple(info.shape or ()):
            return node.name, ""
    return None, "the module's outputs could not be told apart in the exported graph"
