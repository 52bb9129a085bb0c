"""``--fix_search``: flags in, :func:`~accdbg.algorithms.fixes.run_fix_search` out."""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass
from typing import Any

from accdbg.cli import args as A
from accdbg.cli.inference_engine import add_quantizer_arguments
from accdbg.engines.options import BackendOptions, EngineConfig
from accdbg.engines.qnn import RUNTIMES
from accdbg.errors import AccdbgError

NAME = "fix_search"
HELP = "search a quantization fix for the diagnosed layers, every candidate measured on QNN HTP"
log = logging.getLogger("accdbg")


@dataclass(frozen=True)
class SearchOptions:
    """When the search stops and how many processes measure (``run_fix_search``'s keywords)."""

    target_sqnr: float | None = None
    target_gap: float | None = None
    max_16bit_tensors: int | None = None
    time_budget: float | None = None
    workers: int | None = None

    def keywords(self) -> dict[str, Any]:
        return asdict(self)


class SearchArgs(A.ArgGroup):
    """The search's own flags, shared with the wrapper's ``--suggest_fixes``."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        S = SearchOptions
        g = parser.add_argument_group("fix search")
        g.add_argument(
            "--target_sqnr",
            type=float,
            default=S.target_sqnr,
            metavar="DB",
            help="stop when the outputs' SQNR on QNN (mean over inputs) reaches this many dB",
        )
        g.add_argument(
            "--target_gap",
            type=float,
            default=S.target_gap,
            metavar="SHARE",
            help="stop when this share of the baseline's output error (noise power) is removed, e.g. 0.9",
        )
        g.add_argument(
            "--max_16bit_tensors",
            type=int,
            default=S.max_16bit_tensors,
            help="accept no fix with more 16-bit activation tensors in the QNN graph",
        )
        g.add_argument(
            "--time_budget",
            type=float,
            default=S.time_budget,
            metavar="SECONDS",
            help="start no new search round after this many seconds (the first always runs)",
        )
        g.add_argument(
            "--search_workers",
            type=int,
            default=S.workers,
            help="parallel worker processes measuring candidates (default: one per core)",
        )

    def parse(self, args: argparse.Namespace) -> SearchOptions:
        return SearchOptions(
            args.target_sqnr,
            args.target_gap,
            args.max_16bit_tensors,
            args.time_budget,
            args.search_workers,
        )


class BaselineArgs(A.ArgGroup):
    """The baseline quantization, as ``--inference_engine`` spells it, into an
    :class:`~accdbg.engines.options.EngineConfig` (defaults: the engine's own)."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        q = parser.add_argument_group("the baseline quantization (as --inference_engine)")
        q.add_argument("-r", "--runtime", choices=RUNTIMES, default=BackendOptions.runtime)
        add_quantizer_arguments(q)

    def parse(self, args: argparse.Namespace) -> EngineConfig:
        return EngineConfig.from_keywords(
            runtime=args.runtime,
            act_bitwidth=args.act_bitwidth,
            weights_bitwidth=args.weights_bitwidth,
            weight_block_size=args.weight_block_size,
            act_quantizer=args.act_quantizer,
            param_quantizer=args.param_quantizer,
            per_channel=args.per_channel_quantization,
        )


MODEL = A.CalibrationArgs(
    model_help="the float ONNX model",
    input_tensor_help='"name" dims path [dtype]: input dims (and the only input when no -l)',
    input_list_help="input list: every line is measured and calibrates",
    framework_help="onnx (the search measures ONNX models; another framework's model: give -m "
    "the ONNX model oneshot converted it to, or run oneshot with --suggest_fixes)",
)
BASELINE = BaselineArgs()
SEARCH = SearchArgs()
EXPLORER = A.ModelExplorerArgs()
EXECUTOR = A.ExecutorArgs()
COMMON = A.CommonArgs(NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    MODEL.add(parser)
    MODEL.group.add_argument(
        "--diagnosis",
        help="the table naming the culprits (culprit_rank, cause): a verification or snooping run "
        "folder, or its summary.csv/layerwise.csv; without it only global knobs are tried",
    )
    BASELINE.add(parser)
    SEARCH.add(parser)
    EXECUTOR.add(parser)
    EXPLORER.add(parser)
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    from accdbg.algorithms.fixes import run_fix_search

    model = MODEL.parse(args)
    if model.framework != "onnx":
        raise AccdbgError(
            f"--fix_search measures ONNX models; -f {model.framework}: give -m the ONNX model "
            "oneshot converted it to (<working_dir>/conversion/<run>/), or run oneshot with "
            "--suggest_fixes, which does"
        )
    if not model.input_list and not model.input_tensors:
        raise AccdbgError("--fix_search needs -l/--input_list or -i/--input_tensor")
    model.check_output_tensors(
        "the search measures every candidate on the model's graph outputs (those a deployed "
        "model returns)"
    )
    run_fix_search(
        model.model_path,
        model.input_tensors,
        input_list=model.input_list,
        diagnosis=args.diagnosis,
        engine_kwargs=BASELINE.parse(args),
        allow_nonfinite_inputs=model.allow_nonfinite_inputs,
        model_explorer=EXPLORER.parse(args),
        executor=EXECUTOR.parse(args),
        **COMMON.parse(args).keywords(),
        **SEARCH.parse(args).keywords(),
    )
    return 0
