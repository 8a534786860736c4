#!/usr/bin/env bash
# Builds .gpu/ here (the host: PyPI, apt, the dev environment with the corpus wheels installed by
# device_scripts/setup_host.sh --test) for tests/gpu/run.sh on a bare GPU machine (no network, Python 3.12).
# Re-run it right before a device call if the layerdiff sources changed (run.sh also notices that, see
# SOURCES.sha256, and rebuilds layerdiff from the travelled tree there).
#   bash tests/gpu/prepare.sh            # everything
#   bash tests/gpu/prepare.sh wheel      # only the layerdiff wheel and its fingerprint
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD G=$ROOT/.gpu L=$ROOT/tests/gpu/lib  # scripts here, built artifacts in .gpu/ (ignored)
PY=${PREP_PYTHON:-python3}   # the dev environment (pnnx, rapidocr-onnxruntime, silero-vad, mediapipe installed)

fingerprint() {  # the layerdiff sources that travel (tracked + untracked-not-ignored), as run.sh hashes them
  "$PY" "$L/fingerprint.py" --here > "$G/SOURCES.sha256"
}

build_wheel() {
  rm -f "$G"/whl/layerdiff-*.whl
  "$PY" -m pip wheel -q --no-deps -w "$G/whl" . 2>&1 | grep -v '^WARNING: Location' || true
  ls "$G"/whl/layerdiff-*.whl >/dev/null
  fingerprint
}

if [ "${1:-}" = wheel ]; then build_wheel; du -sh "$G"; exit 0; fi

mkdir -p "$G/whl" "$G/deb/root" "$G/deb/vk" "$G/models"
# --- wheels for the GPU machine's Python 3.12 (cp312, manylinux x86-64), as the device README says.
# Not carried (already there, /work/.library/device/KINDS.md): numpy h5py pandas rich click matplotlib pillow
# onnx onnxruntime protobuf flatbuffers tqdm requests portalocker shellingham annotated-doc ml-dtypes
# typing-extensions packaging narwhals. adbutils/MNN/gguf: not imported by these runs (no phones, no .mnn/.gguf).
rm -f "$G"/whl/*.whl
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d "$G/whl" \
  ncnn==1.0.20261020 orjson==3.13.0 itables==2.9.1 typer==0.28.0 ai-edge-litert==2.3.0 backports.strenum==1.2.8 \
  2>&1 | grep -v '^WARNING: Location' || true
# plotly: the report inlines plotly.min.js only (analyzer/report/charts.py finds it without importing
# plotly); the whole wheel is 9.7 MB, so carry a wheel of that one file under the package name plotly.
tmp=$(mktemp -d); "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" plotly==7.1.0 2>&1 | grep -v '^WARNING: Location' || true
"$PY" "$L/plotly_js_wheel.py" "$tmp"/plotly-7.1.0-py3-none-any.whl "$G/whl"; rm -rf "$tmp"
build_wheel

# --- Debian packages: the Vulkan loader (+ GL loaders, the README's list) unpacked into / there only when
# the image has no libvulkan; vulkan-tools (vulkaninfo, which layerdiff runs) + its X/Wayland libraries
# unpacked into /tmp/vk there, never into /.
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
mkdir -p /tmp/amd64/partial; apt-get $o update >/dev/null
rm -f "$G"/deb/root/*.deb "$G"/deb/vk/*.deb
(cd "$G/deb/root" && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null 2>&1)
(cd "$G/deb/vk" && apt-get $o download vulkan-tools libx11-6 libxext6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0 \
   libwayland-client0 libffi8 >/dev/null 2>&1)
for f in "$G"/deb/*/*.deb; do   # plain file names only (letters, digits, . _ -): %3a (epoch) and + become _
  n=$(basename "$f" | sed 's/%3a/_/g; s/[^A-Za-z0-9._-]/_/g'); [ "$n" = "$(basename "$f")" ] || mv "$f" "$(dirname "$f")/$n"
done

# --- models: pretrained ONNX from the corpus wheels (tests/corpus.py), converted with pnnx as the tests do;
# .tflite from mediapipe 0.10.14 (tests/litert_models.py); inputs made by the tests' own makers.
rm -rf "$G/models"; mkdir -p "$G/models"
"$PY" "$L/make_models.py" "$G/models"
du -sh "$G"; du -sh "$G"/*
