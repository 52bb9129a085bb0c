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
from pathlib import Path

_UNSUPPORTED = re.compile(
    r"REASON\s*:\s*(?P<reason>.*?)\b(?P<type>[A-Za-z0-9_]+) node `(?P<name>[^`]*)` will not be assigned to QNN EP"
)
_UNSUPPORTED_LIST = re.compile(r"\{ name: (?P<name>[^,]*), type: (?P<type>[^ }]*) \}")
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
class NativeLog:
    text: str

    def unsupported(self) -> list[dict[str, str]]:
        """Nodes the QNN EP refused: name, type and its reason, each once."""
        seen: dict[str, dict[str, str]] = {}
        for m in _UNSUPPORTED.finditer(self.text):
            reason = m.group("reason").strip().rstrip(".")
            reason = (
                reason[: -len(m.group("type"))].rstrip(". ")
                if reason.endswith(m.group("type"))
                else reason
            )
            seen.setdefault(
                m.group("name"),
                {"name": m.group("name"), "type": m.group("type"), "reason": reason},
            )
        for m in _UNSUPPORTED_LIST.finditer(self.text):
            seen.setdefault(
                m.group("name"), {"name": m.group("name"), "type": m.group("type"), "reason": ""}
            )
        return list(seen.values())

    def placement(self) -> Placement:
        p = Placement()
        current: str | None = None
        for line in self.text.splitlines():
            m = _PLACED.search(line)
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
