"""QNN tool options given to accdbg, as the QNN execution provider's options.

Qualcomm's tool hands ``--extra_contextbin_args`` to qnn-context-binary-generator and
``--qnn_netruntime_config_file`` to qnn-net-run. onnxruntime-qnn builds and runs the QNN
context itself, from provider options: what has a provider option is mapped onto it (one line
says which), the rest is named as having no counterpart and what is done instead.

qnn-net-run's ``--config_file`` (the reference guide's template)::

    {"backend_extensions": {"shared_library_path": "...libQnnHtpNetRunExtensions.so",
                            "config_file_path": "htp_config.json"},
     "context_configs": {"context_priority": "low | normal | normal_high | high", ...},
     "graph_configs": [...], "profile_configs": {...}, "async_graph_execution_config": {...}}

and the HTP backend extensions' file it points to: ``graphs`` (``vtcm_mb``, ``O``,
``fp16_relaxed_precision``, ``graph_names``, ...), ``devices`` (``soc_model``, ``dsp_arch``,
``device_id``, ``cores``: ``perf_profile``, ``rpc_control_latency``, ...).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accdbg.errors import AccdbgError

CONTEXT_PRIORITIES = ("low", "normal", "normal_high", "high")
PROFILING_LEVELS = ("off", "basic", "detailed")
PERF_MODES = (
    "burst",
    "balanced",
    "default",
    "high_performance",
    "high_power_saver",
    "low_balanced",
    "low_power_saver",
    "power_saver",
    "sustained_high_performance",
)
# qnn-context-binary-generator's arguments without a provider option, and what happens instead
CONTEXTBIN_INSTEAD = {
    "op_packages": "onnxruntime-qnn registers no QNN op package: a node needing one stays on "
    "the CPU, with QNN's reason in partitioning.json",
    "log_level": "QNN's verbose log always goes to backend_log.txt",
}
CONTEXTBIN_OWN = "the execution provider makes the context binary itself, in the session"
NETRUN_GROUPS_IGNORED = (
    "graph_configs",
    "profile_configs",
    "async_graph_execution_config",
)


@dataclass
class Mapped:
    """Provider options from a QNN tool's arguments, each with where it came from, and the
    arguments that have no counterpart."""

    options: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # option -> "context_priority" ...
    ignored: list[str] = field(default_factory=list)

    def set(self, option: str, value: Any, source: str, flag: str) -> None:
        value = str(int(value) if isinstance(value, bool) else value)
        if option in self.options and self.options[option] != value:
            raise AccdbgError(
                f"{flag}: {self.sources[option]} gives {option} {self.options[option]!r} and "
                f"{source} gives {value!r}; give one"
            )
        self.options[option], self.sources[option] = value, source

    def merge(self, other: Mapped, flag: str) -> None:
        for option, value in other.options.items():
            self.set(option, value, other.sources[option], flag)
        self.ignored += other.ignored

    def line(self, flag: str) -> str:
        """The one line a run logs: what was mapped and what was not."""
        mapped = ", ".join(f"{self.sources[k]} -> {k}={v}" for k, v in self.options.items())
        parts = [f"mapped onto the QNN execution provider's options: {mapped}" if mapped else ""]
        if self.ignored:
            parts.append("no counterpart in onnxruntime-qnn, ignored: " + "; ".join(self.ignored))
        return f"{flag}: " + "; ".join(p for p in parts if p)


def _choice(value: Any, choices: Iterable[str], what: str, flag: str) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise AccdbgError(
            f"{flag}: {what} {value!r} is not known; expected one of: {', '.join(choices)}"
        )
    return text


def _number(value: Any, what: str, flag: str, low: int = 0, high: int | None = None) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        n = None
    if n is None or n < low or (high is not None and n > high):
        bound = f"{low}..{high}" if high is not None else f"{low} or more"
        raise AccdbgError(f"{flag}: {what} {value!r} is not a whole number {bound}")
    return n


def _read_json(path: Path, flag: str, what: str) -> dict:
    if not path.is_file():
        raise AccdbgError(f"{flag}: {what} {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AccdbgError(f"{flag}: {what} {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AccdbgError(f"{flag}: {what} {str(path)!r} must hold a JSON object ({{...}})")
    return data


def netrun_config(path: str | Path, flag: str = "--qnn_netruntime_config_file") -> Mapped:
    """qnn-net-run's ``--config_file`` (and the HTP backend extensions file it names) as
    provider options."""
    path = Path(path).expanduser()
    data = _read_json(path, flag, "qnn-net-run config file")
    out = Mapped()
    for key, value in data.items():
        if key == "context_configs" and isinstance(value, dict):
            for k, v in value.items():
                if k == "context_priority":
                    out.set(
                        "qnn_context_priority", _choice(v, CONTEXT_PRIORITIES, k, flag), k, flag
                    )
                else:
                    out.ignored.append(f"context_configs.{k}")
        elif key == "backend_extensions" and isinstance(value, dict):
            for k, v in value.items():
                if k == "config_file_path":
                    ext = Path(str(v)).expanduser()
                    out.merge(
                        htp_extensions(ext if ext.is_absolute() else path.parent / ext, flag), flag
                    )
                elif k == "shared_library_path":
                    out.ignored.append(
                        "backend_extensions.shared_library_path (onnxruntime-qnn applies the "
                        "backend's options itself)"
                    )
                else:
                    out.ignored.append(f"backend_extensions.{k}")
        else:
            out.ignored.append(key)
    return out


def htp_extensions(path: Path, flag: str) -> Mapped:
    """The HTP backend extensions config (``graphs``, ``devices``) as provider options."""
    data = _read_json(path, flag, "HTP backend extensions config")
    out = Mapped()
    for key, value in data.items():
        items = value if isinstance(value, list) else [value]
        if key == "graphs":
            for graph in (g for g in items if isinstance(g, dict)):
                _graph(graph, out, flag)
        elif key == "devices":
            for device in (d for d in items if isinstance(d, dict)):
                _device(device, out, flag)
        else:
            out.ignored.append(f"backend extensions' {key}")
    return out


def _graph(graph: dict, out: Mapped, flag: str) -> None:
    for k, v in graph.items():
        if k == "vtcm_mb":
            out.set("vtcm_mb", _number(v, k, flag), f"graphs.{k}", flag)
        elif k == "O":
            out.set(
                "htp_graph_finalization_optimization_mode",
                _number(v, "O (graph optimization level)", flag, 0, 3),
                f"graphs.{k}",
                flag,
            )
        elif k == "fp16_relaxed_precision":
            out.set("enable_htp_fp16_precision", _number(v, k, flag, 0, 1), f"graphs.{k}", flag)
        elif k != "graph_names":  # which QNN graph: the EP's graph is the model's
            out.ignored.append(f"graphs.{k}")


def _device(device: dict, out: Mapped, flag: str) -> None:
    for k, v in device.items():
        if k == "soc_model":
            out.set("soc_model", _number(v, k, flag), f"devices.{k}", flag)
        elif k == "dsp_arch":
            arch = str(v).strip().lower().removeprefix("v")
            out.set("htp_arch", _number(arch, "dsp_arch", flag, 68, 99), f"devices.{k}", flag)
        elif k == "device_id":
            out.set("device_id", _number(v, k, flag), f"devices.{k}", flag)
        elif k == "cores":
            for core in (c for c in (v if isinstance(v, list) else [v]) if isinstance(c, dict)):
                for ck, cv in core.items():
                    if ck == "perf_profile":
                        mode = _choice(cv, PERF_MODES, ck, flag)
                        out.set("htp_performance_mode", mode, f"devices.cores.{ck}", flag)
                    elif ck == "rpc_control_latency":
                        out.set(
                            "rpc_control_latency",
                            _number(cv, ck, flag),
                            f"devices.cores.{ck}",
                            flag,
                        )
                    elif ck != "core_id":
                        out.ignored.append(f"devices.cores.{ck}")
        else:
            out.ignored.append(f"devices.{k}")


def contextbin_args(text: str, flag: str = "--extra_contextbin_args") -> Mapped:
    """``'arg1=value1;arg2=value2'`` of qnn-context-binary-generator as provider options:
    ``profiling_level``, and ``config_file`` (a qnn-net-run style config: see
    :func:`netrun_config`); the others are named with what is done instead."""
    out = Mapped()
    for entry in (e.strip() for e in str(text).split(";")):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise AccdbgError(
                f"{flag} {text!r}: {entry!r} is not arg=value; expected 'arg1=value1;arg2=value2'"
            )
        value = value.strip()
        if key == "profiling_level":
            out.set("profiling_level", _choice(value, PROFILING_LEVELS, key, flag), key, flag)
        elif key == "config_file":
            out.merge(netrun_config(value, flag), flag)
        else:
            out.ignored.append(f"{key} ({CONTEXTBIN_INSTEAD.get(key, CONTEXTBIN_OWN)})")
    return out
