"""The report gallery (reports/) against what the code writes.

Its pages are copies of real runs, made by ``python reports/regenerate.py``; ``manifest.json``
records, per page, the command, the CSV columns and the HTML section headings. The slow test
runs the bundled example's oneshot afresh and compares its columns and sections with the
manifest (the same extraction the script uses): when a report's layout changes, it fails until
the gallery is regenerated. The fast ones check that every page the index and the manifest name
is there, and that the pages load their one shared plotly copy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GALLERY = REPO / "reports"


def _regenerate():
    spec = importlib.util.spec_from_file_location("reports_regenerate", GALLERY / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rg = _regenerate()


def _manifest() -> dict:
    return json.loads((GALLERY / "manifest.json").read_text(encoding="utf-8"))


def test_index_links_exist():
    index = (GALLERY / "index.html").read_text(encoding="utf-8")
    links = [t for t in map(rg.local_target, rg.html_links(index)) if t]
    assert links, "the index links no report"
    missing = [t for t in links if not (GALLERY / t).is_file()]
    assert not missing, f"index.html links pages that are not in reports/: {missing}"
    pages = {m["page"] for m in _manifest()["pages"]}
    assert set(links) == pages, "index.html and manifest.json name different pages"


def test_manifest_pages_exist_and_match_their_record():
    manifest = _manifest()
    assert manifest["pages"]
    for entry in manifest["pages"]:
        page = GALLERY / entry["page"]
        assert page.is_file(), f"{entry['id']}: {entry['page']} is missing"
        tables = [GALLERY / t for t in entry["tables"]]
        missing = [t.name for t in tables if not t.is_file()]
        assert not missing, f"{entry['id']}: tables missing: {missing}"
        layout = rg.page_layout(page, tables)
        assert layout["sections"] == entry["sections"], entry["id"]
        assert layout["columns"] == entry["columns"], entry["id"]
        assert entry["command"].startswith("qnn-accuracy-debugger ")


def test_pages_load_the_shared_plotly():
    """Offline: a page either embeds plotly or loads the gallery's one copy by a relative path."""
    assert (GALLERY / rg.PLOTLY_JS).is_file()
    for page in GALLERY.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        for src in (s.split('"', 1)[0] for s in text.split('<script src="')[1:]):
            assert "://" not in src, f"{page}: loads {src} from the network"
            assert (page.parent / src).resolve().is_file(), f"{page}: {src} not found"


@pytest.mark.slow
def test_example_oneshot_matches_the_gallery(tmp_path):
    """The bundled example's oneshot, run now: same summary.csv columns, same report sections."""
    entry = next(m for m in _manifest()["pages"] if m["id"] == "tiny_cnn/oneshot")
    report = next(r for r in rg.REPORTS if f"{r.model}/{r.algorithm}" == entry["id"])
    assert report.argv == entry["argv"], "the script's command changed: regenerate the gallery"
    work = tmp_path / "work"
    argv = rg.fill(entry["argv"], work, tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), ACCDBG_NO_PROGRESS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "accdbg.cli.main", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    page = work / report.page
    tables = [page.parent / t for t in report.tables]
    fresh = rg.page_layout(page, tables)
    assert fresh["columns"] == entry["columns"], (
        "summary.csv's columns changed: run python reports/regenerate.py"
    )
    assert fresh["sections"] == entry["sections"], (
        "summary.html's sections changed: run python reports/regenerate.py"
    )


FOLD_WIDTH, FOLD = 1280, 800  # a laptop's window: the findings must show without scrolling


@pytest.mark.slow  # headless Chromium, one page at a time
def test_every_page_opens_with_its_findings_and_never_scrolls_sideways(tmp_path):
    """Each algorithm's page of the gallery at 1280 px: its Findings heading above the fold,
    before any other section, and the page no wider than the window (tables scroll in their
    box)."""
    from tests import browser

    pages = [GALLERY / p["page"] for p in _manifest()["pages"]]
    assert len(pages) >= 10
    for page in pages:
        seen = browser.fold(page, tmp_path, FOLD_WIDTH)
        where = page.relative_to(GALLERY)
        assert seen["page"] <= seen["viewport"], (where, seen)
        assert seen["findings"] is not None and 0 <= seen["findings"] < FOLD, (where, seen)
        if seen["first_other_top"] is not None:
            assert seen["findings"] < seen["first_other_top"], (where, seen)
