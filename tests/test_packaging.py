"""A wheel carries the report's page, stylesheet and script, and an installed accdbg works alone.

The wheel is built from a copy of the sources (pyproject.toml, README.md, accdbg/), so no
build folder of the working tree can slip files into it; it is then installed into a fresh
virtual environment and used from a folder outside the repository, where the source tree
cannot be imported.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ASSETS = ["templates/summary.html", "static/report.css", "static/table.js"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "accdbg", src / "accdbg", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + [str(src), "-w", str(tmp / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = (tmp / "dist").glob("accdbg-*.whl")
    return found


@pytest.mark.slow
def test_wheel_holds_the_report_assets(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for rel in ASSETS:
            inside = f"accdbg/reports/{rel}"
            assert inside in names, sorted(n for n in names if "reports" in n)
            assert zf.read(inside) == (REPO / "accdbg" / "reports" / rel).read_bytes()
    assert not any(n.startswith("reports/") for n in names)  # nothing outside the package


@pytest.mark.slow
def test_installed_wheel_reads_its_assets_and_its_children_import_it(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    # the heavy dependencies come from this interpreter; accdbg only from the wheel
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    script = (
        "import json, accdbg\n"
        "from accdbg.core.isolate import run_isolated, source_tree\n"
        "from accdbg.reports.html_report import asset\n"
        "print(json.dumps({'file': accdbg.__file__, 'css': asset('static/report.css'),\n"
        "    'tree': source_tree() and str(source_tree()),\n"
        "    'child_tree': run_isolated(source_tree, what='importing accdbg')}))\n"
    )
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    proc = subprocess.run(
        [str(python), "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=outside,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(seen["file"]).resolve().is_relative_to(env_dir.resolve())  # the wheel's accdbg
    assert seen["css"] == (REPO / "accdbg" / "reports" / "static" / "report.css").read_text()
    assert seen["tree"] is None  # installed: nothing to add to the children's PYTHONPATH
    assert seen["child_tree"] is None  # and the child imported the installed accdbg too


def _readme_commands() -> list[str]:
    return [
        b.strip()
        for b in re.findall(r"```bash\n(.*?)\n```", (REPO / "README.md").read_text(), re.S)
    ]


def test_ci_runs_the_readme_test_command_then_the_wheel_check():
    first, test_command = _readme_commands()[:2]
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_command in ci  # the very line, unchanged
    assert ci.index(".ci/check_wheel") > ci.index(test_command)
    # the wheel check runs the README's example, with the installed command
    example = first.removeprefix("pip install -e . && ")
    check = (REPO / ".ci" / "check_wheel").read_text()
    assert (
        example.replace("qnn-accuracy-debugger", '"$tmp/venv/bin/qnn-accuracy-debugger"') in check
    )
