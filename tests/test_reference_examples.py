"""Every example command of Qualcomm's qnn-accuracy-debugger guide parses.

accdbg follows the flags of Qualcomm's tool, and its guide is the contract: a command copied
from it must be accepted (what then cannot run here - an Android device, a converter's
``.cpp`` - is refused when it runs, with the reason). The guide's commands are kept in
``tests/data/reference_examples.txt``, collected from the guide by :func:`collect_examples`,
and checked against the guide's text (``../shared/reference`` beside the clone, as CI has it, or
``ACCDBG_REFERENCE_GUIDE``).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from accdbg.cli.main import parse_command

DATA = Path(__file__).parent / "data" / "reference_examples.txt"
# the shared reference beside the clone (CI's layout), unless the variable says otherwise
SHARED_GUIDE = (
    Path(__file__).resolve().parents[2] / "shared" / "reference" / "qnn-accuracy-debugger.txt"
)
GUIDE = Path(os.environ.get("ACCDBG_REFERENCE_GUIDE", SHARED_GUIDE))
START = re.compile(r"^qnn-accuracy-debugger( |\\|$)")


def collect_examples(text: str) -> list[tuple[int, list[str]]]:
    """``(first line number, the command's lines)`` of every example command in the guide's
    text: from a line starting ``qnn-accuracy-debugger`` over the lines ending with ``\\`` and
    the flag lines after them, across blank lines and code fences (the PDF's page breaks)."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        first = lines[i].strip()
        if not (START.match(first) and ("\\" in first or "--" in first)):
            i += 1
            continue
        parts, going_on, j = [first], first.endswith("\\"), i + 1
        while j < len(lines):
            line = lines[j].strip()
            if not line or line.startswith("```"):
                j += 1
            elif going_on or line.startswith("-"):
                parts.append(line)
                going_on = line.endswith("\\")
                j += 1
            else:
                break
        found.append((i + 1, parts))
        i = j
    return found


def kept_examples() -> list[tuple[int, list[str]]]:
    blocks = []
    for block in DATA.read_text().split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln and not ln.startswith("##")]
        if lines:
            head, *command = lines
            blocks.append((int(head.removeprefix("# line ")), command))
    return blocks


def argv(lines: list[str]) -> list[str]:
    """The arguments a shell would pass, line by line; a quote the PDF cut off at a line's
    end is closed there (the value is cut, as printed)."""
    out: list[str] = []
    for line in lines:
        line = line.removesuffix("\\").strip()
        try:
            out += shlex.split(line)
        except ValueError:  # "No closing quotation"
            quote = "'" if line.count("'") % 2 else '"'
            out += shlex.split(line + quote)
    assert out[0] == "qnn-accuracy-debugger"
    return out[1:]


EXAMPLES = kept_examples()


def test_the_kept_examples_are_the_guides():
    if not GUIDE.is_file():
        pytest.fail(
            f"the guide's text is not at {GUIDE}: clone beside ../shared or set ACCDBG_REFERENCE_GUIDE"
        )
    assert collect_examples(GUIDE.read_text()) == EXAMPLES


COMPONENTS = ("framework_diagnosis", "inference_engine", "verification", "compare_encodings",
              "tensor_inspection")  # fmt: skip


def component_of(command: list[str]) -> str:
    return next((a[2:] for a in argv(command) if a[2:] in COMPONENTS), "wrapper")


def test_all_22_examples_are_kept():
    counts = {
        c: [component_of(cmd) for _, cmd in EXAMPLES].count(c) for c in (*COMPONENTS, "wrapper")
    }
    # the guide's sections: 3 framework diagnosis, 7 inference engine, 1 verification,
    # 4 compare encodings, 2 tensor inspection, 5 end to end (oneshot, cumulative, layerwise)
    assert counts == {"framework_diagnosis": 3, "inference_engine": 7, "verification": 1,
                      "compare_encodings": 4, "tensor_inspection": 2, "wrapper": 5}  # fmt: skip


@pytest.mark.parametrize("line,command", EXAMPLES, ids=[f"line{n}" for n, _ in EXAMPLES])
def test_every_example_of_the_guide_parses(line, command):
    module, args = parse_command(argv(command))
    assert module.NAME == component_of(command)


def example(line: int) -> list[str]:
    return argv(dict(EXAMPLES)[line])


def test_the_guides_spellings_reach_their_flags():
    """What the examples that did not parse before spell, read as the guide means it."""
    # the engine's converted and compiled stage: the golden folder maps the tensors
    for line in (411, 428, 446, 461):
        _, args = parse_command(example(line))
        assert args.golden_dir_for_mapping.endswith("/golden_from_framework"), line
    # "aarch64_android" (underscore) is the architecture aarch64-android
    _, args = parse_command(example(477))
    assert args.architecture == "aarch64-android" and args.default_verifier == [["mse"]]
    # the end to end run: verification's --framework_results is the golden folder
    _, args = parse_command(example(1129))
    assert args.golden_output_reference_directory.endswith("/framework_diagnosis/latest/")
    assert args.tensor_mapping.endswith("/tensor_mapping.json")


def test_flags_the_end_to_end_run_does_not_use_are_said_once(caplog):
    """The end-to-end run makes its own inference engine run and side files: verification's
    inputs are accepted and the log says, in one line, that they are not used."""
    from accdbg.cli import wrapper

    _, args = parse_command(example(1129))
    with caplog.at_level("INFO", logger="accdbg"):
        wrapper._say_ignored_verification_inputs(args)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("ignored: --inference_results, --tensor_mapping")
