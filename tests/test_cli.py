from tests.helpers import fresh_python, one_line_error, run_cli


def test_top_level_help_lists_components(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for name in (
        "framework_diagnosis",
        "inference_engine",
        "verification",
        "compare_encodings",
        "tensor_inspection",
    ):
        assert f"--{name}" in out


def test_component_help(capsys):
    code, out, _ = run_cli(capsys, "--help", "--framework_diagnosis")
    assert code == 0
    assert "--onnx_custom_op_lib" in out and "--disable_graph_optimization" in out
    assert "--input_tensor" in out


def test_two_components_is_an_error(capsys):
    code, _, err = run_cli(capsys, "--framework_diagnosis", "--verification")
    assert code == 2
    assert "at most one component" in one_line_error(err)


def test_missing_required_flag_is_one_line(capsys):
    code, _, err = run_cli(capsys, "--framework_diagnosis", "-f", "onnx")
    assert code == 2
    line = one_line_error(err)
    assert "--model_path" in line and "--input_tensor" in line


def test_unknown_framework(capsys, mlp, tmp_path):
    code, _, err = run_cli(
        capsys,
        "--framework_diagnosis",
        "-f",
        "caffe",
        "-m",
        mlp.path,
        "-i",
        "x",
        "2,4",
        mlp.input_path,
        "-w",
        tmp_path / "w",
    )
    assert code == 2
    assert "'caffe'" in one_line_error(err) and "onnx" in err


def test_console_scripts_declared():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    scripts = data["project"]["scripts"]
    assert scripts["qnn-accuracy-debugger"] == scripts["accdbg"] == "accdbg.cli.main:main"


# ---------------------------------------------------------------- checked before any work

import ctypes  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests import models  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _cli(*argv, cwd=None, preexec_fn=None) -> subprocess.CompletedProcess:
    """The command in a fresh Python, as a user runs it: what reaches the terminal, at fd level."""
    return subprocess.run(
        [sys.executable, "-m", "accdbg.cli.main", *map(str, argv)],
        cwd=cwd or REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=preexec_fn,
    )


def _poisoned(path: Path, shape, bad: dict[int, float]) -> Path:
    a = np.random.default_rng(0).standard_normal(int(np.prod(shape))).astype(np.float32)
    for i, v in bad.items():
        a[i] = v
    a.tofile(path)
    return path


def test_nan_or_inf_input_is_refused_before_anything_is_written(tmp_path, capsys):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=2)
    nan = _poisoned(tmp_path / "nan.raw", (1, 3, 8, 8), {70: np.nan, 71: np.nan})
    inf = _poisoned(tmp_path / "inf.raw", (1, 3, 8, 8), {130: -np.inf})
    work = tmp_path / "w"
    base = ["-f", "onnx", "-m", built.path, "-w", work]
    # -i: the wrapper refuses before framework diagnosis; 70 = (0, 1, 0, 6) in 1x3x8x8
    code, _, err = run_cli(capsys, *base, "-i", "x", "1,3,8,8", nan)
    line = one_line_error(err)
    assert code == 2 and str(nan) in line and "2 NaN and 0 Inf" in line
    assert "element 70, index [0, 1, 0, 6]" in line and "--allow_nonfinite_inputs" in line
    # -l: the second line's file; the -i file is clean
    listing = tmp_path / "list.txt"
    listing.write_text(f"{built.input_path}\n{inf}\n")
    for component in ([], ["--inference_engine", "-r", "htp"]):
        code, _, err = run_cli(
            capsys, *component, *base, "-i", "x", "1,3,8,8", built.input_path, "-l", listing
        )
        line = one_line_error(err)
        assert code == 2 and "list.txt:2" in line and str(inf) in line, line
        assert "0 NaN and 1 Inf" in line and "element 130, index [0, 2, 0, 2]" in line
    assert not work.exists()  # nothing written, no `latest` moved
    # accepted with the flag: the golden holds the NaN as given
    code, _, err = run_cli(
        capsys,
        "--framework_diagnosis",
        *base,
        "-i",
        "x",
        "1,3,8,8",
        nan,
        "--allow_nonfinite_inputs",
        "--output_dirname",
        "allowed",
    )
    assert code == 0, err
    golden = np.fromfile(work / "framework_diagnosis" / "allowed" / "conv0.raw", np.float32)
    assert np.isnan(golden).any()  # the NaN went through the first convolution


@pytest.mark.parametrize(
    "extra, expect",
    [
        (["-m", "missing.onnx"], "missing.onnx' does not exist"),
        (["--no_such_flag"], "unrecognized arguments: --no_such_flag"),
        (["-l", "nope.txt"], "--input_list 'nope.txt' does not exist"),
        (["-qo", "nope.encodings"], "-qo/--quantization_overrides 'nope.encodings' does not exist"),
        (["-bbw", "8"], "int32"),
        (["--default_verifier", "Cosine"], "Cosine"),
        (["--debugging_algorithm", "layerwise", "-qo", "nope.encodings"], "nope.encodings"),
        (["--golden_output_reference_directory", "nope"], "'nope' does not exist"),
    ],
)
def test_a_rejected_command_leaves_no_folder(tmp_path, capsys, extra, expect):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    work = tmp_path / "w"
    argv = ["-f", "onnx", "-m", built.path, "-i", "x", "1,3,8,8", built.input_path, "-w", work]
    if "-m" in extra:
        argv[3] = tmp_path / extra[1]
        extra = []
    code, _, err = run_cli(capsys, *argv, *extra)
    assert code == 2 and expect in one_line_error(err), err
    assert not work.exists()


def _without_dac_override() -> None:
    """Root ignores permission bits; in the child, drop that power (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH from the bounding set, which exec then applies)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.slow
def test_a_read_only_component_folder_is_named_before_any_component_runs(tmp_path):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    work = tmp_path / "w"
    (work / "inference_engine").mkdir(parents=True)
    (work / "inference_engine").chmod(0o555)
    try:
        args = ["-f", "onnx", "-m", built.path, "-i", "x", "1,3,8,8", built.input_path, "-w", work]
        for component in ([], ["--inference_engine", "-r", "htp"]):
            proc = _cli(*component, *args, preexec_fn=_without_dac_override)
            assert proc.returncode == 2, proc.stderr
            line = one_line_error(proc.stderr)
            assert f"folder '{work / 'inference_engine'}' is not writable" in line
        assert sorted(p.name for p in work.iterdir()) == ["inference_engine"]
        assert not any((work / "inference_engine").iterdir())
    finally:
        (work / "inference_engine").chmod(0o755)


def test_a_failed_runs_log_ends_with_the_error(tmp_path, capsys):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    nan = _poisoned(tmp_path / "nan.raw", (1, 3, 8, 8), {5: np.nan})
    args = ["--inference_engine", "-r", "htp", "-m", built.path, "-i", "x", "1,3,8,8", nan]
    args += ["-w", tmp_path / "w", "--allow_nonfinite_inputs"]
    for name, verbose in (("quiet", []), ("verbose", ["-v"])):
        code, _, err = run_cli(capsys, *args, "--output_dirname", name, *verbose)
        assert code == 2
        shown = [line for line in err.splitlines() if "error:" in line][-1]
        assert "quantization of" in shown and "holds 1 NaN" in shown
        log = (tmp_path / "w" / "inference_engine" / f"{name}.failed" / "log.txt").read_text()
        lines = log.strip().splitlines()
        assert lines[-1].endswith(shown.split(": ", 1)[1]) and " ERROR " in lines[-1]
        assert ("Traceback (most recent call last)" in log) == bool(verbose)


def test_warnings_go_to_the_log_not_the_console(tmp_path, capsys, monkeypatch):
    import accdbg.frameworks.diagnosis as diagnosis

    table = diagnosis.records_table  # called while the run folder is open

    def planting(*a, **k):
        warnings.warn("planted for the test", UserWarning, stacklevel=1)
        return table(*a, **k)

    monkeypatch.setattr(diagnosis, "records_table", planting)
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    args = ["--framework_diagnosis", "-f", "onnx", "-m", built.path, "-i", "x", "1,3,8,8"]
    args += [built.input_path, "-w", tmp_path / "w"]
    for name, verbose in (("quiet", []), ("verbose", ["-v"])):
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            code, out, err = run_cli(capsys, *args, "--output_dirname", name, *verbose)
        assert code == 0, err
        assert ("planted for the test" in out + err) == bool(verbose)
        log = (tmp_path / "w" / "framework_diagnosis" / name / "log.txt").read_text()
        assert "UserWarning: planted for the test" in log


@pytest.mark.slow
def test_a_normal_run_prints_no_native_line_and_no_warning(tmp_path):
    """QNN's LIBNATIVE lines (printed natively by every backend process) and Python warnings
    reach the run's log.txt, not the terminal. The second run compares the engine with its own
    earlier output: every score is perfect, which makes numpy warn (inf - inf) on the way."""
    built = models.conv_net(tmp_path, channels=4, size=8, layers=2)
    args = ["-f", "onnx", "-m", built.path, "-i", "x", "1,3,8,8", built.input_path]
    args += ["-w", tmp_path / "w"]
    first = _cli(*args, "--output_dirname", "first")
    assert first.returncode == 0, first.stderr
    engine = tmp_path / "w" / "inference_engine" / "first"
    again = _cli(
        *args,
        "--output_dirname",
        "again",
        "--golden_output_reference_directory",
        engine / "output" / "Result_0",
    )
    assert again.returncode == 0, again.stderr
    for proc in (first, again):
        console = proc.stdout + proc.stderr
        assert "LIBNATIVE" not in console and "Warning" not in console, console
        assert "report:" in proc.stderr
    for name in ("first", "again"):
        log = (tmp_path / "w" / "wrapper" / name / "log.txt").read_text()
        assert "LIBNATIVE" in log  # kept for the record, with the process it came from
    assert "LIBNATIVE" in (engine / "log.txt").read_text()


def test_help_draws_nothing_so_loads_no_plotting_library():
    """`--help` is the first command a user types: it loads no plotting library (matplotlib
    is the quantization checker's, imported when it draws) and no PyTorch."""
    code = (
        "import sys, contextlib, io\n"
        "from accdbg.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))\n"
    )
    assert fresh_python(code).strip().splitlines()[-1] == "[]"


# ---------------------------------------------------------------- -f against the model file


def _tflite_like(path) -> str:
    """A file with a TFLite flatbuffer's header (root offset, then the identifier TFL3)."""
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(56))
    return str(path)


@pytest.mark.parametrize(
    "component",
    [
        ["--framework_diagnosis"],
        ["--inference_engine", "-r", "htp"],
        [],
        ["--fix_search"],
        ["--quant_checker"],
    ],  # fmt: skip
    ids=["framework_diagnosis", "inference_engine", "wrapper", "fix_search", "quant_checker"],
)
def test_the_framework_flag_is_checked_against_the_model_file(tmp_path, capsys, component):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    fake = _tflite_like(tmp_path / "model.tflite")
    work = tmp_path / "w"
    inputs = ["-i", "x", "1,3,8,8", built.input_path, "-w", work]
    code, _, err = run_cli(capsys, *component, "-f", "onnx", "-m", fake, *inputs)
    line = one_line_error(err)
    assert code == 2 and f"'{fake}' is a TFLite model" in line, err
    assert "-f/--framework says onnx: give -f tflite" in line
    code, _, err = run_cli(capsys, *component, "-f", "tflite", "-m", built.path, *inputs)
    line = one_line_error(err)
    assert code == 2 and f"'{built.path}' is an ONNX model" in line, err
    assert "-f/--framework says tflite: give -f onnx" in line
    assert not work.exists()


def test_model_formats_are_told_from_their_bytes(tmp_path):
    from accdbg.frameworks.formats import model_format

    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(built.path.read_bytes())
    zipped = tmp_path / "net.pt2"
    import zipfile

    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("net/data.pkl", b"x")
    graph = tmp_path / "frozen.pb"
    graph.write_bytes(b"\x0a\x05\x0a\x01x\x12\x00")  # GraphDef: node { name: "x" op: "" }
    assert model_format(built.path) == "onnx" and model_format(renamed) is None
    assert model_format(_tflite_like(tmp_path / "odd.onnx")) == "tflite"  # the bytes win
    assert model_format(zipped) == "pytorch" and model_format(graph) == "tensorflow"
    assert model_format(tmp_path / "absent.onnx") is None


# ---------------------------------------------------------------- -o in every component


def test_the_oneshot_command_takes_any_component_flag(tmp_path):
    """A component flag added to the end-to-end command the user already has parses: the
    model's flags (-f -m -i -o, -l) are every model-running component's."""
    from accdbg.cli.main import parse_command

    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    listing = tmp_path / "list.txt"
    listing.write_text(f"{built.input_path}\n")
    oneshot = ["-f", "onnx", "-m", str(built.path), "-i", "x", "1,3,8,8", str(built.input_path),
               "-o", "conv0", "-l", str(listing)]  # fmt: skip
    for component, extra in (
        ("--framework_diagnosis", []),
        ("--inference_engine", ["-r", "htp"]),
        ("--fix_search", ["-r", "htp"]),
        ("--quant_checker", []),
    ):
        module, args = parse_command([*oneshot, *extra, component])
        assert module.NAME == component[2:] and args.output_tensor == ["conv0"], component
    module, args = parse_command(
        [
            *oneshot[:8],
            "-o",
            "conv0",
            "--deep_analyzer",
            "modelDissectionAnalyzer",
            "--inference_results",
            str(tmp_path),
            "--framework_results",
            str(tmp_path),
        ]
    )
    assert module.NAME == "deep_analyzer" and args.output_tensor == ["conv0"]


@pytest.mark.parametrize("component", ["--fix_search", "--quant_checker"])
def test_an_output_tensor_the_model_lacks_is_refused_before_anything(tmp_path, capsys, component):
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    work = tmp_path / "w"
    argv = [component, "-m", built.path, "-i", "x", "1,3,8,8", built.input_path, "-w", work]
    code, _, err = run_cli(capsys, *argv, "-o", "conv9")
    line = one_line_error(err)
    assert code == 2 and "-o/--output_tensor 'conv9' is not a tensor of the model" in line, err
    assert "near matches: conv0" in line and not work.exists()


def test_dims_of_another_rank_with_an_input_list_create_no_folder(tmp_path, capsys):
    """The end-to-end run refused for -i dims the model's rank does not take, with -l: the
    check runs before the wrapper's folder is created (it used to leave wrapper/<ts>.failed)."""
    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    listing = tmp_path / "list.txt"
    listing.write_text(f"x:={built.input_path}\n")
    work = tmp_path / "w"
    for component in ([], ["--inference_engine", "-r", "htp"]):
        code, _, err = run_cli(
            capsys, *component, "-f", "onnx", "-m", built.path, "-i", "x", "3,8,8",
            built.input_path, "-l", listing, "-w", work,
        )  # fmt: skip
        line = one_line_error(err)
        assert code == 2 and "'x': dims 3,8,8 have rank 3, the model expects rank 4" in line, err
        assert not work.exists()
