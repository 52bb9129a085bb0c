"""``run_quant_checker``: every quantizer variant, every weight, bias and activation, before
anything runs on a device.

The float model is pre-processed and quantized per variant by the inference engine's own
functions (:mod:`.variants`), each variant's encodings are read back from its QDQ model, and
every quantized tensor is checked against its float values (:mod:`.collect`): weights and
biases from the pre-processed model's initializers (no backend, no input needed), activations
from the float model run on the calibration inputs (``-l``, else the ``-i`` files). Without
any input, only the weights are checked: the quantizer is calibrated on one random input so
it runs, and the activation and bias encodings that calibration makes mean nothing.

Output ``<working_dir>/quant_checker/<run>/``: ``quant_checker.csv`` (one row per tensor,
``culprit_rank`` and ``cause``), ``quant_checker.html``, ``variants/<variant>.csv`` (every check
of every tensor under one variant), ``checks/<check>.csv`` (one check over every variant),
``models/`` (each variant's QDQ model and the pre-processed float model), ``encodings/``
(each variant's encodings as an AIMET file, usable as ``-qo``), ``plots/<tensor>/``, the
options JSON and ``log.txt``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
from onnx import numpy_helper

from accdbg.algorithms.quant_checker import collect, tables
from accdbg.algorithms.quant_checker.variants import Variant, parse_variants, quantize_variants
from accdbg.core import onnx_model as om
from accdbg.core.inputs import InputTensor, parse_input_list
from accdbg.core.progress import progress
from accdbg.core.run_dir import RunDir, check_run_folder, write_json_atomic
from accdbg.encodings.aimet import aimet_dict
from accdbg.encodings.model import ACTIVATION
from accdbg.encodings.rules import RuleConfig, check_rules, summary_lines
from accdbg.engines.options import QuantOptions
from accdbg.engines.pipeline import Calibration, prepare_float
from accdbg.engines.quantize import QUANTIZERS, check_quantizer_options
from accdbg.engines.source import build_feeds
from accdbg.errors import AccdbgError
from accdbg.inspection.inspect import assign_folders
from accdbg.reports.summary import write_csv

log = logging.getLogger("accdbg.quant_checker")

COMPONENT = "quant_checker"
PLOT_CHOICES = ("failing", "all", "none")
PLOT_LIMIT = 20  # failing tensors plotted, best culprit first: a tensor's 4 PNGs take ~1 s
MAX_PLOT_POINTS = 20_000
SEED = 0


@dataclass
class QuantCheckerResult:
    """Where the run went and its tables (pandas DataFrames)."""

    run_dir: Path
    summary: pd.DataFrame  # one row per tensor, culprit_rank and cause
    variants: dict[str, pd.DataFrame]  # variant -> every check of every tensor
    checks: dict[str, pd.DataFrame]  # check -> long table over variants
    findings: list[str]
    report: Path
    seconds: float
    steps: list[str] = field(default_factory=list)


def _random_feeds(model: onnx.ModelProto, work: Path, seed: int):
    """One random input (weights-only mode): the quantizer needs something to calibrate on."""
    rng = np.random.default_rng(seed)
    feeds = {}
    dims, dtypes = {}, {}
    for vi in om.real_inputs(model):
        shape = om.dims_of(vi)
        if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise AccdbgError(
                f"model input {vi.name!r} has dynamic dims; give them with -i/--input_tensor "
                f"{vi.name!r} <dims> <file> (or the calibration data with -l)"
            )
        dt = om.elem_dtype(vi) or np.dtype("float32")
        arr = rng.standard_normal(shape).astype(dt) if dt.kind == "f" else np.zeros(shape, dt)
        path = work / f"random_{len(feeds)}.raw"
        arr.tofile(path)
        feeds[vi.name] = (str(path), tuple(shape), dt.name, dt.name)
        dims[vi.name], dtypes[vi.name] = tuple(shape), dt
    return [feeds], dims, dtypes


def check_plot_options(plots_mode: str, max_plot_points: int, threshold: float) -> None:
    if plots_mode not in PLOT_CHOICES:
        raise AccdbgError(f"--plots {plots_mode!r} is not one of {', '.join(PLOT_CHOICES)}")
    if int(max_plot_points) < 100:
        raise AccdbgError(f"--max_plot_points must be at least 100, got {max_plot_points}")
    if not np.isfinite(threshold):
        raise AccdbgError(f"--sqnr_threshold must be a finite number of dB, got {threshold}")


RULES_CSV = "encoding_rules.csv"  # every flag of the encoding rules: rule, tensors, what, change
FLAG_COLUMNS = ("rule", "tensors", "what", "change")
NO_RULE_FILE = RuleConfig()  # every rule, its default parameters


def run_quant_checker(
    model_path: str | os.PathLike,
    framework: str = "onnx",
    input_list: str | os.PathLike | None = None,
    input_tensors: Sequence[InputTensor] = (),
    quantizers: str | Sequence[str] = QUANTIZERS,
    per_channel_variants: str = "both",
    act_bitwidth: int = 8,
    weights_bitwidth: int = 8,
    bias_bitwidth: int = 32,
    sqnr_threshold: float = tables.SQNR_THRESHOLD,
    plots_mode: str = "failing",
    per_channel_plots: bool = False,
    plot_limit: int = PLOT_LIMIT,
    max_plot_points: int = MAX_PLOT_POINTS,
    seed: int = SEED,
    memory_budget_mb: float = 4096,
    quantization_overrides: str | os.PathLike | None = None,
    working_dir: str | os.PathLike = "working_directory",
    output_dirname: str | None = None,
    allow_nonfinite_inputs: bool = False,
    options_record: dict | None = None,
    model_explorer: bool = True,
    encoding_rules: str | os.PathLike | None = None,
) -> QuantCheckerResult:
    """Check every weight, bias and activation under each quantizer variant; see the module
    docstring for what is written. ``quantizers`` (``tf``, ``enhanced``, ``adjusted``,
    ``symmetric``) x ``per_channel_variants`` (``both``, ``off``, ``on``) are the variants.
    A ``framework`` other than ONNX is converted first (as the end-to-end run does, into the
    run's ``conversion/``), which needs ``input_tensors``; tensors are then named as in the
    ONNX model, with a ``framework_name`` column where the conversion maps them.
    ``quantization_overrides`` (AIMET encodings, the engine's ``-qo``) apply to every variant.
    With ``model_explorer``, Model Explorer overlays of each tensor's worst SQNR over the
    variants and of the culprit ranking go to ``model_explorer/`` on the ONNX model (the
    converted one for other frameworks): a weight or bias on the node using it, an
    activation on the node producing it."""
    start = time.perf_counter()
    rules = RuleConfig.load(encoding_rules)  # a bad rule file is refused before any work
    variants = parse_variants(quantizers, per_channel_variants)
    for v in variants:
        check_quantizer_options(
            act_bitwidth, weights_bitwidth, bias_bitwidth, v.quantizer, v.quantizer
        )
    check_plot_options(plots_mode, max_plot_points, sqnr_threshold)
    if quantization_overrides is not None and not Path(quantization_overrides).is_file():
        raise AccdbgError(
            f"-qo/--quantization_overrides {str(quantization_overrides)!r} does not exist"
        )
    if int(plot_limit) < 0:
        raise AccdbgError(f"--plot_limit must be 0 or more, got {plot_limit}")
    framework = str(framework).strip().lower()
    parsed = parse_input_list(input_list) if input_list is not None else None
    calibrated = parsed is not None or bool(input_tensors)
    feeds = dims = dtypes = model = None
    if framework != "onnx":
        from accdbg.frameworks.diagnosis import check_model_path

        check_model_path(model_path, framework)
        if not input_tensors:
            raise AccdbgError(
                f"-f {framework}: give the inputs' names, dims and files with -i/--input_tensor "
                "(the conversion to ONNX needs them)"
            )
        for t in input_tensors:
            t.check(allow_nonfinite_inputs)
    else:
        model = om.load_model(model_path)
    if calibrated and model is not None:
        feeds, dims, dtypes = build_feeds(
            model, parsed, list(input_tensors), allow_nonfinite_inputs
        )
    check_run_folder(working_dir, COMPONENT, output_dirname)
    options = options_record or {
        "model_path": str(model_path),
        "framework": framework,
        "input_list": str(input_list) if input_list is not None else None,
        "input_tensor": [t.record() for t in input_tensors],
        "quantizers": [v.quantizer for v in variants],
        "per_channel_variants": per_channel_variants,
        "act_bitwidth": act_bitwidth,
        "weights_bitwidth": weights_bitwidth,
        "bias_bitwidth": bias_bitwidth,
        "sqnr_threshold": sqnr_threshold,
        "plots": plots_mode,
        "per_channel_plots": per_channel_plots,
        "plot_limit": plot_limit,
        "max_plot_points": max_plot_points,
        "seed": seed,
        "memory_budget_mb": memory_budget_mb,
        "quantization_overrides": str(quantization_overrides) if quantization_overrides else None,
    }
    with RunDir(working_dir, COMPONENT, output_dirname) as run:
        run.write_options(options)
        work = run.path / ".work"
        work.mkdir()
        conversion = None
        if model is None:
            from accdbg.frameworks.convert import convert_to_onnx

            conversion = convert_to_onnx(
                framework, model_path, input_tensors, run.path / "conversion"
            )
            model = om.load_model(conversion.onnx_path)
            renamed = conversion.renamed(input_tensors)
            feeds, dims, dtypes = build_feeds(model, parsed, renamed, allow_nonfinite_inputs)
        if not calibrated:
            feeds, dims, dtypes = _random_feeds(model, work, seed)
            log.info(
                "no calibration data (-l/-i): checking the weights only; activations and biases "
                "(whose encodings follow the activations') are not checked"
            )
        result = _run(
            run.path,
            work,
            model,
            Path(model_path).stem,
            variants,
            feeds,
            dims,
            dtypes,
            calibrated,
            act_bitwidth,
            weights_bitwidth,
            bias_bitwidth,
            sqnr_threshold,
            (plots_mode, int(plot_limit)),
            per_channel_plots,
            max_plot_points,
            seed,
            memory_budget_mb,
            quantization_overrides,
            rules,
        )
        if conversion is not None:
            _framework_names(result, conversion.tensor_mapping, run.path)
        if model_explorer:
            source = conversion.onnx_path if conversion is not None else Path(model_path)
            _overlays(result, source, run.path, run.final_path)
        shutil.rmtree(work, ignore_errors=True)
    final = run.path
    result.run_dir = final
    result.report = final / result.report.name
    result.seconds = time.perf_counter() - start
    for line in result.findings:
        log.info("%s", line)
    log.info("report: %s", result.report)
    return result


class _Sqnr:
    higher_is_better = True


def _overlays(result: QuantCheckerResult, source: Path, folder: Path, final: Path) -> None:
    """Model Explorer overlays of the summary: each tensor's worst SQNR over the variants
    and the culprit ranking, keyed by tensor (a weight lands on the node using it), else
    by the node the checker names (a tensor the pre-processing renamed)."""
    from accdbg.reports.model_explorer import overlay_run

    overlay_run(
        folder,
        [folder / result.report.name],
        source.absolute(),
        result.summary,
        "Name",
        {"worst SQNR": _Sqnr()},
        fallback_cols=("node",),
        final_dir=final,
    )


def _framework_names(result: QuantCheckerResult, mapping: dict[str, str], out: Path) -> None:
    """Name each tensor in the framework too (``framework_name``), beside the ONNX name."""
    df = result.summary
    if not len(df):
        return
    df.insert(1, "framework_name", [mapping.get(str(n), "") for n in df["Name"]])
    write_csv(df, out / f"{COMPONENT}.csv")


def _run(
    out: Path,
    work: Path,
    model: onnx.ModelProto,
    stem: str,
    variants: list[Variant],
    feeds,
    dims,
    dtypes,
    calibrated: bool,
    act_bw: int,
    w_bw: int,
    b_bw: int,
    threshold: float,
    plots_mode: tuple[str, int],
    per_channel_plots: bool,
    max_plot_points: int,
    seed: int,
    memory_budget_mb: float,
    quantization_overrides: str | os.PathLike | None = None,
    rules: RuleConfig = NO_RULE_FILE,
) -> QuantCheckerResult:
    models_dir, enc_dir = out / "models", out / "encodings"
    models_dir.mkdir()
    enc_dir.mkdir()
    calibration = Calibration(feeds, dims, dtypes)
    float_model = prepare_float(model, stem, calibration, models_dir, work / "prepare")
    kept, steps = float_model.path, list(float_model.steps)
    base = QuantOptions(  # -qo applies to every variant, as the engine applies it
        act_bitwidth=act_bw,
        weights_bitwidth=w_bw,
        bias_bitwidth=b_bw,
        quantization_overrides=None
        if quantization_overrides is None
        else str(quantization_overrides),
    )
    encodings, paths, qsteps = quantize_variants(kept, variants, calibration, models_dir, base)
    steps += qsteps
    for v, encs in encodings.items():
        write_json_atomic(enc_dir / f"{v.name}.encodings", aimet_dict(encs.values(), "0.6.1"))
    by_name = {v.name: encs for v, encs in encodings.items()}
    if not calibrated:  # activation and bias encodings of a random calibration mean nothing
        by_name = {
            v: {n: e for n, e in encs.items() if e.kind != ACTIVATION and e.bitwidth != 32}
            for v, encs in by_name.items()
        }
    prepared = onnx.load(str(kept))
    qdq_models = {v.name: onnx.load(str(p), load_external_data=False) for v, p in paths.items()}
    tensors = collect.catalog(prepared, qdq_models, by_name, max_plot_points, seed)
    if not calibrated:
        tensors = [c for c in tensors if c.kind == collect.WEIGHT]
    collect.check_params(prepared, tensors)
    lines = [
        [
            InputTensor(n, tuple(d), Path(p), np.dtype(t), None if st == t else np.dtype(st))
            for n, (p, d, t, st) in f.items()
        ]
        for f in feeds
    ]
    runs = collect.check_activations(
        kept, tensors, lines if calibrated else [], memory_budget_mb, work / "scratch"
    )
    n_act = sum(c.kind == ACTIVATION for c in tensors)
    log.info(
        "checked %d weights, %d biases, %d activations%s under %d variants",
        sum(c.kind == collect.WEIGHT for c in tensors),
        sum(c.kind == collect.BIAS for c in tensors),
        n_act,
        f" ({len(lines)} input(s), {runs} float run(s))" if n_act else "",
        len(variants),
    )
    names = [v.name for v in variants]
    per_variant = {v: tables.variant_rows(tensors, v, threshold) for v in names}
    summary = tables.summary_table(tensors, per_variant, threshold)
    checks = {k: tables.check_table(per_variant, k) for k in tables.CHECKS}
    (out / "variants").mkdir()
    (out / "checks").mkdir()
    variant_csvs = {}
    for v, df in per_variant.items():
        write_csv(df, out / "variants" / f"{v}.csv")
        variant_csvs[v] = f"variants/{v}.csv"
    for k, df in checks.items():
        write_csv(df, out / "checks" / f"{k}.csv")
    write_csv(summary, out / f"{COMPONENT}.csv")
    findings = tables.findings(summary, names, threshold)
    flags = check_rules(qdq_models[names[0]], rules)  # the first variant's encodings
    write_csv(
        pd.DataFrame([f.as_dict() for f in flags], columns=list(FLAG_COLUMNS)), out / RULES_CSV
    )
    findings += summary_lines(flags)
    if not calibrated:
        findings.append(
            "weights only: no calibration data (-l/-i), activations and biases not checked"
        )
    links = _plots(
        out,
        tensors,
        summary,
        prepared,
        plots_mode,
        per_channel_plots,
        max_plot_points,
        seed,
        threshold,
    )
    from accdbg.algorithms.quant_checker.report import write_report

    meta = f"{stem}: {len(tensors)} tensors, {len(variants)} variants, A{act_bw}W{w_bw}B{b_bw}"
    report = write_report(
        out / f"{COMPONENT}.html",
        summary,
        {v.name: v.describe() for v in variants},
        threshold,
        findings,
        links,
        variant_csvs,
        meta=meta,
        notes=steps,
    )
    write_json_atomic(out / "steps.json", steps)
    return QuantCheckerResult(out, summary, per_variant, checks, findings, report, 0.0, steps)


def _plots(
    out: Path,
    tensors,
    summary: pd.DataFrame,
    prepared: onnx.ModelProto,
    mode: tuple[str, int],
    per_channel: bool,
    max_points: int,
    seed: int,
    threshold: float,
) -> dict[str, list[tuple[str, str]]]:
    """Pictures of all tensors, or of the ``limit`` best-ranked culprits (``mode`` is
    (all|failing|none, limit)); returns each tensor's links for the report."""
    mode, limit = mode
    if mode == "none" or not len(summary) or "culprit_rank" not in summary.columns:
        return {}
    ranked = summary[summary["culprit_rank"].notna()].sort_values("culprit_rank")
    failing = set(ranked["Name"].astype(str).head(limit))
    if mode == "failing" and len(ranked) > limit:
        log.info(
            "plots for the %d best-ranked of %d failing tensors (--plot_limit)", limit, len(ranked)
        )
    chosen = [
        c
        for c in tensors
        if c.moments is not None and c.moments.n and (mode == "all" or c.name in failing)
    ]
    if not chosen:
        return {}
    # matplotlib on first use: `--help` and a run with `--plots none` never draw
    from accdbg.algorithms.quant_checker import plots

    folders = assign_folders([c.name for c in chosen])
    inits = {i.name: i for i in prepared.graph.initializer}
    rng = np.random.default_rng(seed)
    links: dict[str, list[tuple[str, str]]] = {}
    t = time.perf_counter()
    for c in progress(chosen, "quant checker: plots", unit="tensors", line=False):
        folder = out / "plots" / folders[c.name]
        full = positions = None
        if c.kind != ACTIVATION and c.source in inits:
            full = numpy_helper.to_array(inits[c.source]).astype(np.float64)
            n = full.size
            positions = (
                np.arange(n)
                if n <= max_points
                else np.sort(rng.choice(n, max_points, replace=False))
            )
            values = full.reshape(-1)[positions]
            note = (
                "all values"
                if n <= max_points
                else f"random sample: {max_points:,} of {n:,} values, seed {seed}"
            )
        else:
            values = c.moments.sample
            note = f"random sample: {values.size:,} of {c.moments.n:,} values over the inputs, seed {seed}"
        files = plots.tensor_plots(folder, c.name, values, positions, full, c.grids, note)
        if per_channel and c.moments.ch_min is not None:
            files.append(
                plots.channel_plot(
                    folder, c.name, c.moments.ch_min, c.moments.ch_max, c.errors, threshold
                )
            )
        rel = f"plots/{folders[c.name]}"
        links[c.name] = [
            (f.removesuffix(".png").split("_")[0].lower(), f"{rel}/{f}") for f in files
        ]
    log.info("plots of %d tensors in %.1f s", len(chosen), time.perf_counter() - t)
    return links
