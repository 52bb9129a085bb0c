"""Argument groups: each concept's flags declared once and parsed once into a typed object.

A group (Polygraphy's ``tools/args`` are the model) has ``add(parser)``, which declares its
flags, and ``parse(args)``, which turns the parsed namespace into the typed object the
components take (checking what can be checked without reading a model). A component module
lists the groups it uses in ``add_arguments`` and calls each group's ``parse`` once in ``run``.
Defaults are the typed objects' own field defaults, so they are written once.

Adding a flag: add the field to the typed object (with its default), declare the flag in the
group's ``add`` with ``default=<Object>.<field>``, and set it in the group's ``parse``.
Adding a component: a module with ``NAME``, ``HELP``, ``add_arguments`` and ``run``, registered
in :data:`accdbg.cli.main.COMPONENTS`.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from accdbg.core import run_dir
from accdbg.core.inputs import InputTensor, parse_input_tensor
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg")


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one-line :class:`AccdbgError`s, not usage dumps."""

    def error(self, message: str) -> NoReturn:
        raise AccdbgError(f"{message} (see: {self.prog} --help)")


class ArgGroup:
    """One concept's flags: :meth:`add` declares them, :meth:`parse` makes the typed object."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        raise NotImplementedError

    def parse(self, args: argparse.Namespace) -> Any:
        raise NotImplementedError


def spelled_as(choices: tuple[str, ...]):
    """An argparse ``type`` taking a choice with ``_`` for ``-`` or the other way round, in
    any case (``aarch64_android`` for ``aarch64-android``, as the reference guide spells it
    once): the value becomes the choice; anything else stays as given, for argparse to refuse
    with the list of choices."""

    def key(text: str) -> str:
        return text.replace("_", "-").lower()

    by_key = {key(c): c for c in choices}

    def convert(value: str) -> str:
        return value if value in choices else by_key.get(key(value), value)

    return convert


# what an input list is, said once for every component's -l
INPUT_LIST_FORMAT = (
    "; a line holds one inference's files separated by spaces, in the model's input order or "
    "as name:=path (so a path cannot hold a space: link or rename it), and a line '#out1 "
    "out2' names output tensors (qnn-net-run's convention): with -o, the run's outputs, "
    "checked against the model first; the inference engine with --debug_mode_off dumps those "
    "instead of the graph outputs and the end-to-end verdict judges them (snooping, dataset "
    "mode and the fix search judge the graph outputs)"
)


def add_allow_nonfinite(group) -> None:
    """``--allow_nonfinite_inputs``, in whichever group declares a component's inputs."""
    group.add_argument(
        "--allow_nonfinite_inputs",
        action="store_true",
        help="run even when an input raw file (-i, -l) holds NaN or Inf values "
        "(refused by default: one line names the file, the count and the first element)",
    )


# ---------------------------------------------------------------- where a run goes


@dataclass(frozen=True)
class RunPlace:
    """Where a component writes: ``<working_dir>/<component>/<output_dirname or timestamp>``."""

    working_dir: str = "working_directory"
    output_dirname: str | None = None
    verbose: bool = False

    def keywords(self) -> dict[str, Any]:
        return {"working_dir": self.working_dir, "output_dirname": self.output_dirname}


class CommonArgs(ArgGroup):
    def __init__(self, component: str):
        self.component = component

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("common arguments")
        g.add_argument(
            "-w",
            "--working_dir",
            default=RunPlace.working_dir,
            help="working directory; results go under <working_dir>/" + self.component,
        )
        g.add_argument(
            "--output_dirname",
            default=RunPlace.output_dirname,
            help=f"run folder name under <working_dir>/{self.component} instead of the timestamp",
        )
        g.add_argument(
            "-v", "--verbose", action="store_true", help="verbose logging, and tracebacks on errors"
        )

    def parse(self, args: argparse.Namespace) -> RunPlace:
        return RunPlace(args.working_dir, args.output_dirname, bool(args.verbose))


# ---------------------------------------------------------------- Model Explorer overlays


class ModelExplorerArgs(ArgGroup):
    """``--model_explorer`` (default) / ``--no_model_explorer``: the run's Model Explorer
    overlays (about a second on a small model)."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("Model Explorer")
        g.add_argument(
            "--model_explorer",
            dest="model_explorer",
            action="store_true",
            default=True,
            help="write Model Explorer overlays of the results on the source model's graph, in "
            "<run>/model_explorer/ (default; open them with --model_explorer_view RUN_DIR)",
        )
        g.add_argument(
            "--no_model_explorer",
            "--no-model_explorer",
            dest="model_explorer",
            action="store_false",
            help="do not write the Model Explorer overlays",
        )

    def parse(self, args: argparse.Namespace) -> bool:
        return bool(args.model_explorer)


# ---------------------------------------------------------------- the model and its inputs


@dataclass(frozen=True)
class ModelSpec:
    """The model, its framework (version checked) and the inputs it runs on."""

    framework: str
    model_path: str | None
    input_tensors: list[InputTensor] = field(default_factory=list)
    output_tensors: list[str] = field(default_factory=list)
    allow_nonfinite_inputs: bool = False


class ModelArgs(ArgGroup):
    """``-f -m -i -o`` and ``--allow_nonfinite_inputs``. ``framework_default``: the framework
    when ``-f`` is not given (the inference engine's ``onnx``); ``required`` makes -f/-m/-i
    required flags."""

    def __init__(self, required: bool = True, framework_default: str | None = None):
        self.required = required
        self.framework_default = framework_default

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("model arguments")
        self.add_framework(g)
        self.add_model(g)
        self.add_inputs(g)
        self.add_outputs(g)
        add_allow_nonfinite(g)
        self.group = g

    # each flag declared once, here; other model groups (:class:`CalibrationArgs`) reuse them
    def add_framework(self, g, help: str | None = None) -> None:
        g.add_argument(
            "-f",
            "--framework",
            nargs="+",
            required=self.required,
            default=[self.framework_default] if self.framework_default else None,
            metavar="FRAMEWORK",
            help=help
            or "framework and optional version, e.g. 'onnx' or 'onnx 1.17' (case insensitive)",
        )

    def add_outputs(self, g) -> None:
        g.add_argument(
            "-o",
            "--output_tensor",
            action="append",
            default=[],
            help="name of an output tensor of the model, checked before anything runs; "
            "repeatable. The outputs named here and on the input list's '#' line are the "
            "model's outputs for the run (see -l)",
        )

    def add_model(self, g, help: str = "path to the model file", required: bool | None = None):
        req = self.required if required is None else required
        g.add_argument("-m", "--model_path", required=req, help=help)

    def add_inputs(self, g, help: str | None = None) -> None:
        req = self.required
        g.add_argument(
            "-i",
            "--input_tensor",
            nargs="+",
            action="append",
            required=req,
            default=None if req else [],
            metavar="INPUT_TENSOR",
            help=help
            or '"name" dims path [dtype], e.g. "data" 1,3,224,224 data.raw float32; repeat per input',
        )

    def parse(self, args: argparse.Namespace) -> ModelSpec:
        from accdbg.frameworks.formats import check_model_format
        from accdbg.frameworks.versions import check_framework

        framework = check_framework(args.framework)
        check_model_format(framework, args.model_path)
        inputs = [parse_input_tensor(v) for v in args.input_tensor or []]
        return ModelSpec(
            framework=framework,
            model_path=args.model_path,
            input_tensors=typed_inputs(
                framework,
                args.model_path,
                inputs,
                bool(getattr(args, "use_native_input_files", False)),
            ),
            output_tensors=list(args.output_tensor or []),
            allow_nonfinite_inputs=bool(args.allow_nonfinite_inputs),
        )


def typed_inputs(
    framework: str, model_path: str | None, inputs: list[InputTensor], native: bool
) -> list[InputTensor]:
    """The ``-i`` files read as the run reads them (``-nif``, see
    :func:`~accdbg.core.inputs.resolve_input_types`), resolved once against an ONNX model's
    input types, so every component of the run - framework diagnosis too - reads them alike.
    Another framework's runner converts its inputs itself: ``-nif`` is said not to apply."""
    if framework != "onnx":
        if native:
            log.info(
                "-nif/--use_native_input_files: for -f %s each file is read as the type -i names "
                "(default float32), which its runner converts to the model's",
                framework,
            )
        return inputs
    if not inputs or model_path is None or not Path(model_path).expanduser().is_file():
        return inputs
    import onnx

    from accdbg.core import onnx_model as om
    from accdbg.core.inputs import resolve_input_types

    try:  # the graph's inputs only: the weights stay on disk
        model = onnx.load(str(Path(model_path).expanduser()), load_external_data=False)
    except Exception:  # not a readable model: the component says so, in its own words
        return inputs
    types = {vi.name: t for vi in om.real_inputs(model) if (t := om.elem_dtype(vi)) is not None}
    return resolve_input_types(inputs, types, native)


# ---------------------------------------------------------------- framework runtime


@dataclass(frozen=True)
class FrameworkOptions:
    """How the framework runs the float model (framework diagnosis)."""

    disable_graph_optimization: bool = False
    onnx_custom_op_lib: str | None = None
    memory_budget_mb: float = 4096
    include_constants: bool = False

    def keywords(self) -> dict[str, Any]:
        return {
            "disable_graph_optimization": self.disable_graph_optimization,
            "onnx_custom_op_lib": self.onnx_custom_op_lib,
            "memory_budget_mb": self.memory_budget_mb,
            "include_constants": self.include_constants,
        }


class FrameworkArgs(ArgGroup):
    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("framework runtime arguments")
        g.add_argument(
            "--disable_graph_optimization",
            action="store_true",
            help="disable onnxruntime graph optimizations (basic optimizations are on by default)",
        )
        g.add_argument(
            "--onnx_custom_op_lib",
            default=FrameworkOptions.onnx_custom_op_lib,
            help="path to an onnxruntime custom-op library",
        )
        g.add_argument(
            "--memory_budget_mb",
            type=float,
            default=FrameworkOptions.memory_budget_mb,
            help="most megabytes of exposed tensors held at once; beyond it the dump is split over "
            f"several runs (default {FrameworkOptions.memory_budget_mb:g})",
        )
        g.add_argument(
            "--include_constants",
            action="store_true",
            help="also dump the outputs of Constant nodes (parameters, not activations)",
        )

    def parse(self, args: argparse.Namespace) -> FrameworkOptions:
        return FrameworkOptions(
            bool(args.disable_graph_optimization),
            args.onnx_custom_op_lib,
            float(args.memory_budget_mb),
            bool(args.include_constants),
        )


# ---------------------------------------------------------------- verifiers


class VerifierArgs(ArgGroup):
    """``--default_verifier`` / ``--defaultVerifier``, repeatable, with optional parameters;
    parses into the list of verifier specs (``default`` when none is given)."""

    def __init__(self, default: tuple[str, ...] = ("CosineSimilarity",)):
        self.default = default

    def add(self, parser: argparse.ArgumentParser, group=None) -> None:
        from accdbg.verifiers import verifier_names

        g = group or parser.add_argument_group("verifiers")
        g.add_argument(
            "--default_verifier",
            "--defaultVerifier",
            dest="default_verifier",
            action="append",
            nargs="+",
            metavar="VERIFIER",
            help="verifier run on every tensor, optionally with parameters: 'rtolatol,rtolmargin,0.01,"
            f"atolmargin,0.01' or 'TopK k 5'; repeat for several (default {' and '.join(self.default)})."
            f" Names are case-insensitive: {', '.join(verifier_names())}",
        )

    def parse(self, args: argparse.Namespace) -> list:
        return args.default_verifier or list(self.default)


# ---------------------------------------------------------------- executors


class ExecutorArgs(ArgGroup):
    """``--executor``, ``--workers``, ``--ray_address``: where independent work items run
    (an input of a dataset run, a snooping sub-model, a fix-search candidate); parses into an
    :class:`~accdbg.core.executors.ExecutorConfig`, or None when none was given (each
    algorithm then keeps its own default: local processes, as many as it runs at once)."""

    CHOICES = ("local", "ray", "serial")

    def add(self, parser: argparse.ArgumentParser, group=None) -> None:
        from accdbg.core.executors import ExecutorConfig

        g = group or parser.add_argument_group("executor (where work items run)")
        g.add_argument(
            "--executor",
            choices=self.CHOICES,
            default=None,
            help="local: crash-isolated worker processes on this machine (default); ray: Ray "
            "actors (pip install accdbg[ray]), on --ray_address or a local Ray instance; "
            "serial: every item in this process, one after another (debugging)",
        )
        g.add_argument(
            "--workers",
            type=int,
            default=None,
            help="worker processes or actors, each holding one QNN session (default "
            f"{ExecutorConfig.workers} for a dataset run; snooping and the fix search: theirs)",
        )
        g.add_argument(
            "--ray_address",
            default=ExecutorConfig.ray_address,
            help="address of a running Ray cluster (--executor ray), e.g. ray://head:10001",
        )

    def parse(self, args: argparse.Namespace):
        """The executor config given, or None (no executor flag on the command line)."""
        from accdbg.core.executors import ExecutorConfig

        if args.ray_address and args.executor != "ray":
            raise AccdbgError(
                f"--ray_address is for --executor ray, not --executor {args.executor or 'local'}"
            )
        if args.executor is None and args.workers is None:
            return None
        config = ExecutorConfig(
            name=args.executor or ExecutorConfig.name,
            workers=int(args.workers if args.workers is not None else ExecutorConfig.workers),
            ray_address=args.ray_address,
        )
        config.check()
        return config


def options_dict(args: argparse.Namespace) -> dict:
    """Every flag of a run as given, JSON-ready, for ``<component>_options.json``."""
    return run_dir.options_dict(args)


# ---------------------------------------------------------------- a float model to quantize


@dataclass(frozen=True)
class CalibrationSpec:
    """A float model a component quantizes itself, and the inputs it is calibrated (and
    measured) on: ``-l`` lines, else the ``-i`` files."""

    model_path: str
    framework: str = "onnx"
    input_tensors: list[InputTensor] = field(default_factory=list)
    input_list: str | None = None
    allow_nonfinite_inputs: bool = False
    output_tensors: list[str] = field(default_factory=list)

    def check_output_tensors(self, instead: str) -> None:
        """``-o`` where the component judges no chosen output (so that it can be added to the
        command of another component): each name checked to be a tensor of the model (an
        ONNX one; another framework's is checked by its conversion) before anything runs,
        and one line says what the component does instead."""
        if not self.output_tensors:
            return
        if self.framework == "onnx":
            from accdbg.core import onnx_model as om

            model = om.load_model(self.model_path)
            om.check_tensor_names(model, self.output_tensors, "-o/--output_tensor")
        log.info("-o/--output_tensor %s: %s", ", ".join(self.output_tensors), instead)


class CalibrationArgs(ModelArgs):
    """``-m`` (required), ``-i`` and ``-l`` (optional), ``--allow_nonfinite_inputs``, and
    ``-f`` (default onnx) when ``framework_help`` is given - :class:`ModelArgs`' flags, for the
    fix search and the quantization checker. The help texts say what the inputs serve."""

    def __init__(
        self,
        model_help: str,
        input_tensor_help: str,
        input_list_help: str,
        framework_help: str | None = None,
        title: str = "model arguments",
    ):
        super().__init__(required=False, framework_default="onnx")
        self.helps = (model_help, input_tensor_help, input_list_help, framework_help)
        self.title = title

    def add(self, parser: argparse.ArgumentParser) -> None:
        model_help, input_tensor_help, input_list_help, framework_help = self.helps
        g = parser.add_argument_group(self.title)
        self.add_model(g, model_help, required=True)
        if framework_help is not None:
            self.add_framework(g, framework_help)
        self.add_inputs(g, input_tensor_help)
        self.add_outputs(g)
        g.add_argument("-l", "--input_list", help=input_list_help + INPUT_LIST_FORMAT)
        add_allow_nonfinite(g)
        self.group = g

    def parse(self, args: argparse.Namespace) -> CalibrationSpec:
        from accdbg.frameworks.formats import check_model_format
        from accdbg.frameworks.versions import check_framework

        given = getattr(args, "framework", None)
        framework = check_framework(given) if given else "onnx"
        check_model_format(framework, args.model_path)
        return CalibrationSpec(
            model_path=args.model_path,
            framework=framework,
            input_tensors=[parse_input_tensor(v) for v in args.input_tensor or []],
            input_list=args.input_list,
            allow_nonfinite_inputs=bool(args.allow_nonfinite_inputs),
            output_tensors=list(args.output_tensor or []),
        )
