"""Tensor inspection: summary numbers against numpy, sampled CSVs, readable plots, encodings
from the manifest / AIMET / QNN JSON, hostile names, the CLI, and the real PP-OCRv4 det on QNN."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from accdbg.core.inputs import parse_input_tensor
from accdbg.core.tensor_store import TensorFolder, TensorRecord, TensorWriter
from accdbg.errors import AccdbgError
from accdbg.frameworks.diagnosis import run_framework_diagnosis
from accdbg.inspection import run_tensor_inspection
from accdbg.inspection.encodings import from_record
from accdbg.inspection.inspect import MAX_CSV_ROWS, Workers, assign_folders
from accdbg.inspection.plots import AXES_BOX, DPI, SIZE, Plotter, gaussian_kde
from tests.helpers import one_line_error, run_cli

PLOTS = ("Histograms.png", "Diff_plots.png", "CDF_plots.png", "Distribution_min-max.png")
CSVS = ("golden_data.csv", "target_data.csv")


def quantize(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """uint8 fake quantization, ONNX convention: q = clip(round(x/s) + zp, 0, 255)."""
    q = np.clip(np.rint(x / scale) + zero_point, 0, 255)
    return ((q - zero_point) * scale).astype(np.float32)


def sqnr(g: np.ndarray, t: np.ndarray) -> float:
    g, t = g.astype(np.float64).ravel(), t.astype(np.float64).ravel()
    signal, noise = np.sum(g**2), np.sum((g - t) ** 2)
    if noise == 0 or signal == 0:
        return math.inf if noise == 0 else -math.inf
    return 10 * math.log10(signal / noise)


def read_values(path: Path) -> tuple[str, pd.DataFrame]:
    with open(path, encoding="utf-8") as fh:
        first = fh.readline()
    return first, pd.read_csv(path, comment="#")


def png_pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        im.load()
        assert im.size == (int(SIZE[0] * DPI), int(SIZE[1] * DPI)), path
        return np.asarray(im.convert("RGB")).astype(int)


def check_png(path: Path) -> None:
    """A PNG of the plot size whose data was drawn inside the axes: frames and text are gray,
    data is colored (the colored legend sits outside the axes)."""
    left, top, right, bottom = AXES_BOX
    rgb = png_pixels(path)[top + 2 : bottom - 2, left + 2 : right - 2]
    colored = (np.abs(rgb[..., 0] - rgb[..., 1]) > 30) | (np.abs(rgb[..., 1] - rgb[..., 2]) > 30)
    assert colored.sum() > 50, f"{path}: no data drawn"


@pytest.fixture
def pair(tmp_path):
    """Golden and an 8-bit target with its encoding in the manifest; plus a float tensor
    without encoding, and one tensor on each side only."""
    rng = np.random.default_rng(3)
    g_act = (rng.standard_normal((1, 4, 8, 8)) * 2.0).astype(np.float32)
    g_act.flat[5] = 9.0  # beyond the calibrated range below: clipped on the target
    scale, zp = 0.03, 120
    t_act = quantize(g_act, scale, zp)
    g_float = rng.uniform(-1, 1, (2, 50)).astype(np.float32)
    t_float = (g_float * 1.01).astype(np.float32)
    golden, target = TensorWriter(tmp_path / "golden"), TensorWriter(tmp_path / "target")
    golden.write("conv/out", g_act, op_type="Conv", index=0)
    golden.write("fc", g_float, op_type="Gemm", index=1)
    golden.write("only_golden", g_float, index=2)
    target.write(
        "conv/out",
        t_act,
        op_type="Conv",
        index=0,
        quantized=True,
        scale=scale,
        zero_point=zp,
        offset=-zp,
        bitwidth=8,
        native_dtype="uint8",
    )
    target.write("fc", t_float, index=1)
    target.write("only_target", t_float, index=2)
    golden.save_manifest()
    target.save_manifest()
    return {
        "golden": tmp_path / "golden",
        "target": tmp_path / "target",
        "g_act": g_act,
        "t_act": t_act,
        "g_float": g_float,
        "t_float": t_float,
        "scale": scale,
        "zp": zp,
        "tmp": tmp_path,
    }


@pytest.mark.slow
def test_summary_numbers_match_numpy(pair):
    res = run_tensor_inspection(
        pair["golden"],
        pair["target"],
        verifiers=["sqnr", "CosineSimilarity", "rtolatol,rtolmargin,0.01,atolmargin,0.01"],
        working_dir=pair["tmp"] / "w",
        workers=1,
    )
    df = res.summary.set_index("Name")
    assert list(df.index) == ["conv/out", "fc"]  # in both folders only, in golden order
    g, t, s, zp = pair["g_act"], pair["t_act"], pair["scale"], pair["zp"]
    row = df.loc["conv/out"]
    assert row["golden_min"] == pytest.approx(float(g.min()))
    assert row["golden_max"] == pytest.approx(float(g.max()))
    assert row["target_min"] == pytest.approx(float(t.min()))
    assert row["target_max"] == pytest.approx(float(t.max()))
    cal_min, cal_max = s * (0 - zp), s * (255 - zp)
    assert row["calibrated_min"] == pytest.approx(cal_min)
    assert row["calibrated_max"] == pytest.approx(cal_max)
    assert row["target_min-calibrated_min"] == pytest.approx(float(t.min()) - cal_min)
    assert row["target_max-calibrated_max"] == pytest.approx(float(t.max()) - cal_max)
    clipped = np.count_nonzero((g < cal_min - s / 2) | (g > cal_max + s / 2))
    assert clipped >= 1
    assert row["golden_clipped_%"] == pytest.approx(100 * clipped / g.size)
    assert row["SQNR"] == pytest.approx(sqnr(g, t), rel=1e-9)
    gd, td = g.astype(np.float64).ravel(), t.astype(np.float64).ravel()
    cos = gd @ td / (np.linalg.norm(gd) * np.linalg.norm(td))
    assert row["CosineSimilarity"] == pytest.approx(cos, rel=1e-12)
    outside = np.count_nonzero(np.abs(td - gd) > 0.01 + 0.01 * np.abs(gd))
    assert row["RtolAtol"] == pytest.approx(100 * outside / g.size)
    assert row["calibrated_source"] == "manifest" and row["bitwidth"] == 8 and row["Status"] == "ok"

    fc = df.loc["fc"]
    assert math.isnan(fc["calibrated_min"]) and "Distribution_min-max.png skipped" in fc["Status"]
    assert fc["SQNR"] == pytest.approx(sqnr(pair["g_float"], pair["t_float"]), rel=1e-9)

    folder = res.run_dir / "conv" / "out"
    for name in PLOTS:
        check_png(folder / name)
    for name in PLOTS[:3]:
        check_png(res.run_dir / "fc" / name)
    assert not (res.run_dir / "fc" / "Distribution_min-max.png").exists()
    header, values = read_values(folder / "golden_data.csv")
    assert header.startswith("# ") and "all 256 values" in header
    assert list(values.columns) == ["index", "value"]
    assert np.array_equal(values["value"].to_numpy(np.float32), g.ravel())
    _, tv = read_values(folder / "target_data.csv")
    assert np.array_equal(tv["value"].to_numpy(np.float32), t.ravel())
    on_disk = pd.read_csv(res.run_dir / "summary.csv")
    assert on_disk["SQNR"].tolist() == pytest.approx(df["SQNR"].tolist())
    assert (res.run_dir / "log.txt").is_file() and (
        res.run_dir / "tensor_inspection_options.json"
    ).is_file()


def test_large_tensor_is_sampled(tmp_path):
    n = 300_000
    rng = np.random.default_rng(0)
    g = rng.standard_normal(n).astype(np.float32)
    t = (g + rng.normal(0, 0.01, n)).astype(np.float32)
    for side, arr in (("golden", g), ("target", t)):
        w = TensorWriter(tmp_path / side)
        w.write("big", arr.reshape(1, 3, 100, 1000), index=0)
        w.save_manifest()
    res = run_tensor_inspection(
        tmp_path / "golden",
        tmp_path / "target",
        working_dir=tmp_path / "w",
        max_plot_points=10_000,
        max_csv_rows=2_000,
        seed=5,
    )
    row = res.summary.iloc[0]
    assert row["Sampled"] == f"10000 of {n}"
    assert row["golden_min"] == pytest.approx(float(g.min()))  # statistics use every value
    assert row["SQNR"] == pytest.approx(sqnr(g, t), rel=1e-9)
    header, gv = read_values(res.run_dir / "big" / "golden_data.csv")
    _, tv = read_values(res.run_dir / "big" / "target_data.csv")
    assert "2,000 of 300,000" in header and "seed 5" in header
    assert len(gv) == len(tv) == 2_000
    idx = gv["index"].to_numpy()
    assert np.array_equal(idx, tv["index"].to_numpy()) and np.all(np.diff(idx) > 0)
    assert np.array_equal(gv["value"].to_numpy(np.float32), g[idx])
    assert np.array_equal(tv["value"].to_numpy(np.float32), t[idx])
    for name in PLOTS[:3]:
        check_png(res.run_dir / "big" / name)


def test_no_encodings_skips_density_with_a_log_line(tmp_path, caplog):
    rng = np.random.default_rng(1)
    for side in ("golden", "target"):
        (tmp_path / side).mkdir()
        for name in ("a", "b"):
            rng.standard_normal(64).astype(np.float32).tofile(tmp_path / side / f"{name}.raw")
    with caplog.at_level(logging.INFO, logger="accdbg"):
        res = run_tensor_inspection(
            tmp_path / "golden", tmp_path / "target", working_dir=tmp_path / "w"
        )
    log_lines = (res.run_dir / "log.txt").read_text().splitlines()
    assert any(
        "no calibrated ranges" in line and "Distribution_min-max.png" in line for line in log_lines
    )
    assert sorted(res.summary["Name"]) == ["a", "b"]
    assert res.summary["calibrated_min"].isna().all() and (res.summary["Status"] == "ok").all()
    for name in ("a", "b"):
        assert not (res.run_dir / name / "Distribution_min-max.png").exists()
        check_png(res.run_dir / name / "Histograms.png")
        g = np.fromfile(tmp_path / "golden" / f"{name}.raw", np.float32)
        t = np.fromfile(tmp_path / "target" / f"{name}.raw", np.float32)
        row = res.summary.set_index("Name").loc[name]
        assert row["SQNR"] == pytest.approx(sqnr(g, t), rel=1e-9)


def test_hostile_names_stay_inside_and_do_not_clash(tmp_path):
    names = [
        "../../evil",
        "/abs/path",
        "a",
        "a/Histograms.png",
        "A",
        "=cmd|' /C calc'!A0",
        r"$\frac{1}{0}$ {x}",
        "summary.csv",
        "log.txt",
        "x\ny",
        "..",
        "a/b",
    ]
    rng = np.random.default_rng(2)
    for side in ("golden", "target"):
        w = TensorWriter(tmp_path / side)
        for i, name in enumerate(names):
            w.write(name, rng.standard_normal((2, 3)).astype(np.float32), index=i)
        w.save_manifest()
    res = run_tensor_inspection(
        tmp_path / "golden", tmp_path / "target", working_dir=tmp_path / "w", workers=1
    )
    run = res.run_dir.resolve()
    assert len(res.summary) == len(names)
    folders = res.summary["Folder"].tolist()
    assert len({f.lower() for f in folders}) == len(folders)
    for name, folder in zip(res.summary["Name"], folders, strict=True):
        path = (run / folder).resolve()
        assert run in path.parents, (name, folder)
        check_png(path / "Histograms.png")
    assert (run / "summary.csv").is_file() and (run / "log.txt").is_file()
    # tensor "a" owns a/; tensor "a/Histograms.png" went elsewhere
    assert (run / "a" / "Histograms.png").is_file()
    assert not (tmp_path / "evil").exists() and not Path("/abs/path").exists()
    cells = pd.read_csv(run / "summary.csv")["Name"].tolist()
    assert "'=cmd|' /C calc'!A0" in cells
    assert not any(str(c).startswith(("=", "+", "-", "@")) for c in cells)


def test_assign_folders_never_puts_a_folder_on_a_file():
    out = assign_folders(["a/Histograms.png", "a", "A", "summary.csv"])
    assert out["a"] == "a"  # ... even when the clashing name comes first
    assert out["a/Histograms.png"] != "a/Histograms.png"
    assert out["A"].lower() != "a" and out["summary.csv"] != "summary.csv"


def test_target_encodings_from_aimet_and_qnn_json(tmp_path):
    rng = np.random.default_rng(4)
    g = rng.uniform(-1, 3, (1, 2, 4, 4)).astype(np.float32)
    for side in ("golden", "target"):
        w = TensorWriter(tmp_path / side)
        w.write("block.1/relu:0", g, index=0)
        w.save_manifest()
    scale, offset = 0.02, -60  # AIMET/QNN convention: real = scale * (q + offset)
    aimet = {
        "version": "1.0.0",
        "param_encodings": [],
        "activation_encodings": [
            {
                "name": "block.1/relu:0",
                "dtype": "INT",
                "enc_type": "PER_TENSOR",
                "bw": 8,
                "is_sym": False,
                "scale": [scale],
                "offset": [offset],
            }
        ],
    }
    (tmp_path / "enc.json").write_text(json.dumps(aimet))
    res = run_tensor_inspection(
        tmp_path / "golden",
        tmp_path / "target",
        target_encodings=tmp_path / "enc.json",
        working_dir=tmp_path / "w",
        output_dirname="aimet",
    )
    row = res.summary.iloc[0]
    assert row["calibrated_min"] == pytest.approx(scale * offset)
    assert row["calibrated_max"] == pytest.approx(scale * (offset + 255))
    assert row["calibrated_source"] == "aimet_1.0.0"
    check_png(res.run_dir / "block.1" / "relu_0" / "Distribution_min-max.png")

    # QNN renames the tensor (non-word characters become "_"); UFIXED_POINT_8 = 0x0408
    qnn = {
        "graph": {
            "tensors": {
                "block_1_relu_0": {
                    "id": 1,
                    "type": 3,
                    "data_type": 0x0408,
                    "dims": [1, 2, 4, 4],
                    "quant_params": {
                        "definition": 1,
                        "encoding": 0,
                        "scale_offset": {"scale": 0.05, "offset": -10},
                    },
                }
            },
            "nodes": {},
        }
    }
    (tmp_path / "model_net.json").write_text(json.dumps(qnn))
    res = run_tensor_inspection(
        tmp_path / "golden",
        tmp_path / "target",
        target_encodings=tmp_path / "model_net.json",
        working_dir=tmp_path / "w",
        output_dirname="qnn",
    )
    row = res.summary.iloc[0]
    assert row["calibrated_min"] == pytest.approx(0.05 * -10)
    assert row["calibrated_max"] == pytest.approx(0.05 * (255 - 10))
    assert row["calibrated_source"] == "qnn_json"


def test_integer_target_is_dequantized_with_its_encoding(tmp_path):
    rng = np.random.default_rng(5)
    q = rng.integers(0, 256, 100).astype(np.uint8)
    scale, offset = 0.1, -128
    g = (scale * (q.astype(np.float64) + offset) + rng.normal(0, 0.01, q.size)).astype(np.float32)
    (tmp_path / "golden").mkdir()
    (tmp_path / "target").mkdir()
    g.tofile(tmp_path / "golden" / "out.raw")
    q.tofile(tmp_path / "target" / "out.raw")
    enc = {
        "version": "0.6.1",
        "param_encodings": {},
        "activation_encodings": {
            "out": [
                {
                    "bitwidth": 8,
                    "dtype": "int",
                    "is_symmetric": "False",
                    "scale": scale,
                    "offset": offset,
                    "min": scale * offset,
                    "max": scale * (offset + 255),
                }
            ]
        },
    }
    (tmp_path / "enc.json").write_text(json.dumps(enc))
    res = run_tensor_inspection(
        tmp_path / "golden",
        tmp_path / "target",
        data_type="uint8",
        target_encodings=tmp_path / "enc.json",
        working_dir=tmp_path / "w",
    )
    row = res.summary.iloc[0]
    real = scale * (q.astype(np.float64) + offset)
    assert row["target_min"] == pytest.approx(real.min())
    assert row["target_max"] == pytest.approx(real.max())
    assert row["SQNR"] == pytest.approx(sqnr(g, real), rel=1e-6)
    assert "dequantized" in row["Status"]


def test_manifest_encoding_of_signed_storage():
    signed = TensorRecord(
        "t",
        "t.raw",
        "float32",
        [4],
        "float32",
        extra={"scale": 0.5, "zero_point": 0, "bitwidth": 8, "native_dtype": "int8"},
    )
    r = from_record(signed)
    assert (r.min, r.max) == (pytest.approx(-128 * 0.5), pytest.approx(127 * 0.5))
    qnn_style = TensorRecord(
        "t", "t.raw", "float32", [4], "float32", extra={"scale": 0.5, "offset": -3, "bitwidth": 8}
    )
    r = from_record(qnn_style)
    assert (r.min, r.max) == (pytest.approx(-1.5), pytest.approx(0.5 * 252))
    assert (
        from_record(
            TensorRecord("t", "t.raw", "float32", [4], "float32", extra={"quantized": False})
        )
        is None
    )


def test_binned_kde_matches_an_exact_gaussian_kde():
    rng = np.random.default_rng(6)
    x = rng.normal(1.0, 2.0, 400)
    grid, density = gaussian_kde(x, -8.0, 10.0, grid=512)
    h = np.std(x) * x.size**-0.2
    exact = np.exp(-0.5 * ((grid[:, None] - x[None, :]) / h) ** 2).sum(axis=1) / (
        x.size * h * math.sqrt(2 * math.pi)
    )
    assert np.max(np.abs(density - exact)) < 0.02 * exact.max()
    assert np.trapezoid(density, grid) == pytest.approx(1.0, abs=0.01)


def _plot_all(plotter: Plotter, out: Path, seed: int, spread: float) -> None:
    rng = np.random.default_rng(seed)
    golden = rng.normal(0.0, spread, 3000)
    target = golden + rng.normal(0.0, spread / 10, golden.size)
    out.mkdir(parents=True)
    lo, hi = plotter.value_span(golden, target, extra=(-spread, spread))
    panels = {
        "Histograms.png": plotter.histograms.update(golden, target, lo, hi),
        "Diff_plots.png": plotter.diff.update(golden, target, np.arange(golden.size), 0.01),
        "CDF_plots.png": plotter.cdf.update(golden, target, lo, hi),
        "Distribution_min-max.png": plotter.distribution.update(
            target, (float(target.min()), float(target.max())), (-spread, spread), lo, hi
        ),
    }
    plotter.save(out, f"tensor {seed}", "all 3,000 values", panels)


@pytest.mark.slow
def test_plots_of_one_tensor_carry_nothing_of_the_previous_one(tmp_path):
    """The plotter redraws only what changes over a kept background: a tensor drawn after
    another must give the very pixels a fresh plotter gives it."""
    reused = Plotter()
    _plot_all(reused, tmp_path / "first", seed=1, spread=50.0)
    _plot_all(reused, tmp_path / "reused", seed=2, spread=0.5)
    _plot_all(Plotter(), tmp_path / "fresh", seed=2, spread=0.5)
    for name in PLOTS:
        check_png(tmp_path / "reused" / name)
        a, b = png_pixels(tmp_path / "reused" / name), png_pixels(tmp_path / "fresh" / name)
        assert np.array_equal(a, b), name
        assert not np.array_equal(a, png_pixels(tmp_path / "first" / name)), name


@pytest.mark.slow
def test_copied_value_ticks_are_the_ones_each_plot_would_draw(tmp_path, monkeypatch):
    """Histograms, CDF and distribution share one x range, so their x ticks are drawn once
    and copied: the pictures must equal those of a plotter drawing every axis itself."""
    from accdbg.inspection import plots

    _plot_all(Plotter(), tmp_path / "copied", seed=4, spread=3.0)
    monkeypatch.setattr(plots, "SHARE_VALUE_AXIS", False)
    _plot_all(Plotter(), tmp_path / "drawn", seed=4, spread=3.0)
    for name in PLOTS:
        a, b = png_pixels(tmp_path / "copied" / name), png_pixels(tmp_path / "drawn" / name)
        assert np.array_equal(a, b), name
        left, _, right, bottom = AXES_BOX
        strip = a[bottom + 4 : bottom + 24, left:right]
        assert (strip.sum(axis=-1) < 500).sum() > 40, f"{name}: no tick labels"


def test_plots_keep_the_exact_plot_colors(tmp_path):
    """PNGs use one palette for all tensors; the pure colors of the background, golden,
    target and error must come through unchanged (a drifting palette would tint them)."""
    from matplotlib.colors import to_rgb

    _plot_all(Plotter(), tmp_path / "p", seed=3, spread=2.0)

    def has(name: str, color) -> bool:
        rgb = np.round(np.array(to_rgb(color)) * 255).astype(int)
        return bool(np.all(png_pixels(tmp_path / "p" / name) == rgb, axis=-1).any())

    fill = tuple(np.array(to_rgb("tab:blue")) * 0.45 + 0.55)  # the golden histogram, alpha 0.45
    assert has("Histograms.png", fill) and has("Histograms.png", "white")
    assert has("CDF_plots.png", "tab:blue") and has("Diff_plots.png", "tab:red")
    assert has("Distribution_min-max.png", "white") and has("Distribution_min-max.png", "black")


@pytest.mark.slow
def test_out_dir_and_worker_processes_agree(pair):
    one = run_tensor_inspection(
        pair["golden"], pair["target"], out_dir=pair["tmp"] / "ver" / "ti1", workers=1
    )
    two = run_tensor_inspection(
        pair["golden"], pair["target"], out_dir=pair["tmp"] / "ver" / "ti2", workers=2
    )
    with Workers(1) as pool:  # started ahead of the work, as the oneshot does
        pooled = run_tensor_inspection(
            pair["golden"], pair["target"], out_dir=pair["tmp"] / "ver" / "ti3", workers=pool
        )
        with pytest.raises(RuntimeError, match="serves one"):
            run_tensor_inspection(
                pair["golden"], pair["target"], out_dir=pair["tmp"] / "ver" / "ti4", workers=pool
            )
    assert not pool.folder.exists()
    assert one.run_dir == pair["tmp"] / "ver" / "ti1" and (one.run_dir / "summary.csv").is_file()
    pd.testing.assert_frame_equal(one.summary, two.summary)
    pd.testing.assert_frame_equal(one.summary, pooled.summary)
    for name in PLOTS:
        check_png(two.run_dir / "conv" / "out" / name)
    with pytest.raises(AccdbgError, match="already holds a tensor inspection"):
        run_tensor_inspection(pair["golden"], pair["target"], out_dir=pair["tmp"] / "ver" / "ti1")


def test_a_worker_nobody_sends_jobs_to_stops():
    """A pool left unused (the engine failed, say) must not leave processes behind."""
    pool = Workers(1)
    child = pool._children[0]._proc
    pool.close()
    assert child.poll() is not None and not pool.folder.exists()


def test_cli(pair, capsys):
    code, _, err = run_cli(
        capsys,
        "--tensor_inspection",
        "--golden_data",
        pair["golden"],
        "--target_data",
        pair["target"],
        "--verifier",
        "mse",
        "--verifier",
        "rtolatol,rtolmargin,0.01,atolmargin,0.01",
        "-w",
        pair["tmp"] / "w",
        "--output_dirname",
        "cli",
    )
    assert code == 0, err
    df = pd.read_csv(pair["tmp"] / "w" / "tensor_inspection" / "cli" / "summary.csv")
    g, t = pair["g_act"].astype(np.float64), pair["t_act"].astype(np.float64)
    assert df.set_index("Name").loc["conv/out", "MSE"] == pytest.approx(np.mean((g - t) ** 2))
    assert "RtolAtol" in df.columns

    g_dir, t_dir = pair["golden"], pair["target"]
    bad = [  # (golden, target, extra flags, expected in the one-line error)
        (pair["tmp"] / "nope", t_dir, [], "--golden_data"),
        (g_dir, t_dir, ["--verifier", "sqnrr"], "unknown verifier"),
        (g_dir, t_dir, ["--data_type", "int4"], "--data_type"),
        (g_dir, t_dir, ["--target_encodings", g_dir / "tensors.json"], "--target_encodings"),
        (g_dir, pair["tmp"] / "empty", [], "holds no tensors"),
        (g_dir, g_dir / "conv", [], "has the name of one of --golden_data"),
    ]
    (pair["tmp"] / "empty").mkdir()
    for golden, target, extra, expected in bad:
        argv = ["--golden_data", golden, "--target_data", target, "--verifier", "sqnr", *extra]
        code, _, err = run_cli(capsys, "--tensor_inspection", *argv, "-w", pair["tmp"] / "w")
        assert code == 2, err
        assert expected in one_line_error(err)


def test_engine_run_with_several_results_is_refused(pair):
    for i in range(2):
        (pair["tmp"] / "eng" / "output" / f"Result_{i}").mkdir(parents=True)
    with pytest.raises(AccdbgError, match="holds 2 inference results"):
        run_tensor_inspection(pair["golden"], pair["tmp"] / "eng", working_dir=pair["tmp"] / "w")


# ------------------------------------------------------------------ real model on QNN


@pytest.fixture(scope="module")
def det_runs(tmp_path_factory, ppocr_det, ppocr_small_input):
    from accdbg.engines import run_inference_engine

    tmp = tmp_path_factory.mktemp("ti_det")
    inputs = [parse_input_tensor(["x", "1,3,160,160", str(ppocr_small_input)])]
    golden = run_framework_diagnosis("onnx", ppocr_det, inputs, working_dir=tmp / "w")
    engine = run_inference_engine(ppocr_det, input_tensors=inputs, working_dir=tmp / "w")
    return golden.run_dir, engine.results[0], tmp


@pytest.mark.slow
def test_ppocr_det_engine_dump(det_runs):
    golden_dir, result, tmp = det_runs
    golden, target = TensorFolder(golden_dir), TensorFolder(result)
    both = [n for n in target.names() if n in golden.records]
    assert len(both) > 100
    names = both[:10] + [both[-1]]
    res = run_tensor_inspection(
        golden_dir, result, verifiers=["sqnr"], names=names, working_dir=tmp / "w"
    )
    df = res.summary.set_index("Name")
    assert sorted(df.index) == sorted(names)
    for name in names:
        extra = target.records[name].extra
        assert extra.get("quantized") and extra["native_dtype"] == "uint8"
        cal_min = extra["scale"] * (0 - extra["zero_point"])
        cal_max = extra["scale"] * (255 - extra["zero_point"])
        row = df.loc[name]
        assert row["calibrated_min"] == pytest.approx(cal_min)
        assert row["calibrated_max"] == pytest.approx(cal_max)
        t = target.load(name)
        g = golden.load(name)
        assert row["target_min"] == pytest.approx(float(t.min()))
        assert row["golden_max"] == pytest.approx(float(g.max()))
        assert row["SQNR"] == pytest.approx(sqnr(g, t), rel=1e-9)
        # the engine dumps values of its own grid, so they lie within the calibrated range
        tol = 1e-6 * max(1.0, abs(cal_min), abs(cal_max))  # float32 dump of a float64 grid
        assert cal_min - tol <= row["target_min"] and row["target_max"] <= cal_max + tol
        folder = res.run_dir / row["Folder"]
        for plot in PLOTS:
            check_png(folder / plot)
        _, values = read_values(folder / "target_data.csv")
        assert len(values) == min(t.size, MAX_CSV_ROWS)
        assert np.array_equal(
            values["value"].to_numpy(np.float32), t.reshape(-1)[values["index"].to_numpy()]
        )

    # the engine's QNN graph JSON, matched through QNN's names, gives the same ranges
    qnn = run_tensor_inspection(
        golden_dir,
        result,
        names=names,
        working_dir=tmp / "w",
        target_encodings=result.parent.parent / "model_net.json",
    )
    by_qnn = qnn.summary.set_index("Name")
    assert (by_qnn["calibrated_source"] == "qnn_json").all()
    for column in ("calibrated_min", "calibrated_max"):
        assert by_qnn.loc[names, column].tolist() == pytest.approx(
            df.loc[names, column].tolist(), rel=1e-5
        )


def test_bare_target_against_shaped_golden_is_not_compared_element_wise(tmp_path):
    rng = np.random.default_rng(8)
    g = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    w = TensorWriter(tmp_path / "golden")
    w.write("t", g, index=0)
    w.save_manifest()
    (tmp_path / "target").mkdir()
    np.transpose(g, (0, 2, 3, 1)).tofile(tmp_path / "target" / "t.raw")  # NHWC, as QNN may dump it
    res = run_tensor_inspection(
        tmp_path / "golden", tmp_path / "target", working_dir=tmp_path / "w"
    )
    row = res.summary.iloc[0]
    assert "target shape unknown" in row["Status"] and math.isnan(row["SQNR"])
    assert row["target_min"] == pytest.approx(float(g.min()))  # ranges need no alignment
    assert not (res.run_dir / "t" / "Diff_plots.png").exists()
    check_png(res.run_dir / "t" / "Histograms.png")


def test_each_job_is_claimed_by_one_process(tmp_path):
    from accdbg.inspection.inspect import Job, _claim

    job = Job(order=3, golden_name="a", target_name="a", folder="a", size=1)
    assert _claim(tmp_path, job) is True
    assert _claim(tmp_path, job) is False  # a second process skips it
    assert _claim(None, job) is True  # a single process does everything
