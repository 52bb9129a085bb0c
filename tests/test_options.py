"""Typed options and the one model-preparation pipeline.

The CLI parses each argument group once into a typed object; the Python API's flat keywords
build the same object; ``<component>_options.json`` is written from it by one function; and
the engine and snooping prepare the model through the same :func:`prepare_model`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from accdbg.cli.args import CommonArgs, ModelArgs
from accdbg.cli.inference_engine import EngineArgs
from accdbg.core.inputs import parse_input_tensor
from accdbg.core.run_dir import options_dict
from accdbg.engines import exposure
from accdbg.engines.options import (
    BackendOptions,
    DumpOptions,
    EngineConfig,
    InputOptions,
    LayerFilter,
    QuantOptions,
)
from accdbg.engines.pipeline import (
    Calibration,
    prepare_float,
    prepare_model,
    quantize_prepared,
    select_layers,
)
from accdbg.engines.source import build_feeds
from accdbg.errors import AccdbgError
from tests import models


def _parse(group, argv: list[str]):
    parser = argparse.ArgumentParser()
    group.add(parser)
    return group.parse(parser.parse_args(argv))


def test_engine_flags_parse_into_their_groups():
    config = _parse(
        EngineArgs(runtime_required=True),
        ["-r", "dspv73", "-abw", "16", "--per_channel_quantization", "-qo", "e.json",
         "--ignore_encodings", "--skip_layer_types", "Add, Relu", "--debug_mode_off",
         "--stage", "converted", "--engine", "SIMULATION"],
    )  # fmt: skip
    assert config.stage == "converted"
    assert config.quant == QuantOptions(
        act_bitwidth=16, per_channel=True, quantization_overrides="e.json", ignore_encodings=True
    )
    assert config.quant.overrides is None  # ignored
    assert config.backend == BackendOptions(engine="simulation", runtime="dspv73")
    assert config.layers == LayerFilter(skip_layer_types=("Add", "Relu"))
    assert config.dump == DumpOptions(debug=False)


def test_flag_defaults_are_the_dataclass_defaults():
    """One place for defaults: the wrapper's engine flags parse into EngineConfig()."""
    assert _parse(EngineArgs(runtime_required=False), []) == EngineConfig()
    assert EngineConfig().backend.runtime == "htp"
    with pytest.raises(SystemExit):  # the component requires -r, like the reference tool
        _parse(EngineArgs(runtime_required=True), [])


def test_api_keywords_build_the_same_config_and_round_trip():
    kw = dict(runtime="htp", act_bitwidth=16, per_channel=True, skip_layer_types="Add",
              debug=False, stage="converted", engine="simulation")  # fmt: skip
    config = EngineConfig.from_keywords(**kw)
    assert config.quant.act_bitwidth == 16 and config.quant.per_channel
    assert config.layers.skip_layer_types == ("Add",)
    assert config.dump.debug is False and config.stage == "converted"
    assert EngineConfig.from_keywords(**config.keywords()) == config
    assert set(config.keywords()) == set(EngineConfig.keyword_names())
    assert EngineConfig.coerce(config) is config
    assert EngineConfig.coerce(None) == EngineConfig()


def test_unknown_api_keyword_is_one_line_naming_it():
    with pytest.raises(AccdbgError) as info:
        EngineConfig.from_keywords(act_bitwdith=16)
    msg = str(info.value)
    assert "engine option 'act_bitwdith' is not known" in msg and "act_bitwidth" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "config, error",
    [
        (EngineConfig(stage="sauce"), "--stage 'sauce' is not known"),
        (EngineConfig(quant=QuantOptions(precision="int4")), "--precision 'int4' is not known"),
        (EngineConfig(quant=QuantOptions(bias_bitwidth=8)), "-bbw/--bias_bitwidth 8"),
        (EngineConfig(dump=DumpOptions(output_data_type="x")), "-odt 'x' is not known"),
        (EngineConfig(backend=BackendOptions(engine="tpu")), "--engine 'tpu' is not known"),
        (
            EngineConfig(quant=QuantOptions(quantization_overrides="/no/such.json")),
            "-qo/--quantization_overrides '/no/such.json' does not exist",
        ),
    ],
)
def test_config_check_names_the_flag(config, error):
    with pytest.raises(AccdbgError, match=error.replace("(", r"\(").replace(")", r"\)")):
        config.check()


def test_fp16_and_converted_do_not_check_the_quantizer():
    bad = QuantOptions(bias_bitwidth=8, precision="fp16")
    EngineConfig(quant=bad).check()
    EngineConfig(stage="converted", quant=QuantOptions(bias_bitwidth=8)).check()


def test_layer_filter_add_is_a_union_and_skip_removes():
    f = LayerFilter(add_layer_outputs="a", add_layer_types=["conv"], skip_layer_outputs=["c"])
    assert f.skip_reason({"a"}, "Relu") is None
    assert f.skip_reason({"b"}, "Conv") is None  # types are case-insensitive
    assert f.skip_reason({"b"}, "Relu") == "not in --add_layer_outputs/--add_layer_types"
    assert f.skip_reason({"c", "c_q"}, "Conv") == "in --skip_layer_outputs/--skip_layer_types"
    assert LayerFilter().skip_reason({"x"}, "Add") is None


def test_model_group_checks_the_framework_version_and_parses_inputs(tmp_path):
    raw = tmp_path / "x.raw"
    np.zeros(8, np.float32).tofile(raw)
    spec = _parse(ModelArgs(), ["-f", "ONNX", "-m", "m.onnx", "-i", "x", "2,4", str(raw)])
    assert spec.framework == "onnx" and spec.input_tensors[0].dims == (2, 4)
    with pytest.raises(AccdbgError, match="-f/--framework onnx 0.1: the installed version"):
        _parse(ModelArgs(), ["-f", "onnx", "0.1", "-m", "m.onnx", "-i", "x", "2,4", str(raw)])
    assert _parse(CommonArgs("c"), ["-w", "W"]).keywords() == {
        "working_dir": "W",
        "output_dirname": None,
    }


def test_options_record_is_flat_plain_json(tmp_path):
    config = EngineConfig.from_keywords(act_bitwidth=16, skip_layer_types="Add")
    np.zeros(8, np.float32).tofile(tmp_path / "x.raw")
    x = parse_input_tensor(["x", "2,4", str(tmp_path / "x.raw")])
    record = options_dict(config, model_path=tmp_path / "m.onnx", input_tensor=[x])
    assert record["act_bitwidth"] == 16 and record["runtime"] == "htp"
    assert record["skip_layer_types"] == ["Add"]  # tuples as lists
    assert record["model_path"] == str(tmp_path / "m.onnx")
    assert record["input_tensor"] == [["x", "2,4", str(tmp_path / "x.raw"), "float32"]]
    assert not any(isinstance(v, (QuantOptions, LayerFilter)) for v in record.values())
    names = {
        f.name
        for g in (QuantOptions, BackendOptions, LayerFilter, DumpOptions, InputOptions)
        for f in fields(g)
    }
    assert names | {"stage", "model_path", "input_tensor"} == set(record)


def _calibration(model: onnx.ModelProto, built: models.Built) -> Calibration:
    x = parse_input_tensor(
        [built.input_name, ",".join(map(str, built.dims)), str(built.input_path)]
    )
    calib = Calibration.from_inputs(model, None, [x])
    assert calib == Calibration(*build_feeds(model, None, [x]))
    return calib


def test_prepare_model_quantizes_variants_from_one_config(tmp_path):
    """The pipeline's entry point as a fix search would call it: one float model, two
    quantization variants, each in its own folder; the activations' zero points take the
    variant's bit width, and the float model it was quantized from is kept."""
    built = models.conv_net(tmp_path, layers=2)
    model = onnx.load(str(built.path))
    calib = _calibration(model, built)
    base = EngineConfig()
    p8 = prepare_model(model, "net", calib, base, tmp_path / "a8")
    p16 = prepare_model(model, "net", calib, base.with_quant(act_bitwidth=16), tmp_path / "a16")
    assert p8.path == tmp_path / "a8" / "net.qdq.onnx" and p8.quantized_here
    assert p8.float_model == tmp_path / "a8" / "net.prepared.onnx" and p8.float_model.is_file()
    assert not (tmp_path / "a8" / ".prepare").exists()  # intermediates removed

    def act_zero_point_types(path: Path) -> set:
        m = onnx.load(str(path))
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        weights = {i.name for i in m.graph.initializer}
        return {
            inits[n.input[2]].dtype.name
            for n in m.graph.node
            if n.op_type == "QuantizeLinear" and n.input[0] not in weights and len(n.input) > 2
        }

    assert act_zero_point_types(p8.path) == {"uint8"}
    assert act_zero_point_types(p16.path) == {"uint16"}
    assert any("A16W8" in s for s in p16.steps)
    fp16 = prepare_model(model, "net", calib, base.with_quant(precision="fp16"), tmp_path / "f")
    assert fp16.path.name == "net.fp16.onnx" and not fp16.quantized_here
    assert not any(n.op_type == "QuantizeLinear" for n in fp16.load().graph.node)


def test_one_prepared_model_quantized_with_per_tensor_overrides(tmp_path):
    """The fix search's and the checker's path: prepared once, then variants of it, one with
    a per-tensor override (TensorQuantOverrides, JSON form) that only its tensor takes."""
    built = models.conv_net(tmp_path, layers=2)
    model = onnx.load(str(built.path))
    calib = _calibration(model, built)
    prepared = prepare_float(model, "net", calib, tmp_path / "p")
    assert prepared.path == tmp_path / "p" / "net.prepared.onnx"
    assert not (tmp_path / "p" / ".prepare").exists()  # intermediates removed

    def zero_point_types(path: Path) -> dict[str, str]:
        m = onnx.load(str(path))
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        return {
            n.input[0]: inits[n.input[2]].dtype.name
            for n in m.graph.node
            if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits
        }

    plain = quantize_prepared(prepared.path, "plain", calib, QuantOptions(), tmp_path / "q")
    plain_types = zero_point_types(plain.path)
    graph_inputs = {i.name for i in onnx.load(str(prepared.path)).graph.input}
    target = next(n for n in plain_types if n not in graph_inputs)  # an activation QNN gets
    wide = quantize_prepared(
        prepared.path,
        "wide",
        Calibration.from_feeds(calib.feeds),  # as a child process rebuilds it
        QuantOptions(),
        tmp_path / "q",
        {target: [{"quant_type": "QUInt16"}]},
    )
    wide_types = zero_point_types(wide.path)
    assert plain_types[target] == "uint8" and wide_types[target] == "uint16"
    others = {k: v for k, v in wide_types.items() if k != target and k in plain_types}
    assert others and all(v == plain_types[k] for k, v in others.items())
    assert wide.path.name == "wide.qdq.onnx" and wide.float_model == prepared.path
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == [
        "plain.defects.json",  # what no encoding holds (none here), beside each model
        "plain.qdq.onnx",
        "wide.defects.json",
        "wide.qdq.onnx",
    ]


def test_select_layers_applies_the_same_filter_as_snooping(tmp_path):
    built = models.conv_net(tmp_path, layers=2)
    model = onnx.load(str(built.path))
    every = exposure.select(model)
    kept = select_layers(model, LayerFilter(skip_layer_types=("Relu",)))
    assert [e.name for e in kept] == [e.name for e in every if e.op_type != "Relu"]
    assert len(kept) < len(every)


def test_calibration_in_chunks_gives_the_ranges_of_every_line(tmp_path, monkeypatch):
    """Min/max calibration sees -l in chunks (bounded memory): the input's range is still the
    min and max over every line (numpy), with extremes in the first and the last chunk, and
    the QDQ model is the bytes of the unchunked calibration."""
    from accdbg.engines import quantize as Q

    assert [Q.calibration_stride(n) for n in (0, 1, 6, 37, 64, 200)] == [1, 1, 6, 1, 32, 25]
    built = models.conv_net(tmp_path, layers=2)
    model = onnx.load(str(built.path))
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(built.dims).astype(np.float32) for _ in range(6)]
    xs[0][0, 0, 0, 0], xs[5][0, 2, 3, 4] = -9.0, 11.0  # first chunk's low, last chunk's high
    lines = []
    for i, x in enumerate(xs):
        x.tofile(tmp_path / f"x{i}.raw")
        lines.append(str(tmp_path / f"x{i}.raw"))
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    x0 = parse_input_tensor([built.input_name, ",".join(map(str, built.dims)), lines[0]])
    calib = Calibration.from_inputs(model, tmp_path / "list.txt", [x0])

    monkeypatch.setattr(Q, "MAX_STRIDE", 2)  # 3 chunks of 2 lines
    assert Q.calibration_stride(6) == 2
    chunked = prepare_model(model, "net", calib, EngineConfig(), tmp_path / "chunked")
    monkeypatch.setattr(Q, "calibration_stride", lambda n: None)  # onnxruntime's whole pass
    whole = prepare_model(model, "net", calib, EngineConfig(), tmp_path / "whole")
    assert chunked.load().graph.SerializeToString() == whole.load().graph.SerializeToString()

    m = chunked.load()
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    (q,) = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x"]
    lo, hi = min(0.0, min(float(x.min()) for x in xs)), max(0.0, max(float(x.max()) for x in xs))
    assert lo == -9.0 and hi == 11.0
    np.testing.assert_allclose(float(inits[q.input[1]]), (hi - lo) / 255, rtol=1e-6)


def test_overrides_naming_only_tensors_pre_processing_removes_say_so(tmp_path):
    """-qo encodings written for the user's model can name tensors the model prepared for QNN
    no longer has (an Identity folded away): the error says which model lacks them and why,
    not that the user's model does."""
    built = models.conv_net(tmp_path, layers=2)
    model = onnx.load(str(built.path))
    first = model.graph.node[0]
    for node in model.graph.node[1:]:  # its consumers read the Identity's output
        node.input[:] = ["after_identity" if i == first.output[0] else i for i in node.input]
    model.graph.node.insert(
        1, onnx.helper.make_node("Identity", [first.output[0]], ["after_identity"])
    )
    enc = tmp_path / "user.encodings"
    entry = {"bitwidth": 8, "dtype": "int", "is_symmetric": "False", "min": -1.0, "max": 1.0}
    enc.write_text(
        json.dumps({"activation_encodings": {"after_identity": [entry]}, "param_encodings": {}})
    )
    config = EngineConfig().with_quant(quantization_overrides=str(enc))
    with pytest.raises(AccdbgError) as err:
        prepare_model(model, "net", _calibration(model, built), config, tmp_path / "out")
    message = str(err.value)
    assert "'after_identity'" in message and "as prepared for QNN (net.prepared.onnx" in message
    assert "\n" not in message


# ---------------------------------------------------------------- the reference's other flags


def test_restricted_quantization_steps_spread_onnxruntimes_ranges_over_them(tmp_path):
    """-rqs '-0x7F 0x7F' (254 steps) on 8-bit tensors, whose onnxruntime grids have 255 (and
    254 for symmetric weights): each encoding covers onnxruntime's range over 254 steps -
    the scale grows by 255/254, the zero point scales with it; the signed symmetric weights'
    grid is already 254 steps and its scale stays. '-0x80 0x7F' is onnxruntime's own 255:
    the model is the one quantized without the flag."""
    from accdbg.encodings.qdq import qdq_encodings

    built = models.conv_net(tmp_path, layers=2)
    model = onnx.load(str(built.path))
    calib = _calibration(model, built)
    base = EngineConfig()
    plain = qdq_encodings(prepare_model(model, "net", calib, base, tmp_path / "plain").path)
    rqs = base.with_quant(restrict_quantization_steps="-0x7F 0x7F")
    assert rqs.quant.restricts_steps and rqs.quant.own_steps() == {
        "activations": 255,
        "weights": 255,
    }
    got = qdq_encodings(prepare_model(model, "net", calib, rqs, tmp_path / "rqs").path)
    eight = [n for n, e in plain.items() if e.bitwidth == 8]
    assert len(eight) >= 5 and set(eight) <= set(got)
    for name in eight:
        a, b = plain[name], got[name]
        np.testing.assert_allclose(np.array(b.scale), np.array(a.scale) * 255 / 254, rtol=1e-6)
        want = [-round(-o * 254 / 255) for o in a.offset]  # unsigned: offset = -zero point
        assert list(b.offset) == want, name
    same = base.with_quant(restrict_quantization_steps="-0x80 0x7F")
    assert not same.quant.restricts_steps
    sym = base.with_quant(param_quantizer="symmetric", restrict_quantization_steps="-0x7F 0x7F")
    assert sym.quant.own_steps() == {"activations": 255, "weights": 254}


@pytest.mark.parametrize(
    "flags, error",
    [
        (["-rqs", "0x80"], "-rqs/--restrict_quantization_steps '0x80': expected 'MIN MAX'"),
        (["-rqs", "-0x80 zz"], "two hexadecimal literals"),
        (["-rqs", "0x7F -0x80"], "MAX - MIN must be 1 to 65535 steps; got -255"),
        (["-rqs", "-0x8000 0x7F7F"], "65407 steps, a 16-bit range; -abw 8 and -wbw 8 quantize no"),
        (["-fbw", "8"], "argument -fbw/--float_bias_bitwidth: invalid choice: 8"),
        (["--extra_contextbin_args", "op_packages"], "'op_packages' is not arg=value"),
        (["--extra_contextbin_args", "profiling_level=max"], "profiling_level 'max' is not known"),
        (
            ["--qnn_netruntime_config_file", "nope.json"],
            "qnn-net-run config file 'nope.json' does not exist",
        ),
    ],
)
def test_the_reference_flags_bad_values_are_one_line_errors(tmp_path, capsys, flags, error):
    from tests.helpers import one_line_error, run_cli

    built = models.conv_net(tmp_path, channels=4, size=8, layers=1)
    work = tmp_path / "w"
    code, _, err = run_cli(
        capsys, "--inference_engine", "-r", "htp", "-m", built.path, "-i", "x", "1,3,8,8",
        built.input_path, "-w", work, *flags,
    )  # fmt: skip
    assert code == 2 and error in one_line_error(err), err
    assert not work.exists()


def test_qnn_net_run_config_and_contextbin_args_become_provider_options(tmp_path, caplog):
    """qnn-net-run's config and its HTP backend extensions map onto the QNN execution
    provider's options; what has no counterpart is named, all in one line per flag; a mapped
    value contradicting a flag is refused."""
    import json

    ext = tmp_path / "htp_config.json"
    ext.write_text(json.dumps({
        "graphs": [{"graph_names": ["qnn_model"], "vtcm_mb": 8, "O": 3, "hvx_threads": 4}],
        "devices": [{"soc_model": 57, "dsp_arch": "v75", "cores": [{"perf_profile": "burst",
                     "rpc_control_latency": 100}]}],
    }))  # fmt: skip
    cfg = tmp_path / "netrun.json"
    cfg.write_text(json.dumps({
        "backend_extensions": {"shared_library_path": "libQnnHtpNetRunExtensions.so",
                               "config_file_path": "htp_config.json"},
        "context_configs": {"context_priority": "high", "async_execute_queue_depth": 4},
    }))  # fmt: skip
    with caplog.at_level("INFO", logger="accdbg"):
        config = EngineConfig.from_keywords(
            qnn_netruntime_config_file=str(cfg),
            extra_contextbin_args="profiling_level=detailed;op_packages=lib.so:Provider",
        )
    options = config.engine_options()
    assert options.extra_provider_options == {
        "qnn_context_priority": "high",
        "vtcm_mb": "8",
        "htp_graph_finalization_optimization_mode": "3",
        "soc_model": "57",
        "htp_arch": "75",
        "htp_performance_mode": "burst",
        "rpc_control_latency": "100",
    }
    assert options.profiling_level == "detailed"  # written to qnn_profiling.csv as the flag's
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    netrun, contextbin = lines
    assert netrun.startswith("--qnn_netruntime_config_file: mapped onto the QNN execution")
    assert "context_priority -> qnn_context_priority=high" in netrun
    assert "graphs.hvx_threads" in netrun and "context_configs.async_execute_queue_depth" in netrun
    assert "backend_extensions.shared_library_path" in netrun
    assert contextbin.startswith("--extra_contextbin_args: mapped onto")
    assert "op_packages (onnxruntime-qnn registers no QNN op package" in contextbin
    with pytest.raises(
        AccdbgError, match=r"devices.soc_model \(-> soc_model 57\) contradicts --soc_model"
    ):
        EngineConfig.from_keywords(qnn_netruntime_config_file=str(cfg), soc_model="43").check()
    with pytest.raises(
        AccdbgError, match=r"devices.dsp_arch \(-> htp_arch 75\) contradicts -r dspv73"
    ):
        EngineConfig.from_keywords(qnn_netruntime_config_file=str(cfg), runtime="dspv73").check()


def test_float_bias_bitwidth_16_rounds_the_biases_of_the_fp16_model(tmp_path, caplog):
    built = models.conv_net(tmp_path, layers=2)
    model = onnx.load(str(built.path))
    calib = _calibration(model, built)
    with caplog.at_level("INFO", logger="accdbg"):
        fp16 = EngineConfig.from_keywords(precision="fp16", float_bias_bitwidth=16)
        EngineConfig.from_keywords(float_bias_bitwidth=32)  # an int8 run: said to do nothing
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("-fbw/--float_bias_bitwidth 16: the Conv/ConvTranspose/Gemm biases")
    assert said[1].startswith("ignored: -fbw/--float_bias_bitwidth 32 (applies to a float run")
    prepared = prepare_model(model, "net", calib, fp16, tmp_path / "f")
    assert any("2 Conv/ConvTranspose/Gemm biases rounded to fp16" in s for s in prepared.steps)
    inits = {i.name: numpy_helper.to_array(i) for i in prepared.load().graph.initializer}
    original = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for b in ("b0", "b1"):
        assert inits[b].dtype == np.float32
        np.testing.assert_array_equal(inits[b], original[b].astype(np.float16).astype(np.float32))
        assert not np.array_equal(inits[b], original[b])  # rounded: it changed
    np.testing.assert_array_equal(inits["w0"], original["w0"])  # weights untouched


def test_native_output_files_are_odt_native_only():
    assert DumpOptions(use_native_output_files=True).data_type == "native_only"
    assert DumpOptions().data_type == "float_only"
    both = DumpOptions(use_native_output_files=True, output_data_type="float_and_native")
    assert both.data_type == "float_and_native"
