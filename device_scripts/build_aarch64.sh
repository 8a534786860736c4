#!/usr/bin/env bash
# Build a static aarch64 Linux layerdiff-harness with Debian's g++-aarch64-linux-gnu.
# Static, so it runs on an Android phone's CPU without the NDK and here under qemu-aarch64.
# CPU only: a static binary cannot load the Vulkan loader. ncnn is built with runtime CPU
# dispatch and the ARMv8.2 fp16 kernels, so one binary runs fp16 where the CPU has it and still
# runs on a Cortex-A53 (NCNN_RUNTIME_CPU=OFF with NCNN_ARM82=ON dies with SIGILL there).
source "$(dirname "${BASH_SOURCE[0]}")/build_common.sh"
ld_parse_args "$@"
if [ "$LD_VULKAN" != "OFF" ]; then
    echo "build_aarch64.sh: the static aarch64 harness is CPU only (no Vulkan loader); drop --vulkan" >&2
    exit 2
fi
ld_defaults aarch64
TOOLCHAIN="$LD_SCRIPTS_DIR/cmake/aarch64-linux-gnu.toolchain.cmake"
ld_build_ncnn -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" -DNCNN_RUNTIME_CPU=ON -DNCNN_ARM82=ON \
    -DNCNN_SIMPLEOCV=OFF
[ "$LD_NCNN_ONLY" = 1 ] || ld_build_harness -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" -DLAYERDIFF_STATIC=ON
