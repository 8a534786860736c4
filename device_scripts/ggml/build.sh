#!/usr/bin/env bash
# Build layerdiff-ggml (device_scripts/ggml) against llama.cpp + ggml from llama-cpp-python's PyPI sdist.
#
#   build.sh --src LLAMA_CPP_DIR --out DIR --build-dir DIR [--target host|aarch64|android]
#            [--vulkan ON|OFF] [--opencl ON|OFF] [--abi arm64-v8a] [--jobs N] [--source-label TEXT]
#            [-- EXTRA CMAKE ARGS]   (e.g. -DOpenCL_INCLUDE_DIR=... -DOpenCL_LIBRARY=.../libOpenCL.so for android)
#
# Only the targets the harness links are compiled (ggml-base, ggml-cpu, llama; a GPU backend when
# asked). host: the host's CPU (GGML_NATIVE). aarch64: a static Linux binary for ARMv8.2-A with
# fp16 arithmetic (what phones run; runs under qemu-aarch64), cross-compiled with aarch64-linux-gnu-g++.
# android: the NDK ($ANDROID_NDK), with OpenCL (Adreno kernels) and/or Vulkan: not exercised here.
source "$(dirname "${BASH_SOURCE[0]}")/../build_common.sh"
GG_EXTRA=(); GG_SRC=""; GG_TARGET="host"; GG_VULKAN="OFF"; GG_OPENCL="OFF"; GG_ABI="arm64-v8a"; GG_LABEL="llama.cpp"
while [ $# -gt 0 ]; do
    case "$1" in
        --src) GG_SRC="$2"; shift 2 ;;
        --out) LD_OUT="$2"; shift 2 ;;
        --build-dir) LD_BUILD_DIR="$2"; shift 2 ;;
        --target) GG_TARGET="$2"; shift 2 ;;
        --vulkan) GG_VULKAN="$2"; shift 2 ;;
        --opencl) GG_OPENCL="$2"; shift 2 ;;
        --abi) GG_ABI="$2"; shift 2 ;;
        --jobs) LD_JOBS="$2"; shift 2 ;;
        --source-label) GG_LABEL="$2"; shift 2 ;;
        --) shift; GG_EXTRA=("$@"); break ;;
        -h|--help) sed -n 2,14p "$0"; exit 0 ;;
        *) echo "$(basename "$0"): unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -f "$GG_SRC/include/llama.h" ] || { echo "build.sh: --src $GG_SRC is not a llama.cpp tree" >&2; exit 2; }
[ -n "$LD_BUILD_DIR" ] || { echo "build.sh: --build-dir is required" >&2; exit 2; }
[ -n "$LD_OUT" ] || LD_OUT="$LD_BUILD_DIR/bin"
mkdir -p "$LD_BUILD_DIR" "$LD_OUT"
LD_BUILD_DIR="$(cd "$LD_BUILD_DIR" && pwd)"; LD_OUT="$(cd "$LD_OUT" && pwd)"

flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_SRC="$GG_SRC" -DLAYERDIFF_GGML_SOURCE="$GG_LABEL"
       -DGGML_VULKAN="$GG_VULKAN" -DGGML_OPENCL="$GG_OPENCL")
case "$GG_TARGET" in
    host)
        flags+=(-DGGML_NATIVE=ON)
        # ...without ggml's AMX kernels: CPUs in sandboxes (gVisor, some VMs) report AMX and grant
        # arch_prctl(XTILEDATA) yet trap the instructions (SIGILL in tinygemm_kernel_amx at the first
        # quantized mul_mat of a real model, seen here); phones have no AMX. Explicit -mno-* flags win
        # over -march=native whatever their order.
        if [ "$(uname -m)" = "x86_64" ]; then
            no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            flags+=("-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx")
        fi ;;
    aarch64)
        flags+=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
                -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++
                -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+fp16 -DLAYERDIFF_STATIC=ON) ;;
    android)
        [ -n "${ANDROID_NDK:-}" ] || { echo "build.sh: set ANDROID_NDK for --target android" >&2; exit 2; }
        flags+=(-DCMAKE_TOOLCHAIN_FILE="$ANDROID_NDK/build/cmake/android.toolchain.cmake" -DANDROID_ABI="$GG_ABI"
                -DANDROID_PLATFORM=android-28 -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+fp16
                -DGGML_OPENCL_USE_ADRENO_KERNELS=ON -DGGML_OPENCL_EMBED_KERNELS=ON) ;;
    *) echo "build.sh: unknown --target $GG_TARGET (host, aarch64, android)" >&2; exit 2 ;;
esac
# The build tree is shared by every checkout (llama.cpp compiles once); CMake refuses a tree configured
# from another checkout's harness folder, so forget only the configuration then (objects stay: the
# commands that compile llama.cpp do not name the checkout, so ninja keeps them).
cache_file="$LD_BUILD_DIR/cmake/CMakeCache.txt"
if [ -f "$cache_file" ] && ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$LD_SCRIPTS_DIR/ggml" "$cache_file"; then
    rm -rf "$cache_file" "$LD_BUILD_DIR/cmake/CMakeFiles"
fi
ld_quiet "$LD_BUILD_DIR/ggml-configure.log" \
    cmake -S "$LD_SCRIPTS_DIR/ggml" -B "$LD_BUILD_DIR/cmake" "${LD_GENERATOR[@]}" "${flags[@]}" "${GG_EXTRA[@]}"
ld_quiet "$LD_BUILD_DIR/ggml-build.log" cmake --build "$LD_BUILD_DIR/cmake" -j "$LD_JOBS" --target layerdiff-ggml
cp "$LD_BUILD_DIR/cmake/layerdiff-ggml" "$LD_OUT/layerdiff-ggml.partial"
mv "$LD_OUT/layerdiff-ggml.partial" "$LD_OUT/layerdiff-ggml"
echo "built $LD_OUT/layerdiff-ggml"
