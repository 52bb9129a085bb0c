"""Build the zoo's cases and run accdbg's algorithms on them (real QNN HTP backend).

A case is a model, a planted fault (or none) and its culprit set. Each case folder holds the
planted model, ``fault.json``, the ``-qo`` file of a clipping fault, and accdbg's run folders.
Oneshot always runs (its QNN engine run also tells whether the fault hurts the quantized
model); layerwise and cumulative-layerwise reuse its golden tensors and its QDQ model, so all
three debug exactly the same quantized model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
import traceback
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import onnx
import pandas as pd

from accdbg.errors import AccdbgError
from benchmarks.zoo import models as zoo_models
from benchmarks.zoo import plant as zoo_plant
from benchmarks.zoo import scoring
from benchmarks.zoo.harm import (
    HarmMeter,
    carrying,
    fingerprint,
    judged_outputs,
    watched_outputs,
)
from benchmarks.zoo.probe import FloatProbe, load_feeds

log = logging.getLogger("fault_zoo")

ALGORITHMS = ("oneshot", "layerwise", "cumulative")
# the cases of --quick: four faults of different kinds on the fastest model and the two clean
# models (each fault one the outputs feel at its first strength: see harm.py, so planting it is
# one QNN run); cls's early weight outlier is one whose channel travels through the layers
# after it; the face model as shipped is the one clean model that names a layer
QUICK = (
    "face/clean/-",
    "cls/clean/-",
    "cls/weight_outlier/early",
    "cls/act_outlier_offset/early",
    "cls/clipping/early",
    "cls/backend_divergence/early",
)
# the component folders each algorithm's runs are in (one rerun leaves the others' in place)
RUN_DIRS = {
    "oneshot": ["framework_diagnosis", "inference_engine", "verification"],
    "layerwise": ["layerwise_snooping"],
    "cumulative": ["cumulative_layerwise_snooping"],
}


@dataclass
class Case:
    fault: zoo_plant.Fault
    folder: Path
    model_path: Path
    overrides: Path | None
    fingerprint: str = ""  # of the planted model and overrides: cached results must match

    @property
    def name(self) -> str:
        return self.fault.case


def case_names(models: list[str], kinds: list[str], every_case: bool = False) -> list[str]:
    """model/kind/depth names. A ``slow`` model (PP-OCR rec: 3x the time of the others per
    run) gets every kind at mid depth only by default, plus its pointwise (early) and dense
    (late) weight outliers; ``every_case`` adds its other early and late cases."""
    out = []
    for m in models:
        for k in kinds:
            for d in ["-"] if k == "clean" else list(zoo_plant.DEPTHS):
                if (
                    zoo_models.EVERY_MODEL[m].slow
                    and not every_case
                    and d in ("early", "late")
                    and k != "weight_outlier"
                ):
                    continue
                out.append(f"{m}/{k}/{d}")
    return out


# the code a planting depends on: a cached planting is reused only while none of it changed
PLANTING_CODE = (
    "plant.py",
    "edits.py",
    "graph.py",
    "harm.py",
    "probe.py",
    "inputs.py",
    "models.py",
)
PLANTINGS_FILE = "plantings.json"


class Plantings:
    """What each case's planting came to, cached per prepared model (``plantings.json`` in its
    folder): the case folder and its fingerprint, or why it was left out, and the site it holds.
    Planting a case costs tens of seconds (float probes, the harm gate's QNN runs); a cached
    one is taken as it is when the prepared model, the planting code, the seed, the gate and
    the sites the other depths of its kind hold are the same."""

    def __init__(self, folder: Path, model: onnx.ModelProto, seed: int, gate: bool):
        self.path = folder / PLANTINGS_FILE
        digest = hashlib.sha1(model.SerializeToString())
        for name in PLANTING_CODE:
            digest.update((Path(__file__).parent / name).read_bytes())
        self._base = f"{digest.hexdigest()[:16]}:{seed}:{int(gate)}"
        try:
            self._known: dict[str, dict] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self._known = {}

    def key(self, name: str, taken: set[str]) -> str:
        return f"{self._base}:{name}:{','.join(sorted(taken))}"

    def get(self, key: str) -> dict | None:
        entry = self._known.get(key)
        if entry is None or not entry.get("folder"):
            return entry
        folder = Path(os.path.normpath(self.path.parent / entry["folder"]))  # relative to it
        try:
            model = (folder / "model.onnx").read_bytes()
            record = json.loads((folder / "fault.json").read_text())
        except (OSError, ValueError):
            return None
        if hashlib.sha1(model).hexdigest() != entry["model_sha1"]:
            return None
        return entry | {"folder": str(folder), "record": record}

    def put(self, key: str, entry: dict) -> None:
        """Keep a fresh planting's entry (its fault record stays in its folder's fault.json)."""
        kept = {k: v for k, v in entry.items() if k != "record"}
        if kept.get("folder"):
            kept["folder"] = os.path.relpath(kept["folder"], self.path.parent)
        self._known[key] = kept
        self.path.write_text(json.dumps(self._known, indent=1))


def _fault(record: dict) -> zoo_plant.Fault:
    names = {f.name for f in fields(zoo_plant.Fault)}
    return zoo_plant.Fault(**{k: v for k, v in record.items() if k in names})


def build_cases(
    wanted: list[str], out: Path, seed: int = 0, gate: bool = True
) -> tuple[list[Case], list[tuple[str, str]]]:
    """Plant every wanted case; returns the cases and (case, why) of those left out. With
    ``gate``, a planting must cost the quantized outputs on QNN :data:`~benchmarks.zoo.harm.
    HARM_DB` or more (made stronger, or moved, until it does; see :mod:`benchmarks.zoo.harm`);
    without it every planting is kept at its drawn strength, felt or not. Plantings are reused
    from :class:`Plantings` when nothing they depend on changed."""
    cases: list[Case] = []
    dropped: list[tuple[str, str]] = []
    by_model: dict[str, list[str]] = {}
    for name in wanted:
        by_model.setdefault(name.split("/")[0], []).append(name)
    for model_name, names in by_model.items():
        spec = zoo_models.EVERY_MODEL[model_name]
        try:
            prep = zoo_models.prepare(spec, out / "models")
        except (zoo_models.ZooSetupError, AccdbgError) as exc:  # the other models still run
            why = str(exc).splitlines()[0]
            dropped += [(name, f"the model could not be prepared: {why}") for name in names]
            continue
        cache = Plantings(out / "models" / spec.name, prep.model, seed, gate)
        planter = _Planter(model_name, spec, prep, seed, gate)
        taken: dict[str, set[str]] = {}  # kind -> the sites its other depths hold
        for name in names:
            _, kind, depth = name.split("/")
            key = cache.key(name, taken.get(kind, set()))
            entry = cache.get(key)
            if entry is None:
                entry = planter.plant(name, kind, depth, taken.get(kind, set()), out)
                cache.put(key, entry)
            if entry.get("site"):
                taken.setdefault(kind, set()).add(entry["site"])
            if entry.get("dropped"):
                dropped.append((name, entry["dropped"]))
                continue
            folder = Path(entry["folder"])
            fault = _fault(entry["record"])
            overrides = folder / "overrides.encodings" if fault.overrides else None
            cases.append(
                Case(fault, folder, folder / "model.onnx", overrides, entry["fingerprint"])
            )
    return cases, dropped


@dataclass
class _Planter:
    """Plants one model's cases; its float probe and harm meter are made at the first planting
    the cache does not hold."""

    model_name: str
    spec: zoo_models.ModelSpec
    prep: zoo_models.Prepared
    seed: int
    gate: bool
    _tools: tuple | None = None

    def _probe_and_meter(self) -> tuple:
        if self._tools is None:
            feeds = load_feeds(self.prep.input_paths, self.spec.input_name, self.spec.dims)
            meter = HarmMeter(self.prep, self.prep.onnx_path.parent) if self.gate else None
            self._tools = (feeds, FloatProbe(self.prep.model, feeds), meter)
        return self._tools

    def plant(self, name: str, kind: str, depth: str, taken: set[str], out: Path) -> dict:
        """One case planted and saved: the cache's entry for it."""
        feeds, probe, meter = self._probe_and_meter()
        planted = zoo_plant.plant(
            self.model_name,
            self.prep.model,
            kind,
            depth,
            probe,
            feeds,
            self.seed,
            harm=meter.loss if meter else None,
            taken=taken,
        )
        if planted is None:
            held = " left (the other depths hold the rest)" if taken else ""
            return {"dropped": f"no eligible site in this model{held}"}
        fault = planted.fault
        if kind == "clean" and meter is not None:
            fault.backend_gap_db = meter.backend_gap()
        site = zoo_plant.site_key(planted.site) if planted.site is not None else None
        if fault.excluded:
            return {"dropped": f"EXCLUDED: {fault.excluded}", "site": site}
        folder = out / "cases" / self.model_name / f"{kind}_{depth}".replace("-", "none")
        folder.mkdir(parents=True, exist_ok=True)
        data = planted.model.SerializeToString()
        (folder / "model.onnx").write_bytes(data)
        if fault.overrides:
            (folder / "overrides.encodings").write_text(json.dumps(fault.overrides, indent=1))
        record = asdict(fault) | {"notes": self.prep.notes, "input_list": str(self.prep.input_list)}
        (folder / "fault.json").write_text(json.dumps(record, indent=1, default=str))
        return {
            "folder": str(folder),
            "site": site,
            "fingerprint": fingerprint(planted.model, fault.overrides),
            "model_sha1": hashlib.sha1(data).hexdigest(),
            "record": record,
        }


def _inputs(spec: zoo_models.ModelSpec, prep_dir: Path):
    first = prep_dir / spec.name / "inputs" / "input_0.raw"
    return [zoo_models.debugged_input(spec, first)]


def oneshot_dumps(case_folder: Path) -> tuple[Path, Path]:
    """Golden and QNN (Result_0) tensor folders of a case's oneshot run."""
    w = case_folder / "w"
    return (
        _line0(w / "framework_diagnosis" / "oneshot"),
        w / "inference_engine" / "oneshot" / "output" / "Result_0",
    )


def _line0(golden: Path) -> Path:
    """The first input's golden: a run over an input list keeps one Result_N per line."""
    return golden / "Result_0" if (golden / "Result_0").is_dir() else golden


def channel_sqnr(golden: np.ndarray, target: np.ndarray) -> float:
    """Median over channels of each channel's SQNR (dB): one channel carrying a huge value (an
    outlier fault) cannot hide what the others lost, as it does in the whole tensor's SQNR."""
    g = np.asarray(golden, np.float64)
    t = np.asarray(target, np.float64).reshape(g.shape)
    if g.ndim < 2:
        return scoring.sqnr_db(g, t)
    axis = 1 if g.ndim == 4 else g.ndim - 1
    g, t = (
        np.moveaxis(g, axis, 0).reshape(g.shape[axis], -1),
        np.moveaxis(t, axis, 0).reshape(g.shape[axis], -1),
    )
    per = [scoring.sqnr_db(a, b) for a, b in zip(g, t, strict=True) if np.any(a)]
    return float(np.median(per)) if per else math.nan


def tensor_sqnrs(case_folder: Path, names: list[str], per_channel: bool) -> dict[str, float]:
    """QNN's SQNR (per tensor, or its median channel's) at ``names`` of the case's oneshot run:
    from its dumps, or from the figures kept when they were dropped (:func:`drop_tensors`)."""
    from accdbg.core.tensor_store import TensorFolder

    kept = _figures_file(case_folder)
    if kept.is_file():
        figures = json.loads(kept.read_text())["channel" if per_channel else "tensor"]
        return {n: figures[n] for n in names if n in figures}
    gdir, tdir = oneshot_dumps(case_folder)
    if not (gdir.is_dir() and tdir.is_dir()):
        return {}
    g, t = TensorFolder(gdir), TensorFolder(tdir)
    have = set(t.names()) & set(g.names())
    fn = channel_sqnr if per_channel else scoring.sqnr_db
    return {n: fn(g.load(n), t.load(n)) for n in names if n in have}


def _clean_outputs(clean_folder: Path, outputs: list[str]) -> dict[str, float]:
    """The clean case's QNN SQNR at the outputs the harm gate judges (of many values, in its
    golden dumps, which a clean case keeps; above 0 dB): :mod:`benchmarks.zoo.harm`."""
    from accdbg.core.tensor_store import TensorFolder

    sqnrs = {n: v for n, v in tensor_sqnrs(clean_folder, outputs, False).items() if v == v}
    first = oneshot_dumps(clean_folder)[0]
    lines = max(1, len(list(first.parent.glob("Result_*"))))
    golden = TensorFolder(first)
    have = set(golden.names())
    many = judged_outputs({n: golden.load(n) for n in sqnrs if n in have}, lines) or list(sqnrs)
    return {n: sqnrs[n] for n in carrying({n: sqnrs[n] for n in many})}


def _figures_file(case_folder: Path) -> Path:
    return case_folder / "harm_figures.json"


def drop_tensors(case: Case) -> None:
    """Remove a planted case's tensor dumps once its algorithms ran.

    They are GBs over a zoo (det's every tensor, golden, QNN and snooped, per input line), and
    the summary needs only a few SQNRs of them: the watched outputs' and the culprit rows' per
    channel, kept in ``harm_figures.json``. A clean case keeps its dumps: every planted case of
    its model is compared with it at its own culprit rows.
    """
    if case.fault.kind == "clean":
        return
    model = onnx.load(str(case.model_path), load_external_data=False)
    local = list(dict.fromkeys([*case.fault.culprits, *case.fault.checked]))
    figures = {
        "tensor": tensor_sqnrs(case.folder, watched_outputs(model), False),
        "channel": tensor_sqnrs(case.folder, local, True),
    }
    _figures_file(case.folder).write_text(json.dumps(figures))
    for raw in (case.folder / "w").rglob("*.raw"):
        raw.unlink()


def _min(values: dict[str, float]) -> float:
    vals = [v for v in values.values() if not math.isnan(v)]
    return min(vals) if vals else math.nan


def _result_file(case: Case, algorithm: str) -> Path:
    return case.folder / f"result_{algorithm}.json"


def _cached(case: Case, algorithm: str, rerun: bool) -> dict | None:
    """The algorithm's cached result on this very case (same planted model), if any."""
    path = _result_file(case, algorithm)
    if rerun or not path.is_file():
        return None
    row = json.loads(path.read_text())
    return row if row.get("fingerprint") == case.fingerprint else None


def run_case(
    case: Case,
    algorithms: list[str],
    out: Path,
    rerun: bool = False,
    workers: int | None = None,
    keep_tensors: bool = True,
) -> list[dict]:
    """Run the algorithms on one case; one result row per algorithm, cached in the case
    folder (``--rerun`` ignores the cache). Oneshot runs first whatever is asked: the others
    reuse its golden tensors and QDQ model (run again when its dumps were dropped). Without
    ``keep_tensors`` a planted case's dumps go once it ran (:func:`drop_tensors`)."""
    from accdbg.algorithms.cumulative import run_cumulative_layerwise
    from accdbg.algorithms.layerwise import run_layerwise
    from accdbg.algorithms.oneshot import run_oneshot

    spec = zoo_models.EVERY_MODEL[case.fault.model]
    base = {
        "case": case.name,
        "model": case.fault.model,
        "kind": case.fault.kind,
        "depth": case.fault.depth,
        "site": case.fault.site,
        "variant": case.fault.variant,
        "strength": case.fault.strength,
        "relative_depth": round(case.fault.relative_depth, 3),
        "culprits": " | ".join(case.fault.culprits),
        "checked": " | ".join(case.fault.checked),
        "detail": case.fault.detail,
        "float_change": case.fault.float_change,
        "planted_loss_db": case.fault.harm_db,
        "backend_gap_db": case.fault.backend_gap_db,
        "tries": " | ".join(case.fault.tries),
        "folder": str(case.folder),
        "fingerprint": case.fingerprint,
    }
    engine_kwargs = {"quantization_overrides": str(case.overrides)} if case.overrides else {}
    inputs = _inputs(spec, out / "models")
    input_list = out / "models" / spec.name / "input_list.txt"
    work = case.folder / "w"
    results: dict[str, dict] = {}
    cached = {a: _cached(case, a, rerun) for a in ["oneshot", *algorithms]}
    if _figures_file(case.folder).is_file() and not all(cached.values()):
        cached["oneshot"] = None  # the others need its golden tensors, which went: run it again
        _figures_file(case.folder).unlink()
    for algo in ["oneshot", *[a for a in algorithms if a != "oneshot"]]:
        if cached[algo] is not None:
            results[algo] = _rescored(case, algo, cached[algo], base)
            continue
        if algo != "oneshot" and results["oneshot"].get("status") != "ok":
            results[algo] = base | {"algorithm": algo, "status": "oneshot failed", "n_named": 0}
            continue
        # a stale run of the same name (finished, failed or killed) would be resumed
        # (snooping) or refused: start afresh
        for component in RUN_DIRS[algo]:
            for stale in [
                *(work / component).glob(algo + "*"),
                *(work / component).glob(f".{algo}*"),
            ]:
                shutil.rmtree(stale, ignore_errors=True)
        t = time.perf_counter()
        try:
            if algo == "oneshot":
                res = run_oneshot(
                    "onnx",
                    case.model_path,
                    inputs,
                    input_list=input_list,
                    engine_kwargs=engine_kwargs,
                    working_dir=work,
                    output_dirname="oneshot",
                )
                table = res.summary
            else:
                fn = run_layerwise if algo == "layerwise" else run_cumulative_layerwise
                golden, _ = oneshot_dumps(case.folder)
                qdq = next((work / "inference_engine" / "oneshot").glob("*.qdq.onnx"))
                res = fn(
                    case.model_path,
                    inputs,
                    input_list=input_list,
                    golden_dir=golden,
                    qdq_model=qdq,
                    engine_kwargs=engine_kwargs,
                    working_dir=work,
                    output_dirname=algo,
                    workers=workers,
                )
                table = res.report
            row = base | {"algorithm": algo, "status": "ok"}
            row["seconds"] = round(time.perf_counter() - t, 1)
            row |= scoring.score(algo, table, case.fault.culprits)
        except Exception as exc:  # a failing run is a result too
            row = base | _failed(algo, exc, time.perf_counter() - t)
        _result_file(case, algo).write_text(json.dumps(row, default=str))
        results[algo] = row
    if not keep_tensors and results["oneshot"].get("status") == "ok":
        drop_tensors(case)
    return [results[a] for a in algorithms]


# each algorithm's table, as its run writes it in the case folder
TABLES = {
    "oneshot": "verification/oneshot/summary.csv",
    "layerwise": "layerwise_snooping/layerwise/layerwise.csv",
    "cumulative": "cumulative_layerwise_snooping/cumulative/cumulative_layerwise.csv",
}


def _rescored(case: Case, algo: str, row: dict, base: dict) -> dict:
    """A cached result with the case's record as it is now; scored again from its table when
    the culprit set changed since it ran, or the scoring has learnt a figure since (the planted
    model did not change: the run stands)."""
    if row.get("status") != "ok" or (
        row.get("culprits") == base["culprits"] and row.get("scoring") == scoring.VERSION
    ):
        return row | base
    table = pd.read_csv(case.folder / "w" / TABLES[algo], keep_default_na=False)
    row = row | base | scoring.score(algo, table, case.fault.culprits)
    _result_file(case, algo).write_text(json.dumps(row, default=str))
    return row


def _failed(algo: str, exc: Exception, secs: float) -> dict:
    log.error("%s failed: %s", algo, "".join(traceback.format_exception_only(exc)).strip())
    return {
        "algorithm": algo,
        "status": f"error: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}",
        "seconds": round(secs, 1),
        "hit1": False,
        "hit3": False,
        "n_named": 0,
    }


HARM_COLUMNS = ("out_sqnr", "out_sqnr_clean", "out_loss_db", "local_loss_db")


def with_harm(rows: pd.DataFrame) -> pd.DataFrame:
    """Compare each case's QNN oneshot run with its model's clean case (same tensor names).

    ``out_loss_db``: SQNR the watched outputs lose (as the harm gate judges: those of many
    values the clean model keeps above 0 dB). ``local_loss_db``: the largest loss of
    median per-channel SQNR among the culprit rows and, for a compensated fault, the layers
    undoing it (whose float values are the clean model's).
    """
    rows = rows.drop(columns=[c for c in HARM_COLUMNS if c in rows.columns])
    clean = {
        r["model"]: Path(r["folder"])
        for _, r in rows[rows["kind"] == "clean"].drop_duplicates("model").iterrows()
    }
    harm: dict[str, dict] = {}
    judged: dict[str, dict[str, float]] = {}  # a model -> its clean case's judged outputs
    for _, r in rows.drop_duplicates("case").iterrows():
        folder = Path(r["folder"])
        model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        outputs = watched_outputs(model)
        local = [n for n in f"{r['culprits']} | {r['checked']}".split(" | ") if n and n != "nan"]
        local = list(dict.fromkeys(local))
        out = tensor_sqnrs(folder, outputs, False)
        h = {"out_sqnr": _min(out)}
        ref = clean.get(r["model"])
        if ref is not None:
            if r["model"] not in judged:
                judged[r["model"]] = _clean_outputs(ref, outputs)
            clean_out = judged[r["model"]]
            h["out_sqnr"] = _min({n: v for n, v in out.items() if n in clean_out})
            h["out_sqnr_clean"] = _min(clean_out)
            mine, theirs = tensor_sqnrs(folder, local, True), tensor_sqnrs(ref, local, True)
            d = [theirs[n] - v for n, v in mine.items() if n in theirs]
            d = [x for x in d if not math.isnan(x)]
            h["local_loss_db"] = max(d) if d else math.nan
        harm[r["case"]] = h
    extra = pd.DataFrame.from_dict(harm, orient="index")
    rows = rows.join(extra, on="case")
    for col in ("out_sqnr", "out_sqnr_clean", "local_loss_db"):  # no clean case run
        if col not in rows.columns:
            rows[col] = math.nan
    rows["out_loss_db"] = rows["out_sqnr_clean"] - rows["out_sqnr"]
    return rows


def default_workers(jobs: int) -> int | None:
    """QNN sessions per snooping run: share the cores between parallel cases."""
    return max(1, (os.cpu_count() or 2) // jobs) if jobs > 1 else None


def to_frame(results: list[dict]) -> pd.DataFrame:
    return scoring.with_defaults(pd.DataFrame(results))
