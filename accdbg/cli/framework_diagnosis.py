"""``--framework_diagnosis``: flags in, :func:`run_framework_diagnosis` out."""

from __future__ import annotations

import argparse
import logging

from accdbg.cli import args as A
from accdbg.frameworks.diagnosis import run_framework_diagnosis

NAME = "framework_diagnosis"
HELP = "run the float model in its framework and dump every intermediate tensor (golden reference)"
log = logging.getLogger("accdbg")


MODEL = A.ModelArgs(required=True)
FRAMEWORK = A.FrameworkArgs()
COMMON = A.CommonArgs(NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    MODEL.add(parser)
    parser.add_argument(
        "-l",
        "--input_list",
        default=None,
        help="qnn-net-run input list: one golden per line, in Result_N/ (-i gives the names, "
        "dims and types; plain paths follow the model's input order)" + A.INPUT_LIST_FORMAT,
    )
    FRAMEWORK.add(parser)
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    model = MODEL.parse(args)
    result = run_framework_diagnosis(
        model.framework,
        model.model_path,
        model.input_tensors,
        output_tensors=model.output_tensors,
        options_record=A.options_dict(args),
        input_list=args.input_list,
        allow_nonfinite_inputs=model.allow_nonfinite_inputs,
        **COMMON.parse(args).keywords(),
        **FRAMEWORK.parse(args).keywords(),
    )
    log.info(
        "framework diagnosis: %d tensors, %.1f MB in %.1f s -> %s",
        len(result.tensors),
        result.tensors["bytes"].sum() / 1e6 if len(result.tensors) else 0,
        result.seconds,
        result.run_dir,
    )
    return 0
