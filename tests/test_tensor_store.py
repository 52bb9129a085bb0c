import json
import os

import numpy as np
import pytest

from accdbg.core.tensor_store import TensorFolder, TensorWriter, safe_relpath


@pytest.mark.parametrize(
    "name",
    [
        "../../etc/passwd",
        "/abs/path",
        "..",
        ".",
        "a/../../b",
        "a\0b",
        "x" * 600,
        "a\\..\\..\\b",
        "con:0",
        "..hidden",
        "",
        "a//b///c",
        "名字/张量",
    ],
)
def test_hostile_names_stay_inside(tmp_path, name):
    root = tmp_path / "run"
    w = TensorWriter(root)
    rec = w.write(name, np.zeros(3, np.float32))
    path = (root / rec.file).resolve()
    assert root.resolve() in path.parents
    assert path.is_file()
    assert all(len(part.encode()) <= 255 for part in path.relative_to(root.resolve()).parts)
    assert ".." not in rec.file.split("/")
    # nothing else appeared outside the run folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_slash_makes_subfolders(tmp_path):
    w = TensorWriter(tmp_path)
    w.write("inception_3a/1x1/bn", np.ones(2, np.float32))
    w.write("inception_3a/1x1/bn/sc", np.ones(2, np.float32))
    assert (tmp_path / "inception_3a/1x1/bn.raw").is_file()
    assert (tmp_path / "inception_3a/1x1/bn/sc.raw").is_file()


def test_collisions_after_sanitizing_get_distinct_files(tmp_path):
    w = TensorWriter(tmp_path)
    a = w.write("a:0", np.full(2, 1, np.float32))
    b = w.write("a?0", np.full(2, 2, np.float32))
    assert a.file != b.file
    w.save_manifest()
    f = TensorFolder(tmp_path)
    assert f.load("a:0").tolist() == [1, 1] and f.load("a?0").tolist() == [2, 2]


def test_manifest_records_native_dtype_and_shape(tmp_path):
    w = TensorWriter(tmp_path)
    w.write("ids", np.arange(6, dtype=np.int64).reshape(2, 3), node="n", op_type="Shape", index=0)
    w.save_manifest()
    data = json.loads((tmp_path / "tensors.json").read_text())
    rec = data["tensors"][0]
    assert rec["native_dtype"] == "int64" and rec["dtype"] == "float32" and rec["shape"] == [2, 3]
    assert os.path.getsize(tmp_path / rec["file"]) == 6 * 4
    np.testing.assert_array_equal(TensorFolder(tmp_path).load("ids"), np.arange(6).reshape(2, 3))


def test_folder_without_manifest_reads_raw_files(tmp_path):
    (tmp_path / "sub").mkdir()
    np.arange(4, dtype=np.float32).tofile(tmp_path / "sub" / "t.raw")
    f = TensorFolder(tmp_path)
    assert f.names() == ["sub/t"]
    assert f.load("sub/t").tolist() == [0, 1, 2, 3]


def test_safe_relpath_is_stable():
    assert safe_relpath("a/b:0") == "a/b_0"
    assert safe_relpath("conv2d_450.tmp_0") == "conv2d_450.tmp_0"


def test_a_full_disk_is_named_as_such_not_as_a_short_write(monkeypatch, capsys):
    """numpy reports /dev/full (a disk with no space) as "N requested and 0 written", no errno;
    the writer gives it ENOSPC, which the console prints as one line without the -v hint."""
    import errno
    from collections import namedtuple

    from accdbg.cli import main as cli
    from accdbg.core import tensor_store

    arr = np.zeros(1 << 16, np.float32)  # beyond stdio's buffer, so the write itself fails
    with pytest.raises(OSError) as plain:  # space left: numpy's own error is not relabelled
        tensor_store._write_raw(arr, tensor_store.Path("/dev/full"))
    assert plain.value.errno is None
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(tensor_store.shutil, "disk_usage", lambda p: usage(10, 10, 0))
    with pytest.raises(OSError) as full:
        tensor_store._write_raw(arr, tensor_store.Path("/dev/full"))
    assert full.value.errno == errno.ENOSPC and full.value.filename == "/dev/full"

    def fills(argv):
        raise full.value

    monkeypatch.setattr(cli, "_main", fills)
    assert cli.main(["--framework_diagnosis"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "qnn-accuracy-debugger: error: the disk is full (writing /dev/full): free some space and rerun"
    ]
