"""``--deep_analyzer modelDissectionAnalyzer`` on existing runs: framework diagnosis (golden),
inference engine (its QDQ model) and verification (the problem tensor).

The same analyzer runs after oneshot from the wrapper (``--deep_analyzer`` there); this
standalone form is chosen when ``--inference_results`` is given (see :mod:`accdbg.cli.main`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from accdbg.cli import args as A
from accdbg.core.inputs import parse_input_tensor
from accdbg.errors import AccdbgError

NAME = "deep_analyzer"
VERIFIERS = A.VerifierArgs(default=("CosineSimilarity", "SQNR"))
HELP = "model dissection over existing framework diagnosis, inference engine and verification runs"
ANALYZERS = ("modelDissectionAnalyzer",)
log = logging.getLogger("accdbg")


def add_dissection_arguments(g) -> None:
    """The analyzer's own flags, shared with the wrapper."""
    g.add_argument(
        "--problem_inference_tensor",
        default=None,
        help="(modelDissectionAnalyzer) layer output to dissect; default: the first one failing a "
        "verifier threshold in the verification run",
    )
    g.add_argument(
        "--maximum_dissection_iterations",
        type=int,
        default=7,
        help="(modelDissectionAnalyzer) most iterations, each moving the golden inputs one producer back (default 7)",
    )
    g.add_argument(
        "--auto_stop_iterations",
        type=int,
        default=None,
        help="(modelDissectionAnalyzer) stop once the score has not changed (within 1%%) for this many iterations",
    )
    g.add_argument(
        "--partition_override",
        default=None,
        help='(modelDissectionAnalyzer) JSON file or text: the inputs of each iteration by hand, e.g. [["conv3"], ["conv1"]]',
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("deep analyzer arguments")
    g.add_argument("--deep_analyzer", required=True, choices=ANALYZERS)
    g.add_argument(
        "--framework_results",
        "--golden_output_reference_directory",
        dest="framework_results",
        required=True,
        metavar="DIR",
        help="framework diagnosis run folder (golden tensors)",
    )
    g.add_argument(
        "--inference_results",
        required=True,
        metavar="DIR",
        help="inference engine run folder (its <model>.qdq.onnx is dissected), or a folder in it",
    )
    g.add_argument(
        "--verification_results",
        default=None,
        metavar="DIR",
        help="verification run folder; its first failing tensor is the problem tensor",
    )
    g.add_argument(
        "-i",
        "--input_tensor",
        nargs="+",
        action="append",
        default=None,
        metavar="INPUT_TENSOR",
        help="model input files as for the other components (default: the files the golden run records)",
    )
    VERIFIERS.add(parser, g)
    add_dissection_arguments(g)
    m = parser.add_argument_group(
        "the model flags of the end-to-end command this joins (accepted; the dissection cuts "
        "the QDQ model of --inference_results)"
    )
    m.add_argument("-f", "--framework", nargs="+", default=None, metavar="FRAMEWORK")
    m.add_argument("-m", "--model_path", default=None)
    m.add_argument("-o", "--output_tensor", action="append", default=[])
    e = parser.add_argument_group("backend")
    e.add_argument("-r", "--runtime", default="htp", help="QNN runtime (default htp)")
    e.add_argument("--engine", default="qnn", type=str.lower, help="qnn (default) or simulation")
    A.ModelExplorerArgs().add(parser)
    A.CommonArgs(NAME).add(parser)


def engine_qdq_model(folder: str | Path) -> Path:
    """The QDQ model of an inference engine run, from its folder or a folder inside it."""
    start = Path(folder).expanduser().absolute()
    if not start.is_dir():
        raise AccdbgError(f"--inference_results {str(folder)!r} does not exist or is not a folder")
    for p in [start, *list(start.parents)[:3]]:
        found = sorted(p.glob("*.qdq.onnx"))
        if found:
            return found[0]
    raise AccdbgError(
        f"--inference_results {str(folder)!r} holds no QDQ model (<model>.qdq.onnx of an inference "
        "engine run of the source stage); give the engine's run folder"
    )


def run(args: argparse.Namespace) -> int:
    from accdbg.algorithms.dissection import run_dissection

    inputs = [parse_input_tensor(v) for v in args.input_tensor or []]
    qdq = engine_qdq_model(args.inference_results)
    given = [
        flag
        for flag, value in (
            ("-f", args.framework),
            ("-m", args.model_path),
            ("-o", args.output_tensor),
        )
        if value
    ]
    if given:
        log.info(
            "%s: the model dissection cuts the inference engine run's QDQ model %s, from the "
            "problem tensor back",
            "/".join(given),
            qdq,
        )
    result = run_dissection(
        qdq,
        args.framework_results,
        inputs,
        verification_dir=args.verification_results,
        problem_inference_tensor=args.problem_inference_tensor,
        verifiers=VERIFIERS.parse(args),
        maximum_dissection_iterations=args.maximum_dissection_iterations,
        auto_stop_iterations=args.auto_stop_iterations,
        partition_override=args.partition_override,
        engine_kwargs={"runtime": args.runtime, "engine": args.engine},
        working_dir=args.working_dir,
        output_dirname=args.output_dirname,
        model_explorer=args.model_explorer,
    )
    log.info("report: %s", result.html)
    return 0
