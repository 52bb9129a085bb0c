"""A run's overlays written and linked from its report pages ("On the graph": each file and
the one command that opens them)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from accdbg.core.run_dir import write_bytes_atomic
from accdbg.errors import AccdbgError
from accdbg.reports.cells import escape
from accdbg.reports.model_explorer.overlays import (
    Overlays,
    Score,
    log,
    view_command,
    write_overlays,
)


def overlay_run(
    run_dir: str | Path,
    pages: Sequence[str | Path],
    source_model: str | Path | None,
    table: pd.DataFrame,
    name_col: str,
    scores: Mapping[str, Score],
    **kwargs: Any,
) -> Overlays | None:
    """:func:`write_overlays` for a finished run, linked from its report ``pages``.

    The overlays are a view: a model the adapter cannot read or no source model is a
    warning, never a failed run.
    """
    if source_model is None:
        log.info("model explorer overlays: no source ONNX model known for %s; skipped", run_dir)
        return None
    try:
        overlays = write_overlays(run_dir, source_model, table, name_col, scores, **kwargs)
    except AccdbgError as exc:
        log.warning("model explorer overlays not written: %s", exc)
        return None
    for page in pages:
        if Path(page).is_file():
            add_links(page, overlays)
    return overlays


def links_html(overlays: Overlays, page_dir: str | Path) -> str:
    """The report's section: each file linked (relative to the page) and the one command
    that opens them on the graph."""
    rel = Path(overlays.folder).relative_to(Path(page_dir))
    items = ", ".join(
        f'<a href="{escape((rel / f["file"]).as_posix())}">{escape(f["name"])}</a>'
        for f in overlays.files
    )
    cmd = view_command(overlays.final_dir or overlays.folder.parent)
    notes = "".join(f"<p>Not on any node: {escape(n)}</p>" for n in overlays.notes)
    return (
        '<section class="model-explorer" id="model-explorer"><h2>On the graph</h2>'
        f"<p>Model Explorer overlays of {escape(overlays.model.name)}: {items or 'none'}. Open "
        f"them on the model (local server, offline):</p><pre><code>{escape(cmd)}</code></pre>"
        f"{notes}</section>"
    )


def add_links(page: str | Path, overlays: Overlays) -> None:
    """Put :func:`links_html` into a written report page: after its findings, else before
    the chart, else after the title."""
    page = Path(page)
    text = page.read_text(encoding="utf-8")
    text = re.sub(r'<section class="model-explorer".*?</section>', "", text, flags=re.S)
    section = links_html(overlays, page.parent)
    found = re.search(r'<section class="findings".*?</section>', text, flags=re.S)
    if found:  # the findings lead every page; the graph's links come after them
        text = text[: found.end()] + section + text[found.end() :]
    else:
        for anchor, before in (('<section class="chart">', True), ("</h1>", False)):
            if anchor in text:
                i = text.index(anchor) + (0 if before else len(anchor))
                text = text[:i] + section + text[i:]
                break
    write_bytes_atomic(page, text.encode("utf-8"))
