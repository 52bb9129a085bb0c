"""Which folders verification compares: the ``Result_N`` folders of the golden and of the
target, which golden each target result goes with, and the refusal to compare dumps of
different inputs; also the side files an engine run left beside its results.

Its own module because it is settled before a single tensor is read, and other components
(oneshot, snooping) find an engine run's results the same way.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from accdbg.core.provenance import describe_inputs, input_files, recorded_inputs, same_inputs
from accdbg.core.tensor_store import MANIFEST_NAME, TensorFolder
from accdbg.errors import AccdbgError

RESULT_RE = re.compile(r"^Result_(\d+)$")


def _result_folders(folder: Path) -> list[Path]:
    found = [c for c in folder.iterdir() if c.is_dir() and RESULT_RE.match(c.name)]
    return sorted(found, key=lambda c: int(RESULT_RE.match(c.name).group(1)))


def _has_tensors(folder: Path) -> bool:
    return (folder / MANIFEST_NAME).is_file() or next(folder.rglob("*.raw"), None) is not None


def find_results(path: str | os.PathLike, flag: str) -> tuple[dict[str, Path], Path | None]:
    """``Result_N`` folders under ``path`` (an engine run, its ``output/``, one result or one
    tensor folder), and the engine run folder when there is one (for its side files)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise AccdbgError(f"{flag} {str(path)!r} does not exist")
    if not p.is_dir():
        raise AccdbgError(f"{flag} {str(path)!r} is not a folder")
    p = p.absolute()
    if (p / "output").is_dir() and _result_folders(p / "output"):
        return {r.name: r for r in _result_folders(p / "output")}, p
    results = _result_folders(p)
    if results:
        return {r.name: r for r in results}, (p.parent if p.name == "output" else None)
    if not _has_tensors(p):
        raise AccdbgError(
            f"{flag} {str(path)!r} holds no tensors (expected tensors.json or .raw files, "
            f"or output/Result_N folders)"
        )
    in_engine = RESULT_RE.match(p.name) and p.parent.name == "output"
    return {p.name if RESULT_RE.match(p.name) else "Result_0": p}, (
        p.parent.parent if in_engine else None
    )


def pair_inputs(
    golden: dict[str, Path], target: dict[str, Path], golden_dir
) -> dict[str, tuple[Path, Path]]:
    """Which golden folder each target result is compared with: the only one, or the
    ``Result_N`` of the same name (engine against engine)."""
    if len(golden) == 1:
        (g,) = golden.values()
        return {k: (g, t) for k, t in target.items()}
    missing = [k for k in target if k not in golden]
    if missing:
        raise AccdbgError(
            f"--inference_results {missing[0]} has no counterpart in --golden_output_reference_directory "
            f"{str(golden_dir)!r} (it holds {', '.join(golden)})"
        )
    return {k: (golden[k], t) for k, t in target.items()}


def _mismatch(g: TensorFolder, t: TensorFolder, gi: dict, ti: dict) -> str:
    return (
        f"refusing to compare golden {str(g.root)!r} with target {str(t.root)!r}: the golden was "
        f"computed from {describe_inputs(gi, ti)} but the target from {describe_inputs(ti, gi)} "
        "(different inputs); pass the golden and the inference results of the same input"
    )


def match_inputs(
    folders: dict[str, tuple[TensorFolder, TensorFolder]], one_golden: bool
) -> tuple[dict[str, tuple[TensorFolder, TensorFolder]], list[tuple[int, str]]]:
    """Never compare dumps of different inputs: each pair's recorded input files must hold
    the same data. One golden against several results keeps those of its own input (and says
    which it left out); any other mismatch is an error. Returns the pairs and what to log
    (level, line)."""
    kept: dict[str, tuple[TensorFolder, TensorFolder]] = {}
    skipped: list[str] = []
    unrecorded: list[str] = []
    first_mismatch = None
    for key, (g, t) in folders.items():
        gi, ti = recorded_inputs(g.meta), recorded_inputs(t.meta)
        if gi is None or ti is None:
            unrecorded.append(str((g if gi is None else t).root))
            kept[key] = (g, t)
        elif same_inputs(gi, ti):
            kept[key] = (g, t)
        elif one_golden and len(folders) > 1:
            skipped.append(f"{key} ({input_files(ti)})")
            first_mismatch = first_mismatch or _mismatch(g, t, gi, ti)
        else:
            raise AccdbgError(_mismatch(g, t, gi, ti))
    golden_files = input_files(recorded_inputs(next(iter(folders.values()))[0].meta))
    if not kept:
        raise AccdbgError(
            f"no inference result was computed from the golden's input {golden_files}: "
            f"{', '.join(skipped)}; {first_mismatch}"
        )
    notes: list[tuple[int, str]] = []
    if skipped:
        text = (
            f"the golden holds one input ({golden_files}): compared with {', '.join(kept)}; "
            f"not compared (other inputs): {', '.join(skipped)}"
        )
        notes.append((logging.INFO, text))
    if unrecorded:
        more = len(set(unrecorded)) - 1
        text = (
            f"{unrecorded[0]} records no input files{f' (and {more} more)' if more else ''}: "
            "whether golden and target come from the same input cannot be checked"
        )
        notes.append((logging.INFO, text))
        if one_golden and len(kept) > 1:
            text = (
                f"the golden reference holds one input but the inference results hold {len(kept)}; "
                "every Result_N is compared with it (only meaningful if they share that input)"
            )
            notes.append((logging.WARNING, text))
    return kept, notes


def side_file(engine_run: Path | None, pattern: str) -> Path | None:
    """The one file matching ``pattern`` in the engine run folder, if exactly one does."""
    if engine_run is None:
        return None
    found = sorted(engine_run.glob(pattern))
    return found[0] if len(found) == 1 else None
