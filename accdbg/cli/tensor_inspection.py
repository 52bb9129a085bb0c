"""``--tensor_inspection``: flags in, :func:`run_tensor_inspection` out."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field, fields
from typing import Any

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


@dataclass(frozen=True)
class InspectionOptions:
    """The two dumps, the verifiers and the sampling (:func:`run_tensor_inspection`'s keywords)."""

    golden_data: str
    target_data: str
    verifiers: list = field(default_factory=list)
    data_type: str = "float32"
    target_encodings: str | None = None
    tensor_mapping: str | None = None
    max_plot_points: int = MAX_PLOT_POINTS
    max_csv_rows: int = MAX_CSV_ROWS
    seed: int = SEED
    workers: int | None = None

    def keywords(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class InspectionArgs(A.ArgGroup):
    def add(self, parser: argparse.ArgumentParser) -> None:
        D = InspectionOptions
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
            default=D.data_type,
            help="element type of target .raw files that have no tensors.json (default float32); "
            "integers are dequantized with their encoding when there is one",
        )
        o.add_argument(
            "--target_encodings",
            default=D.target_encodings,
            metavar="FILE",
            help="AIMET encodings JSON or QNN model_net.json giving the calibrated min/max "
            "(default: the encodings recorded in the target's tensors.json, if any)",
        )
        o.add_argument(
            "--tensor_mapping",
            default=D.tensor_mapping,
            metavar="FILE",
            help="tensor_mapping.json {target name: golden name} (default: same names)",
        )
        o.add_argument(
            "--max_plot_points",
            type=int,
            default=D.max_plot_points,
            help=f"largest random sample of a tensor drawn in its plots (default {D.max_plot_points:,})",
        )
        o.add_argument(
            "--max_csv_rows",
            type=int,
            default=D.max_csv_rows,
            help=f"largest random sample of a tensor written to its CSVs (default {D.max_csv_rows:,})",
        )
        o.add_argument(
            "--seed",
            type=int,
            default=D.seed,
            help=f"seed of the random samples (default {D.seed})",
        )
        o.add_argument(
            "--workers",
            type=int,
            default=D.workers,
            help="processes sharing the work (default: 2 on a multi-core machine, 1 for a few tensors)",
        )

    def parse(self, args: argparse.Namespace) -> InspectionOptions:
        return InspectionOptions(
            args.golden_data,
            args.target_data,
            list(args.verifier),
            args.data_type,
            args.target_encodings,
            args.tensor_mapping,
            args.max_plot_points,
            args.max_csv_rows,
            args.seed,
            args.workers,
        )


INSPECTION = InspectionArgs()
COMMON = A.CommonArgs(NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    INSPECTION.add(parser)
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    result = run_tensor_inspection(
        **INSPECTION.parse(args).keywords(),
        **COMMON.parse(args).keywords(),
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
