import numpy as np
import pytest

from accdbg.core.inputs import parse_input_list, parse_input_tensor
from accdbg.errors import AccdbgError


def test_input_tensor_default_dtype_and_size_check(tmp_path):
    p = tmp_path / "a.raw"
    np.zeros((1, 2, 3), np.float32).tofile(p)
    t = parse_input_tensor(["in", "1,2,3", str(p)])
    assert t.dtype == np.float32 and t.dims == (1, 2, 3) and t.load().shape == (1, 2, 3)
    bad = parse_input_tensor(["in", "1,2,4", str(p)])
    with pytest.raises(AccdbgError) as e:
        bad.load()
    msg = str(e.value)
    assert "24 bytes" in msg and "32" in msg and "'in'" in msg


def test_unknown_dtype(tmp_path):
    p = tmp_path / "a.raw"
    p.write_bytes(b"\0" * 4)
    with pytest.raises(AccdbgError, match="unknown .*dtype 'float33'"):
        parse_input_tensor(["in", "1", str(p), "float33"])


@pytest.mark.parametrize("dims", ["1,a,3", "0,3", ""])
def test_bad_dims(tmp_path, dims):
    p = tmp_path / "a.raw"
    p.write_bytes(b"\0" * 4)
    with pytest.raises(AccdbgError, match="dims"):
        parse_input_tensor(["in", dims, str(p)])


def test_input_list_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for n in ("a.raw", "b.raw", "c.raw"):
        (tmp_path / n).write_bytes(b"\0" * 4)
    lst = tmp_path / "list.txt"
    lst.write_text("#out1 out2\na.raw b.raw\n\nx:=c.raw y:=a.raw\n")
    parsed = parse_input_list(lst)
    assert parsed.output_names == ("out1", "out2")
    assert [n for n, _ in parsed.entries[0].items] == [None, None]
    assert [n for n, _ in parsed.entries[1].items] == ["x", "y"]
    assert parsed.entries[1].line_no == 4
    assert parsed.entries[1].items[0][1] == tmp_path / "c.raw"


def test_input_list_relative_to_list_folder(tmp_path, monkeypatch):
    d = tmp_path / "data"
    d.mkdir()
    (d / "a.raw").write_bytes(b"\0" * 4)
    (d / "list.txt").write_text("a.raw\n")
    monkeypatch.chdir(tmp_path)
    assert parse_input_list(d / "list.txt").entries[0].items[0][1] == d / "a.raw"


def test_input_list_missing_file_names_the_line(tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("# y\nnope.raw\n")
    with pytest.raises(AccdbgError, match=r"list.txt:2: input file .*nope.raw"):
        parse_input_list(lst)


def _with_bad_values(path, shape, bad: dict[int, float], dtype=np.float32):
    a = np.linspace(-1, 1, int(np.prod(shape)), dtype=dtype)
    for i, v in bad.items():
        a[i] = v
    a.tofile(path)
    return path


@pytest.mark.parametrize(
    "bad, nan, inf, first",
    [
        ({37: np.nan}, 1, 0, 37),
        ({5: np.inf}, 0, 1, 5),
        ({50: -np.inf, 9: np.nan, 51: np.nan}, 2, 1, 9),
    ],
)
def test_nonfinite_input_is_refused_with_file_counts_and_first_index(
    tmp_path, bad, nan, inf, first
):
    shape = (1, 2, 4, 8)
    p = _with_bad_values(tmp_path / "x.raw", shape, bad)
    t = parse_input_tensor(["img", "1,2,4,8", str(p)])
    with pytest.raises(AccdbgError) as e:
        t.check()
    msg = str(e.value)
    where = [int(i) for i in np.unravel_index(first, shape)]
    assert "'img'" in msg and str(p) in msg and "\n" not in msg
    assert f"{nan} NaN and {inf} Inf" in msg
    assert f"element {first}," in msg and f"index {where}" in msg
    assert "--allow_nonfinite_inputs" in msg
    t.check(allow_nonfinite=True)  # the flag accepts it


def test_nonfinite_scan_spans_chunks_and_ignores_integer_inputs(tmp_path, monkeypatch):
    import accdbg.core.inputs as inputs

    monkeypatch.setattr(inputs, "_SCAN_CHUNK", 7)  # many chunks: counts must add up
    p = _with_bad_values(
        tmp_path / "x.raw", (100,), {3: np.nan, 64: np.inf, 99: np.nan}, np.float16
    )
    assert inputs.count_nonfinite(p, np.dtype("float16")) == (2, 1, 3)
    ints = tmp_path / "i.raw"
    np.full(16, -1, np.int32).tofile(ints)
    parse_input_tensor(["ids", "16", str(ints), "int32"]).check()  # no NaN in integers
    clean = _with_bad_values(tmp_path / "c.raw", (10,), {})
    assert inputs.count_nonfinite(clean, np.dtype("float32")) == (0, 0, -1)


def test_a_path_with_a_space_is_refused_saying_how_to_give_it(tmp_path, monkeypatch):
    """qnn-net-run separates a line's entries by spaces: a path holding one is named as
    such (not as "mixes plain paths and name:=path pairs", what the split makes of it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my data").mkdir()
    (tmp_path / "my data" / "in 0.raw").write_bytes(b"\0" * 4)
    (tmp_path / "b.raw").write_bytes(b"\0" * 4)
    for line in ("x:=my data/in 0.raw y:=b.raw", "my data/in 0.raw b.raw"):
        lst = tmp_path / "list.txt"
        lst.write_text(f"{line}\n")
        with pytest.raises(AccdbgError) as e:
            parse_input_list(lst)
        msg = str(e.value)
        assert msg.startswith(f"{lst}:1: the path 'my data/in 0.raw' holds a space"), msg
        assert "separates a line's entries by spaces" in msg and "ln -s" in msg
        assert "in_0.raw" in msg and "mixes" not in msg
    # without a file that a space would explain, the errors stay what they were
    (tmp_path / "list.txt").write_text("x:=a.raw b.raw\n")
    with pytest.raises(AccdbgError, match="mixes plain paths and name:=path pairs"):
        parse_input_list(tmp_path / "list.txt")


def test_the_requested_outputs_are_o_then_the_hash_line(tmp_path):
    from accdbg.core.inputs import requested_outputs

    (tmp_path / "a.raw").write_bytes(b"\0" * 4)
    lst = tmp_path / "list.txt"
    lst.write_text(f"{tmp_path / 'a.raw'}\n#out2 out1\n")
    parsed = parse_input_list(lst)
    assert parsed.output_line == 2 and parsed.outputs_where == f"{lst}:2: '#' output tensor"
    assert requested_outputs(["out1", "logits"], parsed) == ("out1", "logits", "out2")
    assert requested_outputs((), None) == ()


def test_feeds_check_the_hash_line_and_the_dims_before_any_run(tmp_path):
    """What the engine, snooping and the quantization checker read an input list with
    refuses a '#' name the model lacks, and -i dims of another rank, before anything runs."""
    import onnx

    from accdbg.engines.source import build_feeds
    from tests import models

    built = models.conv_net(tmp_path, channels=4, size=8, layers=2)
    model = onnx.load(str(built.path))
    lst = tmp_path / "list.txt"
    lst.write_text(f"#conv1 conv7\n{built.input_path}\n")
    with pytest.raises(AccdbgError) as e:
        build_feeds(model, parse_input_list(lst), [])
    assert str(e.value).startswith(f"{lst}:1: '#' output tensor 'conv7' is not a tensor")
    flat = parse_input_tensor(["x", "192", str(built.input_path)])  # the file's size, rank 1
    with pytest.raises(AccdbgError, match=r"'x': dims 192 have rank 1, the model expects rank 4"):
        build_feeds(model, None, [flat])


def test_input_files_are_float32_converted_or_native_with_the_flag(tmp_path):
    """qnn-net-run's convention for the model's int32 input: without -nif a file holds
    float32 (whole numbers), converted; with -nif it holds int32, read as it is; an -i type
    saying otherwise is refused with -nif, and float32 values that are no int32 without it."""
    import onnx

    from accdbg.engines.source import build_feeds, load_feed
    from tests import models

    built = models.one_hot_dense(tmp_path)
    model = onnx.load(str(built.path))
    ids = np.fromfile(built.input_path, np.int32).reshape(1, 16)
    as_float = tmp_path / "ids_f32.raw"
    ids.astype(np.float32).tofile(as_float)
    floats = parse_input_tensor(["ids", "1,16", str(as_float)])
    (feed,), _, dtypes = build_feeds(model, None, [floats])
    assert feed["ids"][2:] == ("int32", "float32") and dtypes["ids"] == np.int32
    np.testing.assert_array_equal(load_feed(feed)["ids"], ids)
    assert load_feed(feed)["ids"].dtype == np.int32
    native = parse_input_tensor(["ids", "1,16", str(built.input_path)])
    (feed,), _, _ = build_feeds(model, None, [native], native=True)
    assert feed["ids"][2:] == ("int32", "int32")
    np.testing.assert_array_equal(load_feed(feed)["ids"], ids)
    # an input list without -i: its files float32 unless -nif
    lst = tmp_path / "list.txt"
    lst.write_text(f"{as_float}\n")
    (feed,), _, _ = build_feeds(model, parse_input_list(lst), [])
    np.testing.assert_array_equal(load_feed(feed)["ids"], ids)
    lst.write_text(f"{built.input_path}\n")  # int32 bytes read as float32: no whole numbers
    with pytest.raises(AccdbgError) as e:
        build_feeds(model, parse_input_list(lst), [])
    msg = str(e.value)
    assert msg.startswith(f"{lst}:1: input 'ids': raw file '{built.input_path}' holds float32")
    assert "-nif/--use_native_input_files" in msg
    (feed,), _, _ = build_feeds(model, parse_input_list(lst), [], native=True)
    np.testing.assert_array_equal(load_feed(feed)["ids"], ids)
    typed = parse_input_tensor(["ids", "1,16", str(as_float), "float32"])
    with pytest.raises(AccdbgError, match="names its file's type float32, but -nif"):
        build_feeds(model, None, [typed], native=True)


def test_a_float32_value_that_fits_no_model_type_is_named(tmp_path):
    from accdbg.core.inputs import read_input

    p = tmp_path / "x.raw"
    np.array([1.0, 2.5, 3.0], np.float32).tofile(p)
    with pytest.raises(AccdbgError, match=r"first np.float32\(2.5\) at element 1"):
        read_input(p, (3,), np.dtype(np.int64), np.dtype(np.float32), "input 'x'")
    np.array([0.0, 1.0, 300.0], np.float32).tofile(p)
    with pytest.raises(AccdbgError, match="element 2"):
        read_input(p, (3,), np.dtype(np.uint8), np.dtype(np.float32), "input 'x'")
    with pytest.raises(AccdbgError, match="no bool"):
        read_input(p, (3,), np.dtype(bool), np.dtype(np.float32), "input 'x'")
    np.array([0.0, 1.0, 1e5], np.float32).tofile(p)
    with pytest.raises(AccdbgError, match="no float16"):  # beyond float16's range
        read_input(p, (3,), np.dtype(np.float16), np.dtype(np.float32), "input 'x'")
    got = read_input(p, (3,), np.dtype(np.int32), np.dtype(np.float32), "input 'x'")
    assert got.dtype == np.int32 and got.tolist() == [0, 1, 100000]


def test_the_command_line_resolves_the_input_types_once_for_every_component(tmp_path):
    """-nif is an engine flag, but framework diagnosis reads the same -i files: the end-to-end
    run resolves them against the ONNX model once (ModelArgs), for both."""
    from accdbg.cli import wrapper
    from accdbg.cli.main import parse_command
    from tests import models

    built = models.one_hot_dense(tmp_path)
    _, args = parse_command(["-f", "onnx", *map(str, built.flags(framework=False)), "-nif"])
    (t,) = wrapper.MODEL.parse(args).input_tensors
    assert t.dtype == np.int32 and t.file_dtype is None and t.load().dtype == np.int32
    as_float = tmp_path / "f.raw"
    np.fromfile(built.input_path, np.int32).astype(np.float32).tofile(as_float)
    _, args = parse_command(
        ["-f", "onnx", "-m", str(built.path), "-i", "ids", "1,16", str(as_float)]
    )
    (t,) = wrapper.MODEL.parse(args).input_tensors
    assert t.dtype == np.int32 and t.file_dtype == np.float32
    np.testing.assert_array_equal(t.load(), np.fromfile(built.input_path, np.int32).reshape(1, 16))
    assert wrapper.ENGINE.parse(args).inputs.use_native_input_files is False
