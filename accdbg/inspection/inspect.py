"""Tensor inspection: golden against target, one folder of plots and samples per tensor.

For every tensor present in both folders (by name, or through a tensor mapping) the target
is brought into the golden layout (:mod:`accdbg.mapping.layout`), its min/max are set beside
the calibrated min/max of its encoding (:mod:`accdbg.inspection.encodings`) and the golden
min/max, and the verifiers score the pair. ``summary.csv`` holds one row per tensor; each
tensor's folder holds ``Histograms.png``, ``Diff_plots.png``, ``CDF_plots.png``,
``Distribution_min-max.png`` (only with an encoding), ``golden_data.csv`` and ``target_data.csv``.

Statistics and verifier scores use every value. Plots use a random sample of at most
``max_plot_points`` values and the CSVs at most ``max_csv_rows`` rows, drawn with a fixed seed
at the same element positions on both sides; each plot's subtitle and each CSV's first
(``#``) line says so. Plotting is most of the time (four PNGs per tensor, see
:mod:`accdbg.inspection.plots`), so ``workers`` processes (this one and fresh Python children,
a :class:`Workers` pool the oneshot starts ahead of time) share the tensors, largest first.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from accdbg.core.progress import Progress, progress
from accdbg.core.run_dir import RunDir, options_dict, write_json_atomic
from accdbg.core.tensor_store import MANIFEST_NAME, TensorFolder, TensorRecord, safe_relpath
from accdbg.errors import AccdbgError
from accdbg.inspection.encodings import CalibratedRange, TargetEncodings, load_target_encodings
from accdbg.mapping.layout import Alignment, reconcile
from accdbg.mapping.tensor_mapping import load_tensor_mapping, pair_tensors
from accdbg.reports.summary import write_csv
from accdbg.verifiers.base import TensorPair, Verifier, finite_range
from accdbg.verifiers.configured import one_tensor_verifier, unique_label

log = logging.getLogger("accdbg.tensor_inspection")

COMPONENT = "tensor_inspection"
DATA_TYPES = ("int8", "uint8", "int16", "uint16", "float32")
HISTOGRAMS, DIFF, CDF, DISTRIBUTION = (
    "Histograms.png",
    "Diff_plots.png",
    "CDF_plots.png",
    "Distribution_min-max.png",
)
GOLDEN_CSV, TARGET_CSV = "golden_data.csv", "target_data.csv"
TENSOR_FILES = (HISTOGRAMS, DIFF, CDF, DISTRIBUTION, GOLDEN_CSV, TARGET_CSV)
RESERVED = ("summary.csv", "log.txt", f"{COMPONENT}_options.json")
MAX_PLOT_POINTS = 20_000
MAX_CSV_ROWS = 2_000
SEED = 0
PARALLEL_FROM = 8  # fewer tensors than this are not worth starting a worker process
RESULT_RE = re.compile(r"^Result_(\d+)$")
LEADING = ["Name", "Golden_name", "LayerType", "Size", "Tensor_dims"]
RANGES = [
    "target_min",
    "target_max",
    "calibrated_min",
    "calibrated_max",
    "golden_min",
    "golden_max",
    "target_min-calibrated_min",
    "target_max-calibrated_max",
    "golden_clipped_%",
]
TRAILING = ["scale", "offset", "bitwidth", "calibrated_source", "Sampled", "Folder", "Status"]


@dataclass
class InspectionResult:
    """Where the run went and its ``summary.csv`` as a table (one row per inspected tensor)."""

    run_dir: Path
    summary: pd.DataFrame
    seconds: float


@dataclass
class Settings:
    """Everything a worker process needs besides its jobs (sent to it pickled)."""

    golden_root: Path
    target_root: Path
    data_type: str
    out_root: Path
    verifiers: list[tuple[str, Verifier]]
    max_plot_points: int
    max_csv_rows: int
    seed: int


@dataclass
class Job:
    """One tensor pair to inspect and the folder it goes to (relative to the run)."""

    order: int
    golden_name: str
    target_name: str
    folder: str
    size: int
    calibrated: CalibratedRange | None = None
    no_range: str = ""  # why there is no calibrated range ("" when there is one, or none at all)


@dataclass
class Outcome:
    order: int
    row: dict[str, Any]
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- folders and names


def resolve_tensor_dir(path: str | os.PathLike, flag: str) -> Path:
    """A tensor folder, or the single ``Result_N`` of an inference engine run / its ``output/``."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise AccdbgError(f"{flag} {str(path)!r} does not exist or is not a folder")
    p = p.absolute()
    if (p / MANIFEST_NAME).is_file():
        return p
    for base in (p / "output", p):
        results = (
            sorted(
                (c for c in base.iterdir() if c.is_dir() and RESULT_RE.match(c.name)),
                key=lambda c: int(RESULT_RE.match(c.name).group(1)),
            )
            if base.is_dir()
            else []
        )
        if len(results) == 1:
            return results[0]
        if results:
            raise AccdbgError(
                f"{flag} {str(path)!r} holds {len(results)} inference results "
                f"({', '.join(r.name for r in results[:5])}{', ...' if len(results) > 5 else ''}); "
                f"pass one of them, e.g. {results[0]}"
            )
    if next(p.rglob("*.raw"), None) is None:
        raise AccdbgError(
            f"{flag} {str(path)!r} holds no tensors (expected tensors.json or .raw files)"
        )
    return p


def open_folder(root: Path, data_type: str = "float32") -> TensorFolder:
    """A tensor folder; bare ``.raw`` files (no manifest) are read as ``data_type``."""
    folder = TensorFolder(root)
    if folder.has_manifest or data_type == "float32":
        return folder
    dtype = np.dtype(data_type)
    for name, rec in list(folder.records.items()):
        nbytes = (root / rec.file).stat().st_size
        if nbytes % dtype.itemsize:
            raise AccdbgError(
                f"{root / rec.file}: {nbytes} bytes is not a whole number of {data_type} values "
                f"(--data_type {data_type})"
            )
        folder.records[name] = TensorRecord(
            name=name,
            file=rec.file,
            dtype=data_type,
            shape=[nbytes // dtype.itemsize],
            native_dtype=data_type,
        )
    return folder


def assign_folders(names: Sequence[str]) -> dict[str, str]:
    """A folder per tensor named by :func:`safe_relpath`, clashing with nothing.

    A ``/`` in a name makes sub-folders, so a folder must not land on a file of another
    tensor (``a/Histograms.png``), nor on the run's own files, nor on another tensor's
    folder (names equal after sanitizing, or equal but for case): such a folder gets ``__N``.
    Shallow names are served first, so tensor ``a`` always gets ``a/``.
    """
    files = {f.lower() for f in RESERVED}
    owned: set[str] = set()  # tensor folders
    dirs: set[str] = set()  # every folder in use, parents included
    out: dict[str, str] = {}

    def prefixes(rel: str) -> list[str]:
        parts = rel.split("/")
        return ["/".join(parts[: i + 1]) for i in range(len(parts))]

    def clashes(rel: str) -> bool:
        low = rel.lower()
        return (
            low in owned
            or any(p in files for p in prefixes(low))
            or any(f"{low}/{f.lower()}" in dirs for f in TENSOR_FILES)
        )

    # "a" gets a/ before "a/Histograms.png" asks for a folder there
    shallow_first = sorted(names, key=lambda n: safe_relpath(n).count("/"))
    for name in shallow_first:
        base = rel = safe_relpath(name)
        n = 0
        while clashes(rel):
            n += 1
            rel = f"{base}__{n}"
        low = rel.lower()
        owned.add(low)
        dirs.update(prefixes(low))
        files.update(f"{low}/{f.lower()}" for f in TENSOR_FILES)
        out[name] = rel
    return out


def label_verifiers(specs: Sequence[Any]) -> list[tuple[str, Verifier]]:
    """Verifiers from specs, each with a unique column label (name, then name with parameters)."""
    if not specs:
        raise AccdbgError("--verifier: give at least one verifier, e.g. --verifier sqnr")
    out: list[tuple[str, Verifier]] = []
    used: set[str] = set()
    for spec in specs:
        verifier = one_tensor_verifier(
            spec,
            "--verifier",
            "; tensor inspection compares one tensor at a time: use it in --verification",
        )
        out.append((unique_label(verifier, used), verifier))
    return out


# ---------------------------------------------------------------- one tensor


def sample_indices(n: int, k: int, seed: int) -> np.ndarray | None:
    """Sorted positions of a uniform sample of ``k`` of ``n`` elements; None means all."""
    if n <= k:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


def sample_note(n: int, idx: np.ndarray | None, seed: int) -> str:
    if idx is None:
        return f"all {n:,} values"
    return f"random sample: {idx.size:,} of {n:,} values, seed {seed}"


def write_values_csv(path: Path, values: np.ndarray, idx: np.ndarray | None, header: str) -> None:
    """``index,value`` rows (flat C-order index), after one ``#`` line saying what they are."""
    index = np.arange(values.size) if idx is None else idx
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(f"# {header}\n")
        pd.DataFrame({"index": index, "value": values if idx is None else values[idx]}).to_csv(
            fh, index=False
        )


def _align(
    golden: TensorFolder, target: TensorFolder, g: TensorRecord, t: TensorRecord
) -> Alignment:
    """How the target maps onto the golden (:func:`reconcile`), when shapes are unknown too.

    A bare ``.raw`` golden has no shape: it is taken in the target's. A bare target against
    a shaped golden is not compared element-wise (QNN may have dumped it channel-last), as
    in verification.
    """
    gs, ts = tuple(g.shape), tuple(t.shape)
    if not golden.has_manifest and g.size == t.size:
        return Alignment("reshape", ts, ts, None, "golden shape unknown (bare .raw): the target's")
    if not target.has_manifest and len([d for d in gs if d != 1]) > 1:
        note = (
            f"target shape unknown (bare .raw, {t.size} values) for golden {list(gs)}: not compared"
        )
        return Alignment("mismatch", gs, ts, None, note)
    return reconcile(gs, ts, g.layout, t.layout)


_FOLDERS: dict[tuple[str, str], TensorFolder] = {}
_PLOTTER = None


def _folder(root: Path, data_type: str) -> TensorFolder:
    key = (str(root), data_type)
    if key not in _FOLDERS:
        _FOLDERS[key] = open_folder(root, data_type)
    return _FOLDERS[key]


def _plotter():
    global _PLOTTER
    if _PLOTTER is None:
        from accdbg.inspection.plots import Plotter  # matplotlib loads only when plotting

        _PLOTTER = Plotter()
    return _PLOTTER


def inspect_tensor(settings: Settings, job: Job) -> Outcome:
    """Statistics, verifier scores, plots and CSVs of one pair; never raises on bad data."""
    golden = _folder(settings.golden_root, "float32")
    target = _folder(settings.target_root, settings.data_type)
    g_rec, t_rec = golden.records[job.golden_name], target.records[job.target_name]
    cal = job.calibrated
    row: dict[str, Any] = {
        "Name": job.target_name,
        "Golden_name": job.golden_name,
        "LayerType": g_rec.op_type or t_rec.op_type,
        "Size": t_rec.size,
        "Tensor_dims": list(t_rec.shape),
        **dict.fromkeys(RANGES, math.nan),
        **{label: math.nan for label, _ in settings.verifiers},
        "scale": cal.scale if cal else math.nan,
        "offset": cal.offset if cal else math.nan,
        "bitwidth": cal.bitwidth if cal else None,
        "calibrated_source": cal.source if cal else "",
        "Sampled": "",
        "Folder": job.folder,
        "Status": "ok",
    }
    if cal:
        row["calibrated_min"], row["calibrated_max"] = cal.min, cal.max
    notes: list[str] = []
    out_dir = settings.out_root / job.folder
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        g_arr = golden.load(job.golden_name, mmap=False).reshape(-1)
        t_raw = target.load(job.target_name, mmap=False)
    except AccdbgError as exc:
        row["Status"] = f"unreadable: {exc}"
        return Outcome(job.order, row)

    t_what = f"target tensor {list(t_rec.shape)} {t_raw.dtype}"
    if np.issubdtype(t_raw.dtype, np.integer):
        if cal is not None and cal.scale is not None:
            t_raw = cal.dequantize(t_raw)
            t_what += f" dequantized with scale {cal.scale:.6g} offset {cal.offset:g}"
            notes.append(
                f"integer target dequantized with its encoding (scale {cal.scale:.6g}, offset {cal.offset:g})"
            )
        else:
            notes.append(
                "integer target compared as stored (no per-tensor encoding to dequantize it)"
            )
    alignment = _align(golden, target, g_rec, t_rec)
    if alignment.ok:
        t_arr = alignment.apply(t_raw).reshape(-1)
        if alignment.kind == "transpose":
            t_what += f", {alignment.note}, in the golden layout {list(alignment.golden_shape)}"
    else:
        t_arr = np.asarray(t_raw).reshape(-1)
        notes.append(alignment.note)

    row["golden_min"], row["golden_max"] = finite_range(g_arr)
    row["target_min"], row["target_max"] = finite_range(t_arr)
    if cal:
        row["target_min-calibrated_min"] = row["target_min"] - cal.min
        row["target_max-calibrated_max"] = row["target_max"] - cal.max
        tol = 0.5 * cal.scale if cal.scale else 0.0
        finite = _finite(g_arr)
        if finite.size:
            clipped = np.count_nonzero((finite < cal.min - tol) | (finite > cal.max + tol))
            row["golden_clipped_%"] = 100.0 * clipped / finite.size
    if alignment.ok:
        pair = TensorPair(g_arr, t_arr, cal.scale if cal and cal.scale else None)
        for label, verifier in settings.verifiers:
            res = verifier.verify(pair)
            row[label] = res.value
            if res.status != "ok":
                notes.append(f"{label}: {res.status}")
        del pair

    _draw(settings, job, out_dir, g_arr, t_arr, alignment, t_what, row, notes)
    if notes:
        row["Status"] = "; ".join(dict.fromkeys(notes))
    return Outcome(job.order, row, notes)


def _finite(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values if np.isfinite(values).all() else values[np.isfinite(values)]


def _draw(settings, job, out_dir, g_arr, t_arr, alignment, t_what, row, notes) -> None:
    """The plots and the CSVs of one pair, from samples."""
    seed = settings.seed
    n_g, n_t = g_arr.size, t_arr.size
    g_idx = sample_indices(n_g, settings.max_plot_points, seed)
    t_idx = g_idx if alignment.ok else sample_indices(n_t, settings.max_plot_points, seed)
    g_s = g_arr if g_idx is None else g_arr[g_idx]
    t_s = t_arr if t_idx is None else t_arr[t_idx]
    note = sample_note(n_g, g_idx, seed)
    row["Sampled"] = "all" if g_idx is None else f"{g_idx.size} of {n_g}"
    g_fin, t_fin = _finite(g_s), _finite(t_s)
    plotter = _plotter() if (g_fin.size and t_fin.size) else None
    name = job.target_name
    if plotter is None:
        notes.append("no finite values on one side: plots skipped")
    else:
        cal = job.calibrated
        ranges = (row["target_min"], row["target_max"], cal.min, cal.max) if cal else ()
        lo, hi = plotter.value_span(
            g_fin, t_fin, extra=tuple(v for v in ranges if math.isfinite(v))
        )
        panels = {
            HISTOGRAMS: plotter.histograms.update(g_fin, t_fin, lo, hi),
            CDF: plotter.cdf.update(g_fin, t_fin, lo, hi),
        }
        if alignment.ok:
            both = np.isfinite(g_s) & np.isfinite(t_s)
            index = np.arange(n_g) if g_idx is None else g_idx
            g_p, t_p = np.asarray(g_s, np.float64)[both], np.asarray(t_s, np.float64)[both]
            if g_p.size:
                half_step = 0.5 * cal.scale if cal and cal.scale else None
                panels[DIFF] = plotter.diff.update(g_p, t_p, index[both], half_step)
        else:
            notes.append(f"{DIFF} skipped (not compared element-wise)")
            note = f"golden: {note}; target: {sample_note(n_t, t_idx, seed)}"
        if cal is not None:
            panels[DISTRIBUTION] = plotter.distribution.update(
                t_fin, ranges[:2], ranges[2:], lo, hi
            )
        elif job.no_range:
            notes.append(f"{DISTRIBUTION} skipped: {job.no_range}")
        plotter.save(out_dir, name, note, panels)

    c_idx = sample_indices(n_g, settings.max_csv_rows, seed)
    how = sample_note(n_g, c_idx, seed)
    if c_idx is not None:
        how += f"; at most {settings.max_csv_rows:,} rows, without replacement, in index order"
    write_values_csv(
        out_dir / GOLDEN_CSV,
        g_arr,
        c_idx,
        f"golden tensor {list(alignment.golden_shape)} {g_arr.dtype}; "
        f"index = flat C-order element index; {how}",
    )
    if not alignment.ok:
        c_idx = sample_indices(n_t, settings.max_csv_rows, seed)
        how = sample_note(n_t, c_idx, seed)
    write_values_csv(
        out_dir / TARGET_CSV,
        t_arr,
        c_idx,
        f"{t_what}; index = flat C-order element index"
        f"{' (same positions as golden_data.csv)' if alignment.ok else ''}; {how}",
    )


def _claim(claims: Path | None, job: Job) -> bool:
    """True for the one process that creates ``claims/<order>`` first (atomic on every OS)."""
    if claims is None:
        return True
    try:
        os.close(os.open(claims / str(job.order), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _claimed(claims: Path) -> int:
    """How many tensors the processes sharing ``claims`` have started."""
    try:
        return len(os.listdir(claims))
    except OSError:  # removed with the pool
        return 0


def _run_shard(
    settings: Settings, jobs: list[Job], claims: Path | None = None, show_progress: bool = False
) -> list[Outcome]:
    """Inspect the jobs this process claims (all of them without ``claims``); the run's
    "tensor inspection: N tensors in S s" line ends the stage."""
    items = (
        progress(jobs, "tensor inspection", unit="tensors", line=False) if show_progress else jobs
    )
    return [inspect_tensor(settings, job) for job in items if _claim(claims, job)]


class Workers:
    """Child processes for tensor inspection, started before there is work for them.

    A fresh Python spends about a second importing pandas and matplotlib and setting up its
    plots. The oneshot starts its inspection workers before the inference engine, so that
    second passes while QNN runs; :func:`run_tensor_inspection` then hands them the jobs.
    One pool serves one inspection; leaving the ``with`` block stops children still waiting.
    """

    def __init__(self, count: int | None = None):
        from accdbg.core.isolate import Isolated  # a fresh Python per child: no inherited threads

        if count is None:
            count = min(2, os.cpu_count() or 1) - 1
        self._tmp = tempfile.TemporaryDirectory(prefix="accdbg-inspection-")
        self.folder = Path(self._tmp.name)
        (self.folder / "claims").mkdir()
        self._children = [
            Isolated.prestart(  # not shown: the parent's bar counts every process's tensors
                f"{__name__}:_plotter",
                what="inspecting tensors",
                who="an inspection worker",
                shown=False,
            )
            for _ in range(count)
        ]
        self._used = False

    def __len__(self) -> int:
        return len(self._children)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for child in self._children:
            child.kill()
        self._tmp.cleanup()

    def run(self, settings: Settings, jobs: list[Job]) -> list[Outcome]:
        """Share the jobs, largest first, between this process and the children.

        Every process walks the same list and takes the next job nobody has claimed, so a
        child that starts late or gets the big tensors does not leave the others waiting.
        A job lost with a failed child is done here afterwards.
        """
        if self._used:
            raise RuntimeError("a Workers pool serves one tensor inspection")
        self._used = True
        by_size = sorted(jobs, key=lambda j: -j.size)
        started = time.perf_counter()
        claims = self.folder / "claims"
        for child in self._children:
            child.submit(_run_shard, settings, by_size, claims)
        # every process claims a tensor as it starts it: the claims are the count
        bar = Progress(
            "tensor inspection", len(jobs), "tensors", line=False, count=lambda: _claimed(claims)
        )
        with bar:
            try:
                outcomes = _run_shard(settings, by_size, claims)
            except BaseException:
                self.close()
                raise
            mine = len(outcomes)
            for child in self._children:
                try:
                    outcomes += child.result()
                except (AccdbgError, RuntimeError) as exc:
                    log.warning("a tensor inspection worker process failed: %s", exc)
        log.debug(
            "%d of %d tensors inspected in this process, the rest in %d workers; %.1f s",
            mine,
            len(jobs),
            len(self),
            time.perf_counter() - started,
        )
        done = {o.order for o in outcomes}
        missing = [job for job in jobs if job.order not in done]
        if missing:
            log.warning("inspecting here the %d tensors a failed worker left", len(missing))
            outcomes += _run_shard(settings, missing, show_progress=True)
        return sorted(outcomes, key=lambda o: o.order)


def _execute(settings: Settings, jobs: list[Job], workers: int | Workers) -> list[Outcome]:
    """Run the jobs here, or shared with ``workers - 1`` children, or with a started pool."""
    if isinstance(workers, Workers):
        return workers.run(settings, jobs)
    if workers <= 1 or len(jobs) < 2:
        return sorted(_run_shard(settings, jobs, show_progress=True), key=lambda o: o.order)
    with Workers(workers - 1) as pool:
        return pool.run(settings, jobs)


# ---------------------------------------------------------------- the component


def _pairs(
    golden: TensorFolder,
    target: TensorFolder,
    tensor_mapping: str | os.PathLike | Mapping[str, str | None] | None,
    names: Sequence[str] | None,
) -> list[tuple[str, str]]:
    mapping = None
    if isinstance(tensor_mapping, Mapping):
        mapping = dict(tensor_mapping)
    elif tensor_mapping is not None:
        mapping = load_tensor_mapping(tensor_mapping)
    pairing = pair_tensors(golden.names(), target.names(), mapping)
    pairs = [(g, t) for g, t in pairing.pairs if g is not None and t is not None]
    if not pairs:
        raise AccdbgError(
            f"no tensor of --target_data {str(target.root)!r} has the name of one of --golden_data "
            f"{str(golden.root)!r}" + (" (nor through the tensor mapping)" if mapping else "")
        )
    ignored = len(golden) + len(target) - 2 * len(pairs)
    if ignored:
        log.info("%d tensors are in only one of the folders and are not inspected", ignored)
    if names is not None:
        known = {n for pair in pairs for n in pair}
        for name in names:
            if name not in known:
                near = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
                raise AccdbgError(
                    f"tensor {name!r} is not in both --golden_data and --target_data"
                    + (f"; near matches: {', '.join(near)}" if near else "")
                )
        wanted = set(names)
        pairs = [(g, t) for g, t in pairs if g in wanted or t in wanted]

    def order(pair: tuple[str, str]) -> tuple:
        index = golden.records[pair[0]].index
        return (index is None, index if index is not None else 0, pair[0])

    return sorted(pairs, key=order)


def _jobs(
    pairs, golden: TensorFolder, target: TensorFolder, encodings: TargetEncodings
) -> list[Job]:
    folders = assign_folders([t for _, t in pairs])
    jobs = []
    for i, (g, t) in enumerate(pairs):
        cal = encodings.get(t)
        if cal is not None:
            why = ""
        elif not encodings.ranges and not encodings.notes:
            why = ""  # no encodings at all: said once in the log
        else:
            why = (
                encodings.notes.get(t)
                or encodings.notes.get(g)
                or f"no encoding for this tensor in the {encodings.source}"
            )
        jobs.append(
            Job(i, g, t, folders[t], max(golden.records[g].size, target.records[t].size), cal, why)
        )
    return jobs


def run_tensor_inspection(
    golden_data: str | os.PathLike,
    target_data: str | os.PathLike,
    verifiers: Sequence[str | Sequence[str] | Verifier] = ("sqnr",),
    data_type: str = "float32",
    target_encodings: str | os.PathLike | None = None,
    working_dir: str | os.PathLike = "working_directory",
    output_dirname: str | None = None,
    tensor_mapping: str | os.PathLike | Mapping[str, str | None] | None = None,
    out_dir: str | os.PathLike | None = None,
    names: Sequence[str] | None = None,
    max_plot_points: int = MAX_PLOT_POINTS,
    max_csv_rows: int = MAX_CSV_ROWS,
    seed: int = SEED,
    workers: int | Workers | None = None,
    options_record: dict | None = None,
) -> InspectionResult:
    """Inspect every tensor found in both folders; write ``<working_dir>/tensor_inspection/<run>/``
    (or ``out_dir``, e.g. a verification run's ``tensor_inspection/``).

    ``golden_data``/``target_data`` are tensor folders (with or without ``tensors.json``) or an
    inference engine run holding a single ``Result_N``. ``data_type`` is how bare target
    ``.raw`` files are read; integer data is dequantized with its encoding when there is one.
    ``target_encodings`` is an AIMET encodings file or a QNN ``model_net.json``; without it the
    target manifest's encodings are used. ``names`` restricts the run to those tensors.
    ``workers`` processes share the work (default: 2 when there are enough tensors), or a
    :class:`Workers` pool started earlier does.
    """
    start = time.perf_counter()
    if data_type not in DATA_TYPES:
        raise AccdbgError(f"--data_type {data_type!r} is not one of {', '.join(DATA_TYPES)}")
    for flag, value in (
        ("--max_plot_points", max_plot_points),
        ("--max_csv_rows", max_csv_rows),
        ("--workers", workers if isinstance(workers, int) else 1),
    ):
        if int(value) < 1:
            raise AccdbgError(f"{flag} must be at least 1, got {value}")
    labelled = label_verifiers(list(verifiers))
    golden_root = resolve_tensor_dir(golden_data, "--golden_data")
    target_root = resolve_tensor_dir(target_data, "--target_data")
    golden = open_folder(golden_root)
    target = open_folder(target_root, data_type)
    pairs = _pairs(golden, target, tensor_mapping, names)
    encodings = load_target_encodings(target_encodings, {t: target.records[t] for _, t in pairs})
    jobs = _jobs(pairs, golden, target, encodings)
    if workers is None:
        workers = min(2, os.cpu_count() or 1) if len(jobs) >= PARALLEL_FROM else 1
    options = options_record or options_dict(
        golden_data=golden_data,
        target_data=target_data,
        verifier=[label for label, _ in labelled],
        data_type=data_type,
        target_encodings=target_encodings or None,
        tensor_mapping=tensor_mapping,
        max_plot_points=max_plot_points,
        max_csv_rows=max_csv_rows,
        seed=seed,
        workers=len(workers) + 1 if isinstance(workers, Workers) else workers,
    )

    def body(out_root: Path) -> pd.DataFrame:
        log.info(
            "tensor inspection: %d tensors of %s against %s", len(jobs), target_root, golden_root
        )
        with_range = sum(1 for j in jobs if j.calibrated is not None)
        if not with_range:
            what = (
                f"--target_encodings {str(target_encodings)!r}"
                if target_encodings
                else "the target's tensors.json"
            )
            log.info(
                "no calibrated ranges (%s holds no encoding for these tensors): %s is skipped and the "
                "calibrated columns stay empty",
                what,
                DISTRIBUTION,
            )
        else:
            log.info(
                "calibrated ranges from %s for %d of %d tensors",
                encodings.source,
                with_range,
                len(jobs),
            )
        settings = Settings(
            golden_root,
            target_root,
            data_type,
            out_root,
            labelled,
            int(max_plot_points),
            int(max_csv_rows),
            int(seed),
        )
        outcomes = _execute(settings, jobs, workers)
        for outcome in outcomes:
            if outcome.notes:
                log.debug("%s: %s", outcome.row["Name"], "; ".join(outcome.notes))
        columns = LEADING + RANGES + [label for label, _ in labelled] + TRAILING
        df = pd.DataFrame([o.row for o in outcomes], columns=columns)
        write_csv(df, out_root / "summary.csv")
        return df

    if out_dir is not None:
        root = Path(out_dir).expanduser().absolute()
        if (root / "summary.csv").exists():
            raise AccdbgError(
                f"{str(root)!r} already holds a tensor inspection (summary.csv); choose another folder"
            )
        root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(root / f"{COMPONENT}_options.json", options)
        summary = body(root)
        run_dir = root
    else:
        with RunDir(working_dir, COMPONENT, output_dirname) as run:
            run.write_options(options)
            summary = body(run.path)
        run_dir = run.path
    seconds = time.perf_counter() - start
    log.info("tensor inspection: %d tensors in %.1f s -> %s", len(summary), seconds, run_dir)
    return InspectionResult(run_dir, summary, seconds)
