"""One story across algorithms: a run's culprit #1 beside the other algorithms' latest runs
on the same model and inputs (accdbg.algorithms.diagnosis.story)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accdbg.algorithms.diagnosis import story
from accdbg.algorithms.diagnosis.culprit import Culprit, Verified


def _run(work: Path, component: str, name: str) -> Path:
    """A finished run folder and its ``latest`` link, as the run folders make them."""
    run = work / component / name
    run.mkdir(parents=True)
    (work / component / "latest").symlink_to(name)
    return run


def _culprit(name: str, gain: float | None = None) -> Culprit:
    v = None if gain is None else Verified(10.0, gain + 1, fix="per-channel weights", gain_db=gain)
    return Culprit(1, name, "Conv", "weight range", verified=v)


def test_the_same_culprit_different_culprits_and_other_inputs(tmp_path):
    model, x, other = tmp_path / "m.onnx", tmp_path / "x.raw", tmp_path / "y.raw"
    model.write_bytes(b"model")
    x.write_bytes(b"\0" * 16)
    other.write_bytes(b"\1" * 16)
    work = tmp_path / "w"
    one = _run(work, "verification", "r1")
    assert story.tell("oneshot-layerwise", one, work, model, [x], [_culprit("conv1", 9.0)]) == []
    doc = json.loads((one / story.VERDICT).read_text())
    assert doc["algorithm"] == "oneshot-layerwise" and doc["culprits"][0]["name"] == "conv1"
    # the same model and input, the same culprit #1
    lw = _run(work, "layerwise_snooping", "r2")
    told = story.tell("layerwise", lw, work, model, [x], [_culprit("conv1")])
    assert told == ["one story: oneshot-layerwise (r1) names the same culprit #1, conv1"]
    # another culprit: why each sees what it sees, and what QNN measured of both fixes
    cu = tmp_path / "w" / "cumulative" / "r3"
    cu.mkdir(parents=True)
    (told,) = [
        line
        for line in story.tell("cumulative-layerwise", cu, work, model, [x], [_culprit("c2", 2.5)])
        if line.startswith("oneshot")
    ]
    assert told.startswith("oneshot-layerwise (r1) named conv1 as culprit #1, this run names c2:")
    assert story.SEES["cumulative-layerwise"] in told and story.SEES["oneshot-layerwise"] in told
    assert told.endswith(
        "measured on QNN HTP: c2's fix (per-channel weights) +2.5 dB, conv1's fix "
        "(per-channel weights) +9.0 dB"
    )
    # other inputs: no comparison, whatever was named
    ds = tmp_path / "w" / "dataset" / "r4"
    ds.mkdir(parents=True)
    assert story.tell("dataset", ds, work, model, [other], [_culprit("c9")]) == []


def test_the_story_goes_before_the_fix_which_stays_last():
    findings = ["culprit #1: a", "fix: per-channel weights: a: +3.0 dB on QNN HTP"]
    assert story.before_fix(findings, ["one story: ..."]) == [
        "culprit #1: a",
        "one story: ...",
        "fix: per-channel weights: a: +3.0 dB on QNN HTP",
    ]
    assert story.before_fix(["culprit #1: a"], ["one story: ..."]) == [
        "culprit #1: a",
        "one story: ...",
    ]


@pytest.mark.slow  # oneshot and layerwise on QNN
def test_oneshot_then_layerwise_on_one_model_tell_one_story(tmp_path):
    """A planted weight-range fault: oneshot names it, then layerwise on the same model and
    input compares its culprit #1 with oneshot's and says so in its findings."""
    from accdbg.algorithms.layerwise import run_layerwise
    from accdbg.algorithms.oneshot import run_oneshot
    from accdbg.core.inputs import parse_input_tensor
    from tests import models

    built = models.planted_chain(tmp_path, layers=3, bad=1)
    dims = ",".join(map(str, built.dims))
    inputs = [parse_input_tensor([built.input_name, dims, str(built.input_path)])]
    work = tmp_path / "w"
    one = run_oneshot("onnx", built.path, inputs, working_dir=work)
    assert one.culprits and (one.verification_run / story.VERDICT).is_file()
    res = run_layerwise(built.path, inputs, working_dir=work)
    first = one.culprits[0].name
    said = [f for f in res.findings if "oneshot-layerwise (" in f]
    assert len(said) == 1, res.findings
    if res.culprits and res.culprits[0].name == first:
        assert said[0].startswith("one story: oneshot-layerwise") and said[0].endswith(first)
    else:
        assert f"named {first} as culprit #1" in said[0] and story.SEES["layerwise"] in said[0]
