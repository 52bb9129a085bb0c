"""Read what onnxruntime and the QNN backend print natively (to fd 2), to explain runs.

The QNN execution provider tells which nodes it refused and why only in its log; onnxruntime
lists which node landed on which provider only at verbose level. We capture the native stderr
of the worker process into a file and parse those lines into structured facts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

# The QNN EP's verdict per node unit (verbose), e.g.
#   ... LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (NonMaxSuppression) :
#   \tOperator type: NonMaxSuppression Node name: nms Node index: 10
#   \tREASON : NonMaxSuppression: optional scalar inputs (...) must be constant initializers.
# The reason applies to every node of the unit (a DQ -> op -> Q group lists three).
_VALIDATION = re.compile(r"Validation (?P<verdict>PASSED|FAILED)\b")
_UNIT_NODE = re.compile(
    r"^\s+Operator type: (?P<type>\S+) Node name: (?P<name>.*?) Node index: \d+\s*$"
)
_REASON = re.compile(r"^\s*REASON\s*:\s*(?P<reason>.*)$")
# Some reasons end by repeating the verdict: "... by QNN EP.Unique node `u` will not be assigned to QNN EP."
_WILL_NOT = re.compile(
    r"\.?\s*(?P<type>[A-Za-z0-9_]+) node `(?P<name>[^`]*)` will not be assigned to QNN EP\.?"
)
# With CPU fallback disabled the EP lists what it refused, without reasons:
#   Unsupported nodes in QNN EP: { name: u, type: Unique }{ name: q, type: QuantizeLinear },
_UNSUPPORTED_LIST = re.compile(r"\{ name: (?P<name>[^,]*), type: (?P<type>[^ }]*) \}")
# The backend's own refusal, logged by the EP just before a "Failed to add node." verdict:
#   QNN.backendValidateOpConfig() failed for node `op` of type `OneHot` with error code 3110
_OP_CONFIG = re.compile(
    r"QNN\.backendValidateOpConfig\(\) failed for node `[^`]*` of type `(?P<type>[^`]*)`"
    r" with error code \d+"
)
_REFUSAL_WORDS = (
    "not supported",
    "unsupported",
    "not assigned",
    "must be",
    "cannot",
    "can't",
    "failed",
    "invalid",
)
_PLACED = re.compile(
    r"(?:Node\(s\)|All nodes) placed on \[(?P<ep>[A-Za-z]+)\]\. Number of nodes: (?P<n>\d+)"
)
_PLACED_NODE = re.compile(
    r"VerifyEachNodeIsAssignedToAnEp\]\s{2,}(?P<type>\S+) \((?P<name>.*)\)\s*$"
)
_ERROR = re.compile(r"\[E:onnxruntime:[^\]]*\]\s*(?P<msg>.*)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_QNN_CODE = re.compile(
    r"(?:[Ee]rror(?: code)?[:= ]+|QNN_[A-Z_]*ERROR[A-Z_]*)\s*(?P<code>\d{3,6}|QNN_[A-Z_]+)"
)


@dataclass
class Placement:
    """Which nodes each provider took, from onnxruntime's verbose node-placement report."""

    counts: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # ep -> [(type, name)]

    @property
    def qnn_partitions(self) -> int:
        return self.counts.get("QNNExecutionProvider", 0)

    @property
    def cpu_nodes(self) -> list[tuple[str, str]]:
        return self.nodes.get("CPUExecutionProvider", [])


@dataclass
class Refusal:
    """QNN's refusal of one node: its reason(s) and where the log says so (1-based line)."""

    name: str
    type: str
    reasons: list[str] = field(default_factory=list)
    line: int = 0
    raw: str = ""

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)

    def as_dict(self) -> dict:
        return {"name": self.name, "type": self.type, "reason": self.reason}


def _clean_reason(text: str) -> str:
    text = _WILL_NOT.sub("", text).strip()
    return text.rstrip(". ").strip()


@dataclass
class NativeLog:
    text: str

    @cached_property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    def refusals(self) -> dict[str, Refusal]:
        """Every node QNN's validation refused, with its reason(s), by node name."""
        out: dict[str, Refusal] = {}
        lines = self.lines
        i = 0
        backend: dict[str, str] = {}  # op type -> the QNN backend's refusal just before a verdict
        while i < len(lines):
            # substring guards first: logs run to megabytes of tensor dumps
            c = _OP_CONFIG.search(lines[i]) if "backendValidateOpConfig" in lines[i] else None
            if c:
                backend[c.group("type")] = c.group(0).strip()
            m = _VALIDATION.search(lines[i]) if "Validation " in lines[i] else None
            if not m or m.group("verdict") != "FAILED":
                if m:
                    backend.clear()
                i += 1
                continue
            header, i = i, i + 1
            nodes: list[tuple[str, str]] = []
            reason: list[str] = []
            while i < len(lines) and lines[i].startswith("\t"):  # the block's own lines
                n, r = _UNIT_NODE.match(lines[i]), _REASON.match(lines[i])
                if n:
                    nodes.append((n.group("type"), n.group("name")))
                elif r:
                    reason.append(r.group("reason").strip())
                i += 1
            text = _clean_reason(" ".join(reason))
            extra = [backend[t] for t in dict.fromkeys(t for t, _ in nodes) if t in backend]
            text = "; ".join(x for x in [text, *extra] if x)
            backend.clear()
            raw = lines[header].strip()
            for op_type, name in nodes:
                ref = out.setdefault(name, Refusal(name, op_type, line=header + 1, raw=raw))
                if text and text not in ref.reasons:
                    ref.reasons.append(text)
        for no, line in enumerate(lines, 1):
            if "will not be assigned" not in line and "{ name: " not in line:
                continue
            for m in _WILL_NOT.finditer(line):  # the verdict alone on a line, no block around it
                if m.group("name") not in out:
                    before = _REASON.match(line[: m.start()])
                    text = _clean_reason(before.group("reason")) if before else ""
                    out[m.group("name")] = Refusal(
                        m.group("name"), m.group("type"), [text] if text else [], no, line.strip()
                    )
            for m in _UNSUPPORTED_LIST.finditer(line):
                if m.group("name") not in out:
                    out[m.group("name")] = Refusal(
                        m.group("name"), m.group("type"), [], no, line.strip()
                    )
        return out

    def unsupported(self) -> list[dict]:
        """Nodes the QNN EP refused: name, type and its reason (empty when the log gives none)."""
        return [r.as_dict() for r in self.refusals().values()]

    def validated(self) -> set[str]:
        """Nodes QNN's validation passed at least once."""
        names: set[str] = set()
        in_block = False
        for line in self.lines:
            m = _VALIDATION.search(line) if "Validation " in line else None
            if m:
                in_block = m.group("verdict") == "PASSED"
                continue
            n = _UNIT_NODE.match(line) if in_block else None
            if n:
                names.add(n.group("name"))
            else:
                in_block = False
        return names

    def mentions(self, names: set[str]) -> dict[str, tuple[int, str]]:
        """For each name, the first log line naming it in words of refusal - for formats this
        parser does not know - as (1-based line number, line)."""
        wanted = sorted((n for n in names if n), key=len, reverse=True)
        if not wanted:
            return {}
        pattern = re.compile(
            r"(?<![\w/.])(" + "|".join(re.escape(n) for n in wanted) + r")(?![\w/.])"
        )
        found: dict[str, tuple[int, str]] = {}
        for no, line in enumerate(self.lines, 1):
            low = line.lower()
            if not any(w in low for w in _REFUSAL_WORDS) or "validation " in low:
                continue
            for m in pattern.finditer(line):
                found.setdefault(m.group(1), (no, line.strip()))
        return found

    def placement(self) -> Placement:
        p = Placement()
        current: str | None = None
        for line in self.lines:
            m = _PLACED.search(line) if "placed on [" in line else None
            if m:
                current = m.group("ep")
                p.counts[current] = int(m.group("n"))
                p.nodes[current] = []
                continue
            if current is not None:
                n = _PLACED_NODE.search(line)
                if n:
                    p.nodes[current].append((n.group("type"), n.group("name")))
                else:
                    current = None
        return p

    def errors(self) -> list[str]:
        return [_ANSI.sub("", m.group("msg")).strip() for m in _ERROR.finditer(self.text)]

    def backend_failed(self) -> str | None:
        """The QNN backend's own set-up failure, if it had one (its nodes then go to the CPU)."""
        for e in self.errors():
            if "SetupBackend failed" in e:
                return e
        return None

    def first_qnn_error(self) -> str | None:
        """The most specific QNN error line (with an error code when there is one)."""
        errs = [e for e in self.errors() if "QNN" in e or "Qnn" in e]
        with_code = [e for e in errs if _QNN_CODE.search(e)]
        return (with_code or errs or [None])[0]


@contextmanager
def capture_fd2(path: Path) -> Iterator[None]:
    """Send native stderr (fd 2) to ``path`` for the duration; Python's sys.stderr follows."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def read_log(path: Path) -> NativeLog:
    try:
        return NativeLog(_ANSI.sub("", path.read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return NativeLog("")
