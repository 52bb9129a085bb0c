from tests.helpers import one_line_error, run_cli


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
