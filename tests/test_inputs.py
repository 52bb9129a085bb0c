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
