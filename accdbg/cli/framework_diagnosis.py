"""``--framework_diagnosis``: flags in, :func:`run_framework_diagnosis` out."""

from __future__ import annotations

import argparse
import logging

from accdbg.cli import args as A
from accdbg.core.inputs import parse_input_tensor
from accdbg.frameworks import versions as framework_versions
from accdbg.frameworks.diagnosis import run_framework_diagnosis

NAME = "framework_diagnosis"
HELP = "run the float model in its framework and dump every intermediate tensor (golden reference)"
log = logging.getLogger("accdbg")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    A.add_model(parser)
    parser.add_argument(
        "-l",
        "--input_list",
        default=None,
        help="qnn-net-run input list: one golden per line, in Result_N/ (-i gives the names, "
        "dims and types; plain paths follow the model's input order)",
    )
    A.add_framework_runtime(parser)
    A.add_common(parser, NAME)


def run(args: argparse.Namespace) -> int:
    framework = framework_versions.check_framework(args.framework)
    inputs = [parse_input_tensor(v) for v in args.input_tensor]
    result = run_framework_diagnosis(
        framework,
        args.model_path,
        inputs,
        output_tensors=args.output_tensor,
        working_dir=args.working_dir,
        output_dirname=args.output_dirname,
        disable_graph_optimization=args.disable_graph_optimization,
        onnx_custom_op_lib=args.onnx_custom_op_lib,
        memory_budget_mb=args.memory_budget_mb,
        include_constants=args.include_constants,
        options_record=A.options_dict(args),
        input_list=args.input_list,
        allow_nonfinite_inputs=args.allow_nonfinite_inputs,
    )
    log.info(
        "framework diagnosis: %d tensors, %.1f MB in %.1f s -> %s",
        len(result.tensors),
        result.tensors["bytes"].sum() / 1e6 if len(result.tensors) else 0,
        result.seconds,
        result.run_dir,
    )
    return 0
