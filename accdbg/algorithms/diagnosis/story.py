"""One story across algorithms: a run's culprit #1 beside the other algorithms' on the same
model and inputs.

Oneshot-layerwise, layerwise, cumulative-layerwise, binary snooping and dataset mode measure
different things (what a layer costs the outputs in the whole model, a layer alone from golden
inputs, the error as it accumulates, a subgraph's share, the list as a whole); they may name
different layers first. Each run records its verdict (``verdict.json`` in its run folder: the
model's and the inputs' digests, its culprits); a run that finds the latest run of another
algorithm on the same model and inputs says whether they agree, and when not, why each sees
what it sees and what QNN measured of each one's fix.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from accdbg.algorithms.diagnosis.culprit import Culprit
from accdbg.core.provenance import file_digest
from accdbg.core.run_dir import write_json_atomic
from accdbg.errors import AccdbgError

log = logging.getLogger("accdbg.diagnosis")

VERDICT = "verdict.json"
FORMAT = "accdbg-verdict-1"
# what each algorithm measures, said when two name different layers first
SEES = {
    "oneshot-layerwise": "oneshot-layerwise measures what each layer's encodings cost the "
    "outputs in the whole quantized model",
    "layerwise": "layerwise runs each layer alone on the backend from golden inputs: it sees "
    "the layer's own error, not what the model carries to the outputs",
    "cumulative-layerwise": "cumulative-layerwise quantizes the model up to each layer: it "
    "sees where the error starts to accumulate",
    "binary": "binary snooping names the subgraph whose quantization alone costs half the "
    "outputs' error",
    "dataset": "dataset mode ranks over every input of the list, not the worst one alone",
}


@dataclass(frozen=True)
class Verdict:
    """One run's culprits, with what identifies the model and inputs it debugged."""

    algorithm: str
    run_dir: Path
    model: str  # the model file's digest
    inputs: tuple[str, ...]  # the input files' digests, sorted
    culprits: tuple[Culprit, ...]

    @property
    def first(self) -> Culprit | None:
        return self.culprits[0] if self.culprits else None


def identity(model_path: str | Path, input_files: Iterable[str | Path]) -> tuple[str, tuple]:
    """The digests that say two runs debugged the same model on the same inputs."""
    files = sorted({file_digest(p) for p in input_files if Path(p).is_file()})
    return file_digest(model_path), tuple(files)


def input_files(input_list, input_tensors) -> list[Path]:
    """The files a run debugs: every line of the input list, else the ``-i`` files."""
    if input_list is not None:
        from accdbg.core.inputs import parse_input_list

        return [p for e in parse_input_list(input_list).entries for _, p in e.items]
    return [t.path for t in input_tensors]


def feed_files(feeds) -> list[Path]:
    """The files of an engine's feeds (one dict per inference: name -> (path, ...))."""
    return [Path(p) for f in feeds for (p, *_) in f.values()]


def record(verdict: Verdict, folder: Path) -> None:
    """``verdict.json`` in the run folder being written."""
    write_json_atomic(
        folder / VERDICT,
        {
            "format": FORMAT,
            "algorithm": verdict.algorithm,
            "model": verdict.model,
            "inputs": list(verdict.inputs),
            "culprits": [c.as_dict() for c in verdict.culprits],
        },
    )


def _read(path: Path) -> Verdict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") != FORMAT:
            return None
        return Verdict(
            str(doc["algorithm"]),
            path.parent.resolve(),
            str(doc["model"]),
            tuple(doc["inputs"]),
            tuple(Culprit.from_dict(c) for c in doc["culprits"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an unreadable or older verdict is no story


def others(working_dir: str | Path, mine: Verdict) -> list[Verdict]:
    """The latest verdict of each other algorithm in the working folder on the same model and
    inputs (each component's ``latest`` run)."""
    found = []
    for path in sorted(Path(working_dir).glob(f"*/latest/{VERDICT}")):
        v = _read(path)
        if v is None or v.algorithm == mine.algorithm or v.run_dir == mine.run_dir:
            continue
        if (v.model, v.inputs) == (mine.model, mine.inputs):
            found.append(v)
    return found


def _gain(c: Culprit) -> str:
    v = c.verified
    if v is None or not v.fix or not math.isfinite(v.gain_db):
        return ""
    return f"{c.name}'s fix ({v.fix}) {v.gain_db:+.1f} dB"


def lines(mine: Verdict, seen: Sequence[Verdict]) -> list[str]:
    """One finding per other algorithm: the same culprit #1, or why the two differ and what QNN
    measured of each one's fix."""
    out = []
    for other in seen:
        a, b = mine.first, other.first
        where = f"{other.algorithm} ({other.run_dir.name})"
        if a is None and b is None:
            out.append(f"one story: {where} names no culprit either")
        elif a is not None and b is not None and a.name == b.name:
            out.append(f"one story: {where} names the same culprit #1, {a.name}")
        else:
            theirs = b.name if b is not None else "no culprit"
            ours = a.name if a is not None else "none"
            why = "; ".join(SEES[x] for x in (mine.algorithm, other.algorithm) if x in SEES)
            gains = [g for g in (_gain(c) for c in (a, b) if c is not None) if g]
            measured = f"; measured on QNN HTP: {', '.join(gains)}" if gains else ""
            out.append(
                f"{where} named {theirs} as culprit #1, this run names {ours}: {why}{measured}"
            )
    return out


def tell(
    algorithm: str,
    run_dir: Path,
    working_dir: str | Path,
    model_path: str | Path,
    files: Iterable[str | Path],
    culprits: Sequence[Culprit],
) -> list[str]:
    """Record this run's verdict and return the lines comparing it with the others'. Never a
    run's failure: a verdict it cannot record or read is no story (logged)."""
    try:
        model, inputs = identity(model_path, files)
        mine = Verdict(algorithm, Path(run_dir).resolve(), model, inputs, tuple(culprits))
        record(mine, Path(run_dir))
        return lines(mine, others(working_dir, mine))
    except (OSError, AccdbgError) as exc:
        log.info("no comparison with the other algorithms' verdicts: %s", exc)
        return []


def before_fix(findings: list[str], told: Sequence[str]) -> list[str]:
    """The findings with the story's lines before the last one when that is the fix (the
    last finding is what to do)."""
    last = findings[-1] if findings else ""
    if last.startswith(("fix: ", "no single change measured")):
        return [*findings[:-1], *told, last]
    return [*findings, *told]
