"""``--tensor_inspection``: flags in, :func:`run_tensor_inspection` out."""

from __future__ import annotations

import argparse
import logging

from accdbg.cli import args as A
from accdbg.inspection.inspect import (
    DATA_TYPES,
    MAX_CSV_ROWS,
    MAX_PLOT_POINTS,
    SEED,
    run_tensor_inspection,
)
from accdbg.verifiers import verifier_names

NAME = "tensor_inspection"
HELP = "plots, samples and min/max against calibrated ranges for every tensor of two dumps"
log = logging.getLogger("accdbg")


COMMON = A.CommonArgs(NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("required arguments")
    g.add_argument(
        "--golden_data",
        required=True,
        metavar="DIR",
        help="golden tensors: a framework diagnosis run or any folder of .raw files",
    )
    g.add_argument(
        "--target_data",
        required=True,
        metavar="DIR",
        help="target tensors: an inference engine Result_N folder (or a run holding one) "
        "or any folder of .raw files",
    )
    g.add_argument(
        "--verifier",
        action="append",
        nargs="+",
        required=True,
        metavar="VERIFIER",
        help=f"verifier scored on every tensor, optionally with parameters, e.g. "
        f"'rtolatol,rtolmargin,0.01,atolmargin,0.01'; repeat for several. "
        f"Names are case-insensitive: {', '.join(verifier_names())}",
    )
    o = parser.add_argument_group("optional arguments")
    o.add_argument(
        "--data_type",
        choices=DATA_TYPES,
        default="float32",
        help="element type of target .raw files that have no tensors.json (default float32); "
        "integers are dequantized with their encoding when there is one",
    )
    o.add_argument(
        "--target_encodings",
        default=None,
        metavar="FILE",
        help="AIMET encodings JSON or QNN model_net.json giving the calibrated min/max "
        "(default: the encodings recorded in the target's tensors.json, if any)",
    )
    o.add_argument(
        "--tensor_mapping",
        default=None,
        metavar="FILE",
        help="tensor_mapping.json {target name: golden name} (default: same names)",
    )
    o.add_argument(
        "--max_plot_points",
        type=int,
        default=MAX_PLOT_POINTS,
        help=f"largest random sample of a tensor drawn in its plots (default {MAX_PLOT_POINTS:,})",
    )
    o.add_argument(
        "--max_csv_rows",
        type=int,
        default=MAX_CSV_ROWS,
        help=f"largest random sample of a tensor written to its CSVs (default {MAX_CSV_ROWS:,})",
    )
    o.add_argument(
        "--seed", type=int, default=SEED, help=f"seed of the random samples (default {SEED})"
    )
    o.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes sharing the work (default: 2 on a multi-core machine, 1 for a few tensors)",
    )
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    result = run_tensor_inspection(
        args.golden_data,
        args.target_data,
        verifiers=args.verifier,
        data_type=args.data_type,
        target_encodings=args.target_encodings,
        **COMMON.parse(args).keywords(),
        tensor_mapping=args.tensor_mapping,
        max_plot_points=args.max_plot_points,
        max_csv_rows=args.max_csv_rows,
        seed=args.seed,
        workers=args.workers,
        options_record=A.options_dict(args),
    )
    problems = int((result.summary["Status"] != "ok").sum())
    log.info(
        "tensor inspection: %d tensors%s -> %s",
        len(result.summary),
        f" ({problems} with a note in the Status column)" if problems else "",
        result.run_dir,
    )
    return 0
