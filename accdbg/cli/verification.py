"""``--verification``: flags in, :func:`run_verification` out."""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass
from typing import Any

from accdbg.cli import args as A
from accdbg.errors import AccdbgError
from accdbg.frameworks.versions import check_framework
from accdbg.verifiers.verification import run_verification

NAME = "verification"
HELP = "compare the golden tensors with the inference engine's, layer by layer, with verifiers"
log = logging.getLogger("accdbg")


@dataclass(frozen=True)
class VerificationInputs:
    """What is compared with what, and the side files that pair, order and lay out the
    tensors (:func:`run_verification`'s keywords)."""

    golden_dir: str
    inference_results: str
    tensor_mapping: str | None = None
    graph_struct: str | None = None
    verifier_config: str | None = None
    qnn_model_json_path: str | None = None
    discover: bool = True

    def keywords(self) -> dict[str, Any]:
        return asdict(self)


class VerificationArgs(A.ArgGroup):
    """The verification arguments; ``--default_verifier`` goes into this group too."""

    def __init__(self, verifiers: A.VerifierArgs):
        self.verifiers = verifiers

    def add(self, parser: argparse.ArgumentParser) -> None:
        V = VerificationInputs
        g = parser.add_argument_group("verification arguments")
        self.verifiers.add(parser, g)
        g.add_argument(
            "--golden_output_reference_directory",
            "--goldenOutputReferenceDirectory",
            "--framework_results",
            "--frameworkResults",
            dest="golden_output_reference_directory",
            required=True,
            metavar="DIR",
            help="framework diagnosis run folder, or an inference engine run/output folder to compare two engine runs",
        )
        g.add_argument(
            "--inference_results",
            "--inferenceResults",
            dest="inference_results",
            required=True,
            metavar="DIR",
            help="inference engine output/Result_N folder, its output/ folder (every Result_N) or the run folder",
        )
        g.add_argument(
            "--tensor_mapping",
            "--tensorMapping",
            dest="tensor_mapping",
            default=V.tensor_mapping,
            help="tensor_mapping.json {inference name: framework name} (default: exact names)",
        )
        g.add_argument(
            "--graph_struct",
            "--graphStruct",
            dest="graph_struct",
            default=V.graph_struct,
            help="<model>_graph_struct.json: orders the summary in execution order",
        )
        g.add_argument(
            "--verifier_config",
            "--verifierConfig",
            dest="verifier_config",
            default=V.verifier_config,
            help='JSON of extra verifiers on chosen tensors: {"TopK": {"parameters": {"k": 5}, "tensors": [["out"]]}}',
        )
        g.add_argument(
            "--qnn_model_json_path",
            "--qnnModelJsonPath",
            dest="qnn_model_json_path",
            default=V.qnn_model_json_path,
            help="QNN graph JSON (model_net.json): axis formats and encodings of the target tensors",
        )
        g.add_argument(
            "--no_discover",
            action="store_true",
            help="do not use tensor_mapping.json, *_graph_struct.json and model_net.json found "
            "beside the inference results when the flags above are not given",
        )

    def parse(self, args: argparse.Namespace) -> VerificationInputs:
        return VerificationInputs(
            args.golden_output_reference_directory,
            args.inference_results,
            args.tensor_mapping,
            args.graph_struct,
            args.verifier_config,
            args.qnn_model_json_path,
            not args.no_discover,
        )


@dataclass(frozen=True)
class MappingModel:
    """The original model a new tensor mapping is built from (None: none is built)."""

    model_path: str | None = None
    framework: str | None = None

    def keywords(self) -> dict[str, Any]:
        return asdict(self)


class MappingArgs(A.ArgGroup):
    """``-m`` (and the ``-e``/``-f`` the reference tool takes with it), checked together."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        m = parser.add_argument_group("arguments for generating a new tensor_mapping.json")
        m.add_argument(
            "-m",
            "--model_path",
            "--model1_path",
            dest="model_path",
            default=MappingModel.model_path,
            help="original (ONNX) model: map every node output found on both sides",
        )
        m.add_argument(
            "-e",
            "--engine",
            nargs="+",
            default=None,
            metavar="ENGINE",
            help="engine name and optional version, e.g. QNN (only QNN is supported)",
        )
        m.add_argument(
            "-f",
            "--framework",
            nargs="+",
            default=None,
            metavar="FRAMEWORK",
            help="framework and optional version, e.g. onnx (only onnx is supported)",
        )

    def parse(self, args: argparse.Namespace) -> MappingModel:
        if args.engine and args.engine[0].lower() != "qnn":
            raise AccdbgError(f"-e/--engine {args.engine[0]!r} is not supported; expected QNN")
        if args.framework:
            check_framework(args.framework)
        if (args.engine or args.framework) and not args.model_path:
            raise AccdbgError(
                "-e/--engine and -f/--framework only serve to build a tensor mapping: add -m/--model_path"
            )
        return MappingModel(args.model_path, args.framework[0] if args.framework else None)


COMMON = A.CommonArgs(NAME)
VERIFIERS = A.VerifierArgs(default=("CosineSimilarity",))
INPUTS = VerificationArgs(VERIFIERS)
MAPPING = MappingArgs()
EXPLORER = A.ModelExplorerArgs()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    INPUTS.add(parser)
    MAPPING.add(parser)
    EXPLORER.add(parser)
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    mapping = MAPPING.parse(args)
    inputs = INPUTS.parse(args)
    result = run_verification(
        default_verifiers=VERIFIERS.parse(args),
        **inputs.keywords(),
        **mapping.keywords(),
        **COMMON.parse(args).keywords(),
        options_record=A.options_dict(args),
        model_explorer=EXPLORER.parse(args),
    )
    failing = {
        v["label"]: int(
            (result.summary["Failed"].str.split(", ").map(lambda f, lab=v["label"]: lab in f)).sum()
        )
        for v in result.verifiers
    }
    log.info(
        "verification: %d rows; failing rows per verifier: %s -> %s",
        len(result.summary),
        ", ".join(f"{k} {n}" for k, n in failing.items()) or "none",
        result.run_dir,
    )
    return 0
