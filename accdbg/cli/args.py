"""Reusable argument groups, so every component spells shared flags the same way."""

from __future__ import annotations

import argparse
from typing import NoReturn

from accdbg.errors import AccdbgError


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one-line :class:`AccdbgError`s, not usage dumps."""

    def error(self, message: str) -> NoReturn:
        raise AccdbgError(f"{message} (see: {self.prog} --help)")


def add_common(parser: argparse.ArgumentParser, component: str) -> None:
    g = parser.add_argument_group("common arguments")
    g.add_argument(
        "-w",
        "--working_dir",
        default="working_directory",
        help="working directory; results go under <working_dir>/" + component,
    )
    g.add_argument(
        "--output_dirname",
        default=None,
        help=f"run folder name under <working_dir>/{component} instead of the timestamp",
    )
    g.add_argument(
        "-v", "--verbose", action="store_true", help="verbose logging, and tracebacks on errors"
    )


def add_model_explorer(parser: argparse.ArgumentParser) -> None:
    """``--model_explorer`` (default) / ``--no_model_explorer``: the run's Model Explorer
    overlays (about a second on a small model)."""
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


def add_model(parser: argparse.ArgumentParser, required: bool = True) -> None:
    g = parser.add_argument_group("model arguments")
    g.add_argument(
        "-f",
        "--framework",
        nargs="+",
        required=required,
        metavar="FRAMEWORK",
        help="framework and optional version, e.g. 'onnx' or 'onnx 1.17' (case insensitive)",
    )
    g.add_argument("-m", "--model_path", required=required, help="path to the model file")
    g.add_argument(
        "-i",
        "--input_tensor",
        nargs="+",
        action="append",
        required=required,
        metavar="INPUT_TENSOR",
        help='"name" dims path [dtype], e.g. "data" 1,3,224,224 data.raw float32; repeat per input',
    )
    g.add_argument(
        "-o",
        "--output_tensor",
        action="append",
        default=[],
        help="name of a graph output tensor that must be produced; repeatable",
    )
    add_allow_nonfinite(g)


def add_allow_nonfinite(group) -> None:
    """``--allow_nonfinite_inputs``: run even when an input file holds NaN or Inf."""
    group.add_argument(
        "--allow_nonfinite_inputs",
        action="store_true",
        help="run even when an input raw file (-i, -l) holds NaN or Inf values "
        "(refused by default: one line names the file, the count and the first element)",
    )


def add_framework_runtime(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("framework runtime arguments")
    g.add_argument(
        "--disable_graph_optimization",
        action="store_true",
        help="disable onnxruntime graph optimizations (basic optimizations are on by default)",
    )
    g.add_argument(
        "--onnx_custom_op_lib", default=None, help="path to an onnxruntime custom-op library"
    )
    g.add_argument(
        "--memory_budget_mb",
        type=float,
        default=4096,
        help="most megabytes of exposed tensors held at once; beyond it the dump is split over several runs (default 4096)",
    )
    g.add_argument(
        "--include_constants",
        action="store_true",
        help="also dump the outputs of Constant nodes (parameters, not activations)",
    )


def add_default_verifier(group, default_text: str = "CosineSimilarity") -> None:
    """``--default_verifier`` / ``--defaultVerifier``, repeatable, with optional parameters."""
    from accdbg.verifiers import verifier_names

    group.add_argument(
        "--default_verifier",
        "--defaultVerifier",
        dest="default_verifier",
        action="append",
        nargs="+",
        metavar="VERIFIER",
        help="verifier run on every tensor, optionally with parameters: 'rtolatol,rtolmargin,0.01,atolmargin,0.01' "
        f"or 'TopK k 5'; repeat for several (default {default_text}). Names are case-insensitive: "
        f"{', '.join(verifier_names())}",
    )


def options_dict(args: argparse.Namespace) -> dict:
    """Every option of a run, JSON-ready, for ``<component>_options.json``."""
    return {k: v for k, v in vars(args).items() if not k.startswith("_")}
