"""Entry point of ``qnn-accuracy-debugger`` / ``accdbg``.

A component flag (``--framework_diagnosis``, ``--inference_engine``, ...) selects one
component; without one the wrapper runs the debugging algorithm. Each component is a module
with ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args)``, registered below.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml

from accdbg.cli.args import Parser
from accdbg.core import run_dir
from accdbg.core.progress import paused
from accdbg.errors import (
    AccdbgError,
    Interrupted,
    describe,
    forget_signal,
    is_disk_full,
    signal_received,
)

PROG = "qnn-accuracy-debugger"

# component flag -> module implementing it
COMPONENTS: dict[str, str] = {
    "framework_diagnosis": "accdbg.cli.framework_diagnosis",
    "inference_engine": "accdbg.cli.inference_engine",
    "verification": "accdbg.cli.verification",
    "compare_encodings": "accdbg.cli.compare_encodings",
    "tensor_inspection": "accdbg.cli.tensor_inspection",
    "quant_checker": "accdbg.cli.quant_checker",
    "fix_search": "accdbg.cli.fix_search",
    "model_explorer_view": "accdbg.cli.model_explorer_view",
}
WRAPPER = "accdbg.cli.wrapper"
# ``--deep_analyzer NAME`` takes a value: with ``--inference_results`` it runs alone over
# existing runs, otherwise the wrapper runs it after oneshot
DEEP_ANALYZER = "accdbg.cli.deep_analyzer"


def standalone_deep_analyzer(argv: Sequence[str]) -> bool:
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    return "--deep_analyzer" in flags and "--inference_results" in flags


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (pytest and notebooks swap it), above the
    progress bars drawn there (cleared for the line, then drawn again)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        with paused(sys.stderr):
            super().emit(record)


# loggers whose records go to the run's log.txt but reach the console only with -v
LOG_ONLY = ("accdbg.native", "accdbg.warnings")


def _console_worthy(record: logging.LogRecord) -> bool:
    return not record.name.startswith(LOG_ONLY)


def setup_logging(verbose: bool) -> None:
    logger = logging.getLogger("accdbg")
    logger.setLevel(logging.DEBUG)
    for h in list(logger.handlers):
        if getattr(h, "_accdbg_console", False):
            logger.removeHandler(h)
    console = StderrHandler()
    console.setLevel(logging.DEBUG if verbose else logging.INFO)
    console.setFormatter(logging.Formatter("%(message)s"))
    if not verbose:
        console.addFilter(_console_worthy)
    console._accdbg_console = True  # type: ignore[attr-defined]
    logger.addHandler(console)
    logger.propagate = False
    run_dir.LOG_TRACEBACKS = verbose


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
    logging.getLogger("accdbg.warnings").warning("%s", text)


def _raise_interrupted(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    signal_received(name)  # checkpoints raise it again if this raise is swallowed
    raise Interrupted(name)


@contextmanager
def stop_signals_and_warnings() -> Iterator[None]:
    """SIGINT and SIGTERM stop the run cleanly; Python warnings go to the run's log.

    Both signals raise :class:`~accdbg.errors.Interrupted`: the run closes as ``NAME.failed``
    with the signal as the last line of its log, child processes are stopped, and the exit
    code is 128 + the signal number. A signal the tool inherited as *ignored* stays ignored:
    that is how a POSIX shell starts background jobs (``cmd &`` in a script, where Ctrl-C
    must stop the script but not them). ``nohup`` ignores only SIGHUP, so Ctrl-C still works
    under it; a background run is stopped cleanly with ``kill PID`` (SIGTERM).
    """
    saved = {}
    in_main_thread = threading.current_thread() is threading.main_thread()
    for sig in (signal.SIGINT, signal.SIGTERM) if in_main_thread else ():
        current = signal.getsignal(sig)
        if current is not signal.SIG_IGN:
            saved[sig] = current
            signal.signal(sig, _raise_interrupted)
    shown = warnings.showwarning
    warnings.showwarning = _log_warning
    try:
        yield
    finally:
        warnings.showwarning = shown
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        forget_signal()


def top_level_help() -> str:
    lines = [
        f"usage: {PROG} [--framework_diagnosis | --inference_engine | --verification |",
        "        --compare_encodings | --tensor_inspection | --quant_checker | --fix_search",
        "        | --model_explorer_view RUN_DIR] [-h] [component options]",
        "",
        "Finds which layer of a model breaks on the QNN runtime, and why.",
        "Select at most one component; with none, framework diagnosis, inference engine and",
        "verification run in sequence (oneshot-layerwise debugging).",
        "",
        "components:",
    ]
    for name, module in COMPONENTS.items():
        lines.append(f"  --{name:<22} {importlib.import_module(module).HELP}")
    lines.append(
        f"  --{'deep_analyzer NAME':<22} {importlib.import_module(DEEP_ANALYZER).HELP} "
        "(with --inference_results; without, after oneshot)"
    )
    lines += ["", f"For a component's options: {PROG} --help --<component>"]
    return "\n".join(lines)


def split_component(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    chosen = [a[2:] for a in argv if a.startswith("--") and a[2:] in COMPONENTS]
    if len(chosen) > 1:
        raise AccdbgError(
            f"choose at most one component flag; got {', '.join('--' + c for c in chosen)}"
        )
    rest = [a for a in argv if not (a.startswith("--") and a[2:] in COMPONENTS)]
    return (chosen[0] if chosen else None), rest


def take_config(argv: list[str]) -> tuple[list[str], dict | None]:
    """Pull ``--config FILE`` out of the arguments and load it (JSON or YAML)."""
    for i, a in enumerate(argv):
        if a == "--config" or a.startswith("--config="):
            if a == "--config":
                if i + 1 >= len(argv):
                    raise AccdbgError("--config needs a file path")
                path, rest = argv[i + 1], argv[:i] + argv[i + 2 :]
            else:
                path, rest = a.split("=", 1)[1], argv[:i] + argv[i + 1 :]
            return rest, load_config(Path(path))
    return argv, None


def load_config(path: Path) -> dict:
    if not path.is_file():
        raise AccdbgError(f"--config {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise AccdbgError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise AccdbgError(
            f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}"
        ) from None
    if not isinstance(data, dict):
        raise AccdbgError(
            f'{path}: expected a mapping of option names to values, e.g. {{"runtime": "htp"}}'
        )
    return {**data, "__path__": str(path)}


def apply_config(parser: argparse.ArgumentParser, config: dict) -> dict:
    """Make the file's values defaults (so flags override them); returns list-valued ones.

    Keys are option names without dashes, in either spelling the flags take
    (``default_verifier`` or ``defaultVerifier``, ``input_tensor``).
    """
    path = config.pop("__path__")
    by_name: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.dest == "help":
            continue
        by_name[action.dest] = action
        for opt in action.option_strings:
            by_name.setdefault(opt.lstrip("-"), action)
    defaults, appended = {}, {}
    for key, value in config.items():
        action = by_name.get(str(key))
        if action is None:
            valid = sorted({a.dest for a in by_name.values()})
            raise AccdbgError(f"{path}: unknown option {key!r}; valid options: {', '.join(valid)}")
        action.required = False
        if isinstance(action, argparse._AppendAction):
            items = value if isinstance(value, list) else [value]
            if action.nargs not in (None, "?"):
                items = [v if isinstance(v, list) else str(v).split() for v in items]
            appended[action.dest] = items
        else:
            defaults[action.dest] = value
    parser.set_defaults(**defaults)
    return appended


def build_parser(component: str, module) -> Parser:
    prog = PROG if component == "wrapper" else f"{PROG} --{component}"
    parser = Parser(prog=prog, description=module.HELP)
    module.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in argv or "--verbose" in argv
    traces = run_dir.LOG_TRACEBACKS
    setup_logging(verbose)
    try:
        with stop_signals_and_warnings():
            return _main(argv)
    except AccdbgError as exc:
        if verbose:
            traceback.print_exc()
        print(f"{PROG}: {describe(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"{PROG}: {describe(exc)}", file=sys.stderr)
        name = exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"
        return 128 + int(signal.Signals[name])
    except Exception as exc:  # a bug: say so in one line, keep the traceback for -v
        if verbose:
            traceback.print_exc()
        hint = "" if is_disk_full(exc) else " (rerun with -v for the traceback)"
        print(f"{PROG}: {describe(exc)}{hint}", file=sys.stderr)
        return 1
    finally:  # a notebook calling main(["-v", ...]) once must not log tracebacks ever after
        run_dir.LOG_TRACEBACKS = traces


def component_module(argv: Sequence[str]):
    """The module of the component ``argv`` selects (the wrapper without a component flag)
    and the arguments left for its parser."""
    component, rest = split_component(argv)
    asks_help = any(a in ("-h", "--help") for a in rest)
    if component is None and (
        standalone_deep_analyzer(rest) or (asks_help and "--deep_analyzer" in rest)
    ):
        return importlib.import_module(DEEP_ANALYZER), rest
    if component is None:
        return importlib.import_module(WRAPPER), rest
    return importlib.import_module(COMPONENTS[component]), rest


def parse_command(argv: Sequence[str]) -> tuple[object, argparse.Namespace]:
    """A command line (without the program name) parsed as a run would parse it - component,
    ``--config`` file, flags - without running anything: ``(component module, arguments)``.
    ``--help`` raises ``SystemExit`` (argparse's)."""
    module, rest = component_module(argv)
    parser = build_parser(module.NAME, module)
    rest, config = take_config(list(rest))
    appended = apply_config(parser, config) if config else {}
    args = parser.parse_args(rest)
    for dest, value in appended.items():  # list options: the command line replaces the file's
        if not getattr(args, dest):
            setattr(args, dest, value)
    return module, args


def _main(argv: list[str]) -> int:
    component, rest = split_component(argv)
    if component is None and not (standalone_deep_analyzer(rest) or "--deep_analyzer" in rest):
        if not rest or any(a in ("-h", "--help") for a in rest):
            print(top_level_help())
            wrapper = importlib.import_module(WRAPPER)
            print("\nWithout a component flag (" + wrapper.HELP + "):\n")
            print(build_parser(wrapper.NAME, wrapper).format_help())
            return 0
    try:
        module, args = parse_command(argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
