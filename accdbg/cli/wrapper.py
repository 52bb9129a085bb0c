"""No component flag: the debugging algorithm, end to end (oneshot-layerwise by default)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace

from accdbg.algorithms.protocol import NAMES as ALGORITHMS
from accdbg.algorithms.protocol import AlgorithmRequest, get_algorithm
from accdbg.cli import args as A
from accdbg.cli.deep_analyzer import ANALYZERS as DEEP_ANALYZERS
from accdbg.cli.deep_analyzer import add_dissection_arguments
from accdbg.cli.fix_search import SEARCH
from accdbg.cli.inference_engine import EngineArgs
from accdbg.core.executors import ExecutorConfig
from accdbg.core.run_dir import RunDir, check_run_folder, taking_over, unfinished_run
from accdbg.errors import AccdbgError

NAME = "wrapper"
HELP = "framework diagnosis, QNN inference engine and verification in one run, with the HTML report"
# verification's inputs, which the reference's end-to-end example passes too: the end-to-end
# run verifies the runs it makes itself, with their side files; accepted and said so
VERIFICATION_INPUTS = (
    ("--inference_results", "--inferenceResults"),
    ("--tensor_mapping", "--tensorMapping"),
    ("--graph_struct", "--graphStruct"),
    ("--qnn_model_json_path", "--qnnModelJsonPath"),
)
log = logging.getLogger("accdbg")


MODEL = A.ModelArgs(required=True)
ENGINE = EngineArgs(runtime_required=False)
FRAMEWORK = A.FrameworkArgs()
VERIFIERS = A.VerifierArgs(default=("CosineSimilarity", "SQNR"))
EXPLORER = A.ModelExplorerArgs()
EXECUTOR = A.ExecutorArgs()
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
        "--framework_results",
        "--frameworkResults",
        dest="golden_output_reference_directory",
        default=None,
        help="golden tensors to use instead of running framework diagnosis (--framework_results, "
        "as verification spells it, is the same flag)",
    )
    for flags in VERIFICATION_INPUTS:
        g.add_argument(*flags, dest=flags[0].lstrip("-"), default=None, help=argparse.SUPPRESS)
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
    b = parser.add_argument_group("binary snooping (--debugging_algorithm binary)")
    b.add_argument(
        "--subgraph_relative_weight",
        type=float,
        default=0.4,
        help="search a half further when its score exceeds this share of both halves' (default 0.4)",
    )
    b.add_argument(
        "--min_graph_size",
        type=int,
        default=16,
        help="stop halving at this many ops (default 16)",
    )
    b.add_argument(
        "--verifier",
        default="mse",
        type=str.lower,
        help="output score of binary snooping: mse (default) or sqnr",
    )
    d = parser.add_argument_group("deep analyzer (after oneshot-layerwise)")
    d.add_argument(
        "--deep_analyzer",
        choices=DEEP_ANALYZERS,
        default=None,
        help="modelDissectionAnalyzer: after oneshot, dissect the model backwards from the problem tensor",
    )
    add_dissection_arguments(d)
    add_dataset_arguments(parser)
    EXPLORER.add(parser)
    g.add_argument(
        "--suggest_fixes",
        action="store_true",
        help="then search a fix for the culprits found, every candidate measured on QNN HTP "
        "(the --fix_search component; ONNX models)",
    )
    SEARCH.add(parser)
    COMMON.add(parser)


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    from accdbg.algorithms.dataset import AUTO_THRESHOLD

    g = parser.add_argument_group("dataset mode (oneshot-layerwise over many inputs, streamed)")
    g.add_argument(
        "--dataset_mode",
        action="store_true",
        help="stream every -l line through golden and QNN, score it and drop its tensors "
        f"(automatic when -l has more than {AUTO_THRESHOLD} lines); ONNX models",
    )
    g.add_argument(
        "--keep_worst",
        type=int,
        default=1,
        metavar="K",
        help="keep the full tensors of the K inputs whose final outputs score worst (default 1; "
        "the culprit ranking runs on the worst)",
    )
    g.add_argument(
        "--keep_input",
        type=int,
        action="append",
        default=[],
        metavar="LINE",
        help="also keep the tensors of this input-list line (1-based); repeatable",
    )
    EXECUTOR.add(parser)


def _dataset_run(
    args: argparse.Namespace, model, config, place, verifiers, executor: ExecutorConfig | None
) -> None:
    """Oneshot-layerwise over the input list, streamed (``--dataset_mode`` or a long -l)."""
    from accdbg.algorithms.dataset import check_dataset, run_dataset

    refused = [
        flag
        for flag, on in (
            ("--deep_analyzer", args.deep_analyzer),
            ("--suggest_fixes", args.suggest_fixes),
            ("--enable_tensor_inspection", args.enable_tensor_inspection),
        )
        if on
    ]
    if refused:
        raise AccdbgError(
            f"{refused[0]} does not run in dataset mode; run it on one input (without "
            "--dataset_mode, -l with at most the automatic threshold of lines)"
        )
    executor = executor or ExecutorConfig()
    kwargs = dict(
        default_verifiers=verifiers,
        verifier_config=args.verifier_config,
        engine_kwargs=config,
        executor=executor,
        keep_worst=args.keep_worst,
        keep_inputs=list(args.keep_input),
        golden_dir=args.golden_output_reference_directory,
        allow_nonfinite_inputs=model.allow_nonfinite_inputs,
        **place.keywords(),
    )
    check_dataset(model.framework, model.model_path, model.input_tensors, args.input_list, **kwargs)
    check_run_folder(place.working_dir, NAME, place.output_dirname, resume=True)
    with RunDir(
        place.working_dir, NAME, place.output_dirname, resume=True, discard_refused=True
    ) as run:
        run.write_options(A.options_dict(args))
        kwargs.pop("verifier_config")
        kwargs.pop("golden_dir")
        run_dataset(
            model.framework,
            model.model_path,
            model.input_tensors,
            args.input_list,
            framework_kwargs=FRAMEWORK.parse(args).keywords(),
            **kwargs,
        )


def _say_ignored_verification_inputs(args: argparse.Namespace) -> None:
    given = [f[0] for f in VERIFICATION_INPUTS if getattr(args, f[0].lstrip("-")) is not None]
    if given:
        log.info(
            "ignored: %s (the end-to-end run verifies the framework diagnosis and inference "
            "engine runs it makes, with their tensor mapping, graph structure and QNN graph "
            "JSON; verification alone is --verification)",
            ", ".join(given),
        )


def run(args: argparse.Namespace) -> int:
    """The end-to-end run. Run again with the same ``--output_dirname`` after it died (SIGKILL,
    a crash) or failed (SIGTERM, Ctrl-C, an error), it takes that run over: snooping and
    dataset mode continue where they stopped, and every component run of that name starts
    again, replacing what the dead run finished of it (``run_dir.taking_over``)."""
    place = COMMON.parse(args)
    over = place.output_dirname
    if not unfinished_run(place.working_dir, NAME, over):
        over = None
    else:
        log.info(
            "taking over the end-to-end run %r that did not finish: its component runs start "
            "again under that name",
            over,
        )
    with taking_over(place.working_dir, over):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    _say_ignored_verification_inputs(args)
    if args.deep_analyzer and args.debugging_algorithm != "oneshot-layerwise":
        raise AccdbgError(
            f"--deep_analyzer runs after oneshot-layerwise (on its dumps), not after "
            f"--debugging_algorithm {args.debugging_algorithm}"
        )
    if args.start_layer or args.end_layer:
        if args.debugging_algorithm in ("oneshot-layerwise", "binary"):
            raise AccdbgError(
                "--start_layer/--end_layer apply to layerwise and cumulative-layerwise only"
            )
    model, config, place = MODEL.parse(args), ENGINE.parse(args), COMMON.parse(args)
    framework = model.framework
    verifiers = VERIFIERS.parse(args)
    explorer = EXPLORER.parse(args)
    executor = EXECUTOR.parse(args)
    oneshot = args.debugging_algorithm == "oneshot-layerwise"
    from accdbg.algorithms.dataset import AUTO_THRESHOLD, wants_dataset_mode

    if args.dataset_mode and not oneshot:
        raise AccdbgError(
            f"--dataset_mode runs oneshot-layerwise, not --debugging_algorithm {args.debugging_algorithm}"
        )
    if oneshot and wants_dataset_mode(args.input_list, args.dataset_mode):
        if not args.dataset_mode:
            log.info(
                "-l %s has more than %d lines: dataset mode (streamed; --keep_worst %d)",
                args.input_list,
                AUTO_THRESHOLD,
                args.keep_worst,
            )
        _dataset_run(args, model, config, place, verifiers, executor)
        return 0
    if args.keep_input or args.keep_worst != 1:
        flag = "--keep_input" if args.keep_input else "--keep_worst"
        raise AccdbgError(f"{flag} applies in dataset mode: add --dataset_mode")
    if executor is not None and oneshot and not args.suggest_fixes:
        log.warning(
            "--executor/--workers apply to dataset mode, snooping and --suggest_fixes; the "
            "oneshot's inference engine runs in its own two local processes"
        )
    allow = model.allow_nonfinite_inputs
    # Everything is checked before the first component starts: a refused command writes
    # nothing and moves no `latest`.
    if args.deep_analyzer:
        from accdbg.algorithms.dissection import check_dissection_options

        check_dissection_options(
            args.maximum_dissection_iterations, args.auto_stop_iterations, args.partition_override
        )
        check_run_folder(place.working_dir, "deep_analyzer", place.output_dirname, resume=True)
    check_run_folder(place.working_dir, NAME, place.output_dirname, resume=not oneshot)
    if args.suggest_fixes:
        _check_suggest_fixes(args, framework, config, place)
    algorithm = get_algorithm(args.debugging_algorithm)
    if framework != "onnx" and algorithm.on_onnx:
        model = _as_onnx(args.debugging_algorithm, model, place)
    req = AlgorithmRequest(
        model.framework,
        model.model_path,
        model.input_tensors,
        config,
        input_list=args.input_list,
        output_tensors=model.output_tensors,
        golden_dir=args.golden_output_reference_directory,
        verifiers=verifiers,
        verifier_config=args.verifier_config,
        allow_nonfinite_inputs=allow,
        model_explorer=explorer,
        executor=executor,
        options={
            "enable_tensor_inspection": args.enable_tensor_inspection,
            "framework_kwargs": FRAMEWORK.parse(args).keywords(),
            "start_layer": args.start_layer,
            "end_layer": args.end_layer,
            "memory_budget_mb": getattr(args, "memory_budget_mb", None),
            "verifier": args.verifier,
            "subgraph_relative_weight": args.subgraph_relative_weight,
            "min_graph_size": args.min_graph_size,
        },
        **place.keywords(),
    )
    algorithm.check(req)
    with RunDir(
        place.working_dir, NAME, place.output_dirname, resume=not oneshot, discard_refused=True
    ) as run:
        run.write_options(A.options_dict(args))
        result = algorithm.run(req)
        if args.deep_analyzer:
            _dissect(args, result.own, model.input_tensors, verifiers, config, place, explorer)
        if args.suggest_fixes:
            own = result.own
            if oneshot and own.converted_model is not None:
                # another framework's model: the search measures the ONNX model QNN ran
                model = replace(
                    model, model_path=str(own.converted_model), input_tensors=own.converted_inputs
                )
            # the run's folder: its culprits, structured (kind, region, what QNN measured)
            _suggest_fixes(args, model, config, place, explorer, result.run_dir, executor)
    return 0


def _as_onnx(algorithm: str, model, place):
    """Layerwise, cumulative-layerwise and binary cut the ONNX graph into parts: a model of
    another framework runs as its ONNX conversion (under ``conversion/``, as oneshot converts
    it), its layers named as there; the ``-i`` names become the ONNX inputs'."""
    import time
    from pathlib import Path

    from accdbg.core.run_dir import TIMESTAMP_FORMAT
    from accdbg.frameworks.convert import convert_to_onnx

    out = (
        Path(place.working_dir)
        / "conversion"
        / (place.output_dirname or time.strftime(TIMESTAMP_FORMAT))
    )
    conv = convert_to_onnx(
        model.framework, model.model_path, model.input_tensors, out, model.output_tensors
    )
    log.info(
        "-f %s: --debugging_algorithm %s runs on the model's ONNX conversion %s (its layers "
        "are named as there)",
        model.framework,
        algorithm,
        conv.onnx_path,
    )
    renamed = conv.renamed(model.input_tensors)
    return replace(model, framework="onnx", model_path=str(conv.onnx_path), input_tensors=renamed)


def _dissect(args: argparse.Namespace, one, inputs, verifiers, config, place, explorer) -> None:
    """The deep analyzer over the oneshot run's dumps: its golden, QDQ model and verification."""
    from accdbg.algorithms.dissection import run_dissection
    from accdbg.cli.deep_analyzer import engine_qdq_model

    result = run_dissection(
        engine_qdq_model(one.engine_run),
        one.golden_dir,
        inputs,
        verification_dir=one.verification_run,
        problem_inference_tensor=args.problem_inference_tensor,
        verifiers=verifiers,
        maximum_dissection_iterations=args.maximum_dissection_iterations,
        auto_stop_iterations=args.auto_stop_iterations,
        partition_override=args.partition_override,
        engine_kwargs=config,
        model_explorer=explorer,
        **place.keywords(),
    )
    log.info("report: %s", result.html)


def _check_suggest_fixes(args: argparse.Namespace, framework: str, config, place) -> None:
    """``--suggest_fixes``: refused before any component starts when the search cannot run."""
    from accdbg.algorithms.fixes.search import (
        COMPONENT,
        check_search_config,
        check_search_options,
    )

    if framework != "onnx" and args.debugging_algorithm != "oneshot-layerwise":
        raise AccdbgError(
            f"--suggest_fixes searches fixes of ONNX models; -f {framework}: run oneshot-layerwise, "
            "whose conversion to ONNX the search then measures"
        )
    check_search_config(config)
    check_search_options(**SEARCH.parse(args).keywords())
    check_run_folder(
        place.working_dir, COMPONENT, place.output_dirname, resume=place.output_dirname is not None
    )


def _suggest_fixes(
    args: argparse.Namespace, model, config, place, explorer, diagnosis, executor=None
) -> None:
    from accdbg.algorithms.fixes import run_fix_search

    run_fix_search(
        model.model_path,
        model.input_tensors,
        input_list=args.input_list,
        diagnosis=diagnosis,
        engine_kwargs=config,
        allow_nonfinite_inputs=model.allow_nonfinite_inputs,
        model_explorer=explorer,
        executor=executor,
        **place.keywords(),
        **SEARCH.parse(args).keywords(),
    )
