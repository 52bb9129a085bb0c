"""No component flag: the debugging algorithm, end to end (oneshot-layerwise by default)."""

from __future__ import annotations

import argparse
import logging

from accdbg.cli import args as A
from accdbg.cli.inference_engine import EngineArgs
from accdbg.core.run_dir import RunDir, check_run_folder
from accdbg.errors import AccdbgError

NAME = "wrapper"
HELP = "framework diagnosis, QNN inference engine and verification in one run, with the HTML report"
ALGORITHMS = ("oneshot-layerwise", "cumulative-layerwise", "layerwise")
log = logging.getLogger("accdbg")


MODEL = A.ModelArgs(required=True)
ENGINE = EngineArgs(runtime_required=False)
FRAMEWORK = A.FrameworkArgs()
VERIFIERS = A.VerifierArgs(default=("CosineSimilarity", "SQNR"))
COMMON = A.CommonArgs(NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    MODEL.add(parser)
    ENGINE.add(parser)
    FRAMEWORK.add(parser)
    g = parser.add_argument_group("verification and debugging")
    VERIFIERS.add(parser, g)
    g.add_argument(
        "--verifier_config",
        "--verifierConfig",
        dest="verifier_config",
        default=None,
        help="JSON of extra verifiers on chosen tensors",
    )
    g.add_argument(
        "--golden_output_reference_directory",
        "--golden_directory",
        "--goldenOutputReferenceDirectory",
        dest="golden_output_reference_directory",
        default=None,
        help="golden tensors to use instead of running framework diagnosis",
    )
    g.add_argument(
        "--enable_tensor_inspection", action="store_true", help="plots and statistics per layer"
    )
    g.add_argument("--debugging_algorithm", choices=ALGORITHMS, default=ALGORITHMS[0])
    g.add_argument(
        "--start_layer", help="(layerwise, cumulative-layerwise) first layer output to debug"
    )
    g.add_argument(
        "--end_layer", help="(layerwise, cumulative-layerwise) last layer output to debug"
    )
    g.add_argument("--deep_analyzer", help="(not available)")
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    if args.deep_analyzer:
        raise AccdbgError(f"--deep_analyzer {args.deep_analyzer!r} is not available in accdbg")
    if args.start_layer or args.end_layer:
        if args.debugging_algorithm == "oneshot-layerwise":
            raise AccdbgError(
                "--start_layer/--end_layer apply to layerwise and cumulative-layerwise only"
            )
    model, config, place = MODEL.parse(args), ENGINE.parse(args), COMMON.parse(args)
    framework, inputs = model.framework, model.input_tensors
    verifiers = VERIFIERS.parse(args)
    oneshot = args.debugging_algorithm == "oneshot-layerwise"
    allow = model.allow_nonfinite_inputs
    # Everything is checked before the first component starts: a refused command writes
    # nothing and moves no `latest`.
    check_run_folder(place.working_dir, NAME, place.output_dirname, resume=not oneshot)
    if oneshot:
        from accdbg.algorithms.oneshot import check_oneshot, run_oneshot

        check_oneshot(
            framework,
            model.model_path,
            inputs,
            args.input_list,
            verifiers,
            args.verifier_config,
            args.golden_output_reference_directory,
            config,
            place.working_dir,
            place.output_dirname,
            allow,
        )
    else:
        from accdbg.algorithms import run_cumulative_layerwise, run_layerwise
        from accdbg.algorithms.snooping import SnoopArgs, check_request

        if framework != "onnx":
            raise AccdbgError(
                f"--debugging_algorithm {args.debugging_algorithm} runs ONNX models; -f {framework} "
                "works with oneshot-layerwise"
            )
        layerwise = args.debugging_algorithm == "layerwise"
        snoop_kwargs = dict(
            input_list=args.input_list,
            golden_dir=args.golden_output_reference_directory,
            verifiers=verifiers,
            start_layer=args.start_layer,
            end_layer=args.end_layer,
            engine_kwargs=config,
            allow_nonfinite_inputs=allow,
            **place.keywords(),
        )
        check_request(
            "layerwise" if layerwise else "cumulative_layerwise",
            SnoopArgs(
                model.model_path,
                inputs,
                qdq_model=None,
                memory_budget_mb=args.memory_budget_mb,
                workers=None,
                dump_qnn_json=False,
                **snoop_kwargs,
            ),
        )
    with RunDir(place.working_dir, NAME, place.output_dirname, resume=not oneshot) as run:
        run.write_options(A.options_dict(args))
        if oneshot:
            run_oneshot(
                framework,
                model.model_path,
                inputs,
                input_list=args.input_list,
                output_tensors=model.output_tensors,
                default_verifiers=verifiers,
                verifier_config=args.verifier_config,
                golden_dir=args.golden_output_reference_directory,
                enable_tensor_inspection=args.enable_tensor_inspection,
                engine_kwargs=config,
                framework_kwargs=FRAMEWORK.parse(args).keywords(),
                allow_nonfinite_inputs=allow,
                **place.keywords(),
            )
        else:
            fn = run_layerwise if layerwise else run_cumulative_layerwise
            result = fn(model.model_path, inputs, **snoop_kwargs)
            log.info("report: %s", result.html)
    return 0
