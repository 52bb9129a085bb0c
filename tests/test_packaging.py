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


def _can_build_here() -> bool:
    """This environment holds the build backend pyproject.toml asks for: setuptools 68 or
    newer, with bdist_wheel (its own from 70.1, else the ``wheel`` package). A fresh
    virtual environment has only what ensurepip put there (Python 3.11: an older setuptools,
    no ``wheel``)."""
    from importlib.metadata import PackageNotFoundError, version

    def release(name: str) -> tuple[int, ...]:
        try:
            return tuple(int(p) for p in re.findall(r"\d+", version(name))[:2])
        except PackageNotFoundError:
            return ()

    setuptools = release("setuptools")
    return setuptools >= (68,) and (setuptools >= (70, 1) or release("wheel") != ())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "accdbg", src / "accdbg", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    # offline with this environment's backend when it has the one asked for; else pip
    # fetches it into an isolated build environment, as .ci/check_wheel does
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"]
        + (["--no-build-isolation"] if _can_build_here() else [])
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
    see_this_environment(python)
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


def see_this_environment(python: Path) -> None:
    """Let the environment of ``python`` see this interpreter's packages, when this one is
    itself a virtual environment: ``system_site_packages`` reaches only the base
    interpreter's, and a venv's packages are its own. A ``.pth`` line runs
    ``site.addsitedir`` on each of this environment's site folders, after the new
    environment's own (the wheel's accdbg comes first), their ``.pth`` files included, as
    ``system_site_packages`` does for the base interpreter's."""
    if sys.prefix == sys.base_prefix:
        return
    import sysconfig

    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    lines = [f"import site; site.addsitedir({p!r})" for p in ours]
    (Path(_purelib(python)) / "_outer_environment.pth").write_text("\n".join(lines) + "\n")


def test_a_venv_made_inside_a_venv_sees_the_outer_packages(tmp_path):
    """What the wheel test and ``.ci/check_wheel`` rely on when the suite itself runs in a
    virtual environment: the inner environment imports the outer one's packages (pytest is
    one, whichever environment holds it) and its own before them."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    see_this_environment(python)
    (Path(_purelib(python)) / "accdbg_probe_inner.py").write_text("WHERE = 'inner'\n")
    proc = subprocess.run(
        [
            str(python),
            "-c",
            "import pytest, accdbg_probe_inner as p; print(pytest.__file__, p.WHERE)",
        ],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, inner = proc.stdout.split()
    assert Path(where).resolve() == Path(pytest.__file__).resolve() and inner == "inner"


def _purelib(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


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
    # in a fresh, plain virtual environment, entered before it
    (make,) = [i for i, line in enumerate(ci) if " -m venv " in line]
    (enter,) = [i for i, line in enumerate(ci) if line.startswith("source ")]
    assert "--system-site-packages" not in ci[make] and "mktemp" in "".join(ci[:make])
    assert make < enter < ci.index(test_command) and ci[enter].endswith('/bin/activate"')
    # the wheel check runs the README's example, with the installed command
    example = first.removeprefix("pip install -e . && ")
    check = (REPO / ".ci" / "check_wheel").read_text()
    assert (
        example.replace("qnn-accuracy-debugger", '"$tmp/venv/bin/qnn-accuracy-debugger"') in check
    )
