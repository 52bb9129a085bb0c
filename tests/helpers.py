"""Running the command in-process and reading what it printed."""

from __future__ import annotations

from accdbg.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    """The CLI's error: exactly one line starting with the program name."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1, err
    assert "Traceback" not in err, err
    return errors[0]
