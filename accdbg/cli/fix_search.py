"""``--fix_search``: flags in, :func:`~accdbg.algorithms.fixes.run_fix_search` out."""

from __future__ import annotations

import argparse
import logging

from accdbg.cli import args as A
from accdbg.core.inputs import parse_input_tensor
from accdbg.engines.options import EngineConfig
from accdbg.engines.qnn import RUNTIMES
from accdbg.engines.quantize import QUANTIZERS
from accdbg.errors import AccdbgError

NAME = "fix_search"
HELP = "search a quantization fix for the diagnosed layers, every candidate measured on QNN HTP"
log = logging.getLogger("accdbg")


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The search's own flags, shared with the wrapper's ``--suggest_fixes``."""
    g = parser.add_argument_group("fix search")
    g.add_argument(
        "--target_sqnr",
        type=float,
        default=None,
        metavar="DB",
        help="stop when the outputs' SQNR on QNN (mean over inputs) reaches this many dB",
    )
    g.add_argument(
        "--target_gap",
        type=float,
        default=None,
        metavar="SHARE",
        help="stop when this share of the baseline's output error (noise power) is removed, e.g. 0.9",
    )
    g.add_argument(
        "--max_16bit_tensors",
        type=int,
        default=None,
        help="accept no fix with more 16-bit activation tensors in the QNN graph",
    )
    g.add_argument(
        "--time_budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no new search round after this many seconds (the first always runs)",
    )
    g.add_argument(
        "--search_workers",
        type=int,
        default=None,
        help="parallel worker processes measuring candidates (default: one per core)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model arguments")
    g.add_argument("-m", "--model_path", required=True, help="the float ONNX model")
    g.add_argument(
        "-i",
        "--input_tensor",
        nargs="+",
        action="append",
        default=[],
        metavar="INPUT_TENSOR",
        help='"name" dims path [dtype]: input dims (and the only input when no -l)',
    )
    g.add_argument("-l", "--input_list", help="input list: every line is measured and calibrates")
    A.add_allow_nonfinite(g)
    g.add_argument(
        "--diagnosis",
        help="the table naming the culprits (culprit_rank, cause): a verification or snooping run "
        "folder, or its summary.csv/layerwise.csv; without it only global knobs are tried",
    )
    q = parser.add_argument_group("the baseline quantization (as --inference_engine)")
    q.add_argument("-r", "--runtime", choices=RUNTIMES, default="htp")
    q.add_argument("-abw", "--act_bitwidth", type=int, choices=(8, 16), default=8)
    q.add_argument("-wbw", "--weights_bitwidth", type=int, choices=(8, 16), default=8)
    q.add_argument("-pq", "--param_quantizer", choices=QUANTIZERS, default="tf")
    q.add_argument("--act_quantizer", choices=QUANTIZERS, default="tf")
    q.add_argument("--per_channel_quantization", action="store_true")
    add_search_arguments(parser)
    A.ModelExplorerArgs().add(parser)
    A.CommonArgs(NAME).add(parser)


def search_kwargs(args: argparse.Namespace) -> dict:
    return dict(
        target_sqnr=args.target_sqnr,
        target_gap=args.target_gap,
        max_16bit_tensors=args.max_16bit_tensors,
        time_budget=args.time_budget,
        workers=args.search_workers,
    )


def run(args: argparse.Namespace) -> int:
    from accdbg.algorithms.fixes import run_fix_search

    if not args.input_list and not args.input_tensor:
        raise AccdbgError("--fix_search needs -l/--input_list or -i/--input_tensor")
    run_fix_search(
        args.model_path,
        [parse_input_tensor(v) for v in args.input_tensor],
        input_list=args.input_list,
        diagnosis=args.diagnosis,
        engine_kwargs=EngineConfig.from_keywords(
            runtime=args.runtime,
            act_bitwidth=args.act_bitwidth,
            weights_bitwidth=args.weights_bitwidth,
            act_quantizer=args.act_quantizer,
            param_quantizer=args.param_quantizer,
            per_channel=args.per_channel_quantization,
        ),
        working_dir=args.working_dir,
        output_dirname=args.output_dirname,
        allow_nonfinite_inputs=args.allow_nonfinite_inputs,
        model_explorer=args.model_explorer,
        **search_kwargs(args),
    )
    return 0
