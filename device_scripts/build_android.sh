#!/usr/bin/env bash
# Build layerdiff-harness for Android with the NDK (not exercised in CI: no NDK on our machines).
#
# Needs: ANDROID_NDK (r25 or newer; tested recipe: r26d), cmake >= 3.16, ninja, python3.
#   build_android.sh --abi arm64-v8a [--api 24] [--mnn-root DIR] [--no-ncnn] [--out DIR]
# ncnn: built from its PyPI source distribution with Vulkan on (Android ships libvulkan.so).
# MNN:  --mnn-root (or MNN_ROOT) names an MNN Android build or release with include/MNN/*.hpp
#       and libMNN.so in lib/<abi>/, libs/<abi>/ or lib/. Push libMNN.so, and libMNN_CL.so /
#       libMNN_Vulkan.so if MNN was built with MNN_SEP_BUILD, next to the harness on the phone:
#       the harness looks for the backend libraries beside itself (and LD_LIBRARY_PATH).
source "$(dirname "${BASH_SOURCE[0]}")/build_common.sh"
ABI="arm64-v8a"
API="24"
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --abi) ABI="$2"; shift 2 ;;
        --api) API="$2"; shift 2 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
LD_VULKAN="ON"
ld_parse_args "${ARGS[@]+"${ARGS[@]}"}"
case "$ABI" in
    arm64-v8a|armeabi-v7a) ;;
    *) echo "build_android.sh: --abi must be arm64-v8a or armeabi-v7a, got $ABI" >&2; exit 2 ;;
esac
if [ "$API" -lt 24 ]; then
    echo "build_android.sh: --api must be 24 or newer (Vulkan compute needs Android 7.0)" >&2; exit 2
fi
if [ -z "${ANDROID_NDK:-}" ] || [ ! -f "$ANDROID_NDK/build/cmake/android.toolchain.cmake" ]; then
    echo "build_android.sh: set ANDROID_NDK to an NDK (r25+) holding build/cmake/android.toolchain.cmake" >&2
    exit 2
fi
ld_defaults "android-$ABI"
LD_ABI="$ABI"
ANDROID_FLAGS=(-DCMAKE_TOOLCHAIN_FILE="$ANDROID_NDK/build/cmake/android.toolchain.cmake"
               -DANDROID_ABI="$ABI" -DANDROID_PLATFORM="android-$API" -DANDROID_STL=c++_static)
NCNN_ARCH_FLAGS=()
if [ "$ABI" = "armeabi-v7a" ]; then
    ANDROID_FLAGS+=(-DANDROID_ARM_NEON=ON)
else
    # Runtime dispatch keeps one binary fast on ARMv8.2 fp16 cores and safe on Cortex-A53.
    NCNN_ARCH_FLAGS+=(-DNCNN_RUNTIME_CPU=ON -DNCNN_ARM82=ON)
fi
ld_build_ncnn "${ANDROID_FLAGS[@]}" "${NCNN_ARCH_FLAGS[@]+"${NCNN_ARCH_FLAGS[@]}"}"
[ "$LD_NCNN_ONLY" = 1 ] || ld_build_harness "${ANDROID_FLAGS[@]}"
