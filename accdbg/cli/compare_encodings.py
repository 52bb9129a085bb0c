"""``--compare_encodings``: flags in, :func:`compare_encodings` (or the QDQ export) out.

Two modes:

* compare: ``--input QNN_NET_JSON --aimet_encodings_json AIMET_JSON`` (the reference tool's flags);
* export: ``--export_qdq_encodings MODEL.qdq.onnx -o OUT.json`` writes the encodings of a QDQ
  ONNX model as an AIMET file, to compare or to feed back as ``--quantization_overrides``.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass
from typing import Any

from accdbg.cli import args as A
from accdbg.encodings.compare import DEFAULT_PRECISION, compare_encodings
from accdbg.encodings.qdq import export_qdq_encodings
from accdbg.errors import AccdbgError

NAME = "compare_encodings"
HELP = "compare the encodings of a QNN model_net.json with AIMET encodings (Excel report of mismatches)"
log = logging.getLogger("accdbg")


@dataclass(frozen=True)
class CompareRequest:
    """Compare mode: QNN's encodings against AIMET's (:func:`compare_encodings`' keywords)."""

    qnn_json: str
    aimet_json: str
    precision: int = DEFAULT_PRECISION
    params_only: bool = False
    activations_only: bool = False
    specific_node: str | None = None

    def keywords(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExportRequest:
    """Export mode: a QDQ model's encodings written as an AIMET file."""

    qdq_model: str
    output: str
    version: str = "0.6.1"


class CompareArgs(A.ArgGroup):
    """Both modes' flags; :meth:`parse` returns the one request the flags make (one-line
    errors for a mix of the two or a missing flag)."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("compare arguments")
        g.add_argument(
            "--input",
            help="QNN model net JSON (model_net.json, or a QNN EP graph dump, or a folder with one)",
        )
        g.add_argument(
            "--aimet_encodings_json", help="AIMET encodings JSON (legacy or 1.0.0 format)"
        )
        g.add_argument(
            "--precision",
            type=int,
            default=CompareRequest.precision,
            help=f"number of decimal places up to which values are compared (default: {CompareRequest.precision})",
        )
        only = g.add_mutually_exclusive_group()
        only.add_argument(
            "--params_only", action="store_true", help="compare only parameters in the encodings"
        )
        only.add_argument(
            "--activations_only",
            action="store_true",
            help="compare only activations in the encodings",
        )
        g.add_argument(
            "--specific_node",
            default=CompareRequest.specific_node,
            help="display both sides' encodings and their differences for this tensor (AIMET or QNN name)",
        )
        e = parser.add_argument_group("export arguments (instead of comparing)")
        e.add_argument(
            "--export_qdq_encodings",
            metavar="QDQ_MODEL",
            default=None,
            help="write the encodings of this QDQ ONNX model as an AIMET encodings file (see -o)",
        )
        e.add_argument(
            "-o",
            "--output",
            default=None,
            help="AIMET JSON file to write with --export_qdq_encodings",
        )
        e.add_argument(
            "--encoding_version",
            choices=["0.6.1", "1.0.0"],
            default=ExportRequest.version,
            help="AIMET format of the exported file (default: 0.6.1, the legacy dict form)",
        )

    def parse(self, args: argparse.Namespace) -> CompareRequest | ExportRequest:
        if args.export_qdq_encodings:
            if args.input or args.aimet_encodings_json:
                raise AccdbgError(
                    "--export_qdq_encodings exports a QDQ model; do not combine it with --input/--aimet_encodings_json"
                )
            if not args.output:
                raise AccdbgError(
                    "--export_qdq_encodings needs -o/--output, the AIMET JSON file to write"
                )
            return ExportRequest(args.export_qdq_encodings, args.output, args.encoding_version)
        missing = [
            f
            for f, v in (
                ("--input", args.input),
                ("--aimet_encodings_json", args.aimet_encodings_json),
            )
            if not v
        ]
        if missing:
            raise AccdbgError(
                f"the following arguments are required: {', '.join(missing)} "
                f"(or --export_qdq_encodings to export a QDQ model's encodings)"
            )
        return CompareRequest(
            args.input,
            args.aimet_encodings_json,
            args.precision,
            bool(args.params_only),
            bool(args.activations_only),
            args.specific_node,
        )


REQUEST = CompareArgs()
COMMON = A.CommonArgs(NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    REQUEST.add(parser)
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    request = REQUEST.parse(args)
    if isinstance(request, ExportRequest):
        export_qdq_encodings(request.qdq_model, request.output, version=request.version)
        return 0
    result = compare_encodings(
        **request.keywords(),
        **COMMON.parse(args).keywords(),
        options_record=A.options_dict(args),
    )
    if result.node_report:
        print(result.node_report)
    log.info(
        "compare encodings: %d tensors compared in %.1f s -> %s",
        len(result.pairs),
        result.seconds,
        result.run_dir,
    )
    return 0
