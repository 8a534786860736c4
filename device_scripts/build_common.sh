# Shared steps of build_host.sh, build_aarch64.sh and build_android.sh (sourced, not run).
#
# Why one file: the three targets differ only in toolchain and ncnn CPU options; fetching ncnn,
# building it once per option set (atomically, under a lock, so concurrent builds never share a
# half-built tree) and building the harness itself are the same everywhere.

set -euo pipefail

LD_SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LD_HARNESS_SRC="$LD_SCRIPTS_DIR/harness"

# Defaults; every one can be set on the command line (see ld_usage).
LD_OUT=""
LD_BUILD_DIR=""
LD_NCNN="ON"
LD_NCNN_PREFIX=""
LD_NCNN_SRC=""
LD_VULKAN="OFF"
LD_LAYERS=""
LD_TEST_BUILD=0
LD_MNN_ROOT="${MNN_ROOT:-}"
LD_PADDLE_LITE_ROOT="${PADDLE_LITE_ROOT:-}"
LD_JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
LD_NCNN_ONLY=0
# Ninja when installed (faster no-op rebuilds), else CMake's default Makefiles.
LD_GENERATOR=()
if command -v ninja >/dev/null 2>&1; then LD_GENERATOR=(-G Ninja); fi

ld_usage() {
    cat <<EOF
usage: $(basename "$0") [options]
  --out DIR           where layerdiff-harness is installed (default: build dir/bin)
  --build-dir DIR     scratch build directory (default: device_scripts/build/<target>)
  --ncnn-prefix DIR   ncnn install prefix; built there first if it holds no ncnn yet
  --ncnn-src DIR      unpacked ncnn source (default: fetched from PyPI into the build dir)
  --no-ncnn           build without the ncnn engine
  --mnn-root DIR      MNN build/release with include/ and lib/ (or env MNN_ROOT): adds the MNN engine
  --paddle-lite-root DIR  Paddle-Lite inference library, cxx/include + cxx/lib (or env PADDLE_LITE_ROOT):
                      adds the paddle-lite engine (env PADDLE_LITE_EXTRA_LIBS: libraries it needs but
                      does not link, ;-separated)
  --vulkan ON|OFF     ncnn Vulkan compute (target default: $LD_VULKAN)
  --layers A,B,...    build ncnn with only these layers (test builds; default: all layers)
  --test-build        ncnn without int8 and optional ISA variants: faster to build, for CI
  --jobs N            parallel compile jobs (default: $LD_JOBS)
  --ncnn-only         stop after building ncnn (to warm a cache)
EOF
}

ld_parse_args() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --out) LD_OUT="$2"; shift 2 ;;
            --build-dir) LD_BUILD_DIR="$2"; shift 2 ;;
            --ncnn-prefix) LD_NCNN_PREFIX="$2"; shift 2 ;;
            --ncnn-src) LD_NCNN_SRC="$2"; shift 2 ;;
            --no-ncnn) LD_NCNN="OFF"; shift ;;
            --mnn-root) LD_MNN_ROOT="$2"; shift 2 ;;
            --paddle-lite-root) LD_PADDLE_LITE_ROOT="$2"; shift 2 ;;
            --vulkan) LD_VULKAN="$2"; shift 2 ;;
            --layers) LD_LAYERS="$2"; shift 2 ;;
            --test-build) LD_TEST_BUILD=1; shift ;;
            --jobs) LD_JOBS="$2"; shift 2 ;;
            --ncnn-only) LD_NCNN_ONLY=1; shift ;;
            -h|--help) ld_usage; exit 0 ;;
            *) echo "$(basename "$0"): unknown option $1 (see --help)" >&2; exit 2 ;;
        esac
    done
}

ld_absolute() { mkdir -p "$1" && (cd "$1" && pwd); }

# ld_quiet LOG CMD...: run CMD with its output in LOG; on failure show the log's tail.
ld_quiet() {
    local log="$1"; shift
    # announce the step: the collector follows the log named here to show progress
    echo "layerdiff-build-step: $(basename "$log" .log) $log"
    if ! "$@" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "$(basename "$0"): failed: $* (full log: $log)" >&2
        exit 1
    fi
}

# ld_defaults TARGET: fill in directories derived from the target name.
ld_defaults() {
    local target="$1"
    [ -n "$LD_BUILD_DIR" ] || LD_BUILD_DIR="$LD_SCRIPTS_DIR/build/$target"
    LD_BUILD_DIR="$(ld_absolute "$LD_BUILD_DIR")"
    [ -n "$LD_OUT" ] || LD_OUT="$LD_BUILD_DIR/bin"
    LD_OUT="$(ld_absolute "$LD_OUT")"
    [ -n "$LD_NCNN_PREFIX" ] || LD_NCNN_PREFIX="$LD_BUILD_DIR/ncnn-install"
    if [ "$LD_NCNN" = "OFF" ] && [ -z "$LD_MNN_ROOT" ] && [ -z "$LD_PADDLE_LITE_ROOT" ]; then
        echo "$(basename "$0"): no engine selected: drop --no-ncnn or give --mnn-root or --paddle-lite-root" >&2
        exit 2
    fi
}

# ld_ncnn_source: print the ncnn source directory, fetching the PyPI sdist if none was given.
# A --ncnn-src that does not exist yet is fetched into its parent directory (the collector's
# cache layout), so the command the collector prints in its errors also works by hand.
ld_ncnn_source() {
    if [ -n "$LD_NCNN_SRC" ] && [ -f "$LD_NCNN_SRC/CMakeLists.txt" ]; then
        echo "$LD_NCNN_SRC"
    elif [ -n "$LD_NCNN_SRC" ]; then
        "${PYTHON:-python3}" "$LD_SCRIPTS_DIR/fetch_ncnn_source.py" "$(dirname "$LD_NCNN_SRC")" \
            --version "${LD_NCNN_SRC##*/ncnn-}"
    else
        "${PYTHON:-python3}" "$LD_SCRIPTS_DIR/fetch_ncnn_source.py" "$LD_BUILD_DIR/src"
    fi
}

# ld_layer_flags: cmake flags that turn every ncnn layer off except the --layers list.
ld_layer_flags() {
    [ -n "$LD_LAYERS" ] || return 0
    # ncnn's option is named after the lower-cased class: WITH_LAYER_convolution.
    local src="$1" name wanted
    wanted=",$(echo "$LD_LAYERS" | tr '[:upper:]' '[:lower:]'),"
    for name in $(sed -n 's/^ncnn_add_layer(\([A-Za-z0-9_]*\).*/\1/p' "$src/src/CMakeLists.txt" \
                  | tr '[:upper:]' '[:lower:]'); do
        case "$wanted" in
            *",$name,"*) echo "-DWITH_LAYER_$name=ON" ;;
            *) echo "-DWITH_LAYER_$name=OFF" ;;
        esac
    done
}

# ld_build_ncnn EXTRA_CMAKE_ARGS...: build and install ncnn into LD_NCNN_PREFIX unless it is there.
# Installs into a temporary prefix and renames it, under a lock, so a crash or a concurrent
# build never leaves a half-installed prefix that later builds would trust.
ld_build_ncnn() {
    [ "$LD_NCNN" = "ON" ] || return 0
    mkdir -p "$(dirname "$LD_NCNN_PREFIX")"
    exec 9>"$LD_NCNN_PREFIX.lock"
    flock 9
    if [ -f "$LD_NCNN_PREFIX/.complete" ]; then
        exec 9>&-
        return 0
    fi
    local src build partial
    src="$(ld_ncnn_source)"
    # Without NCNN_VERSION ncnn stamps its version with the build date; keep the PyPI version.
    local version="${src##*/ncnn-1.0.}" version_flag=()
    case "$version" in *[!0-9]*|"") ;; *) version_flag=(-DNCNN_VERSION="$version") ;; esac
    build="$LD_BUILD_DIR/ncnn-build"
    partial="$LD_NCNN_PREFIX.partial"
    rm -rf "$partial"
    local test_flags=()
    if [ "$LD_TEST_BUILD" = 1 ]; then
        test_flags=(-DNCNN_INT8=OFF -DNCNN_AVX=OFF -DNCNN_AVX2=OFF -DNCNN_AVX512=OFF -DNCNN_FMA=OFF
                    -DNCNN_F16C=OFF -DNCNN_XOP=OFF -DNCNN_AVXVNNI=OFF
                    -DNCNN_ARM82DOT=OFF -DNCNN_ARM82FP16FML=OFF -DNCNN_ARM84BF16=OFF
                    -DNCNN_ARM84I8MM=OFF -DNCNN_ARM86SVE=OFF)
    fi
    # shellcheck disable=SC2046
    ld_quiet "$LD_BUILD_DIR/ncnn-configure.log" \
    cmake -S "$src" -B "$build" "${LD_GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$partial" \
        -DNCNN_VULKAN="$LD_VULKAN" -DNCNN_BUILD_TOOLS=OFF -DNCNN_BUILD_EXAMPLES=OFF \
        -DNCNN_BUILD_BENCHMARK=OFF -DNCNN_BUILD_TESTS=OFF -DNCNN_PYTHON=OFF \
        -DNCNN_SHARED_LIB=OFF -DNCNN_PIXEL_DRAWING=OFF "${version_flag[@]}" \
        "${test_flags[@]}" $(ld_layer_flags "$src") "$@"
    ld_quiet "$LD_BUILD_DIR/ncnn-build.log" cmake --build "$build" -j "$LD_JOBS"
    ld_quiet "$LD_BUILD_DIR/ncnn-install.log" cmake --install "$build"
    touch "$partial/.complete"
    rm -rf "$LD_NCNN_PREFIX"
    mv "$partial" "$LD_NCNN_PREFIX"
    exec 9>&-
}

# ld_build_harness EXTRA_CMAKE_ARGS...: configure, build and install layerdiff-harness into LD_OUT.
ld_build_harness() {
    local build="$LD_BUILD_DIR/harness-build"
    local engine_flags=(-DLAYERDIFF_WITH_NCNN="$LD_NCNN")
    if [ "$LD_NCNN" = "ON" ]; then
        local ncnn_dir
        ncnn_dir="$(find -L "$LD_NCNN_PREFIX" -name ncnnConfig.cmake -printf '%h' -quit 2>/dev/null || true)"
        if [ -z "$ncnn_dir" ]; then
            echo "$(basename "$0"): no ncnnConfig.cmake under $LD_NCNN_PREFIX (remove it to rebuild ncnn)" >&2
            exit 1
        fi
        engine_flags+=(-Dncnn_DIR="$ncnn_dir")
    fi
    if [ -n "$LD_MNN_ROOT" ]; then
        engine_flags+=(-DLAYERDIFF_WITH_MNN=ON -DMNN_ROOT="$LD_MNN_ROOT")
    fi
    if [ -n "$LD_PADDLE_LITE_ROOT" ]; then
        engine_flags+=(-DLAYERDIFF_WITH_PADDLE_LITE=ON -DPADDLE_LITE_ROOT="$LD_PADDLE_LITE_ROOT"
                       -DPADDLE_LITE_EXTRA_LIBS="${PADDLE_LITE_EXTRA_LIBS:-}" -DPADDLE_LITE_VERSION="${PADDLE_LITE_VERSION:-unknown}")
    else
        engine_flags+=(-DLAYERDIFF_WITH_PADDLE_LITE=OFF)
    fi
    ld_quiet "$LD_BUILD_DIR/harness-configure.log" \
    cmake -S "$LD_HARNESS_SRC" -B "$build" "${LD_GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$LD_BUILD_DIR/harness-install" "${engine_flags[@]}" "$@"
    ld_quiet "$LD_BUILD_DIR/harness-build.log" cmake --build "$build" -j "$LD_JOBS"
    [ -z "$LD_MNN_ROOT" ] || ld_copy_mnn_libraries "${LD_ABI:-}"
    [ -z "$LD_PADDLE_LITE_ROOT" ] || [ -z "${LD_ABI:-}" ] || cp -f "$LD_PADDLE_LITE_ROOT"/cxx/lib/libpaddle_*_api_shared.so "$LD_OUT/"
    install -m 755 "$build/layerdiff-harness" "$LD_OUT/layerdiff-harness.partial"
    mv "$LD_OUT/layerdiff-harness.partial" "$LD_OUT/layerdiff-harness"
    echo "$LD_OUT/layerdiff-harness"
}

# ld_copy_mnn_libraries ABI: put libMNN*.so beside the harness. The collector stages every .so
# next to the binary on the phone, and the harness finds them there ($ORIGIN rpath, and its own
# dlopen of libMNN_CL.so / libMNN_Vulkan.so).
ld_copy_mnn_libraries() {
    local abi="$1" dir
    for dir in "$LD_MNN_ROOT/lib/$abi" "$LD_MNN_ROOT/libs/$abi" "$LD_MNN_ROOT/lib" "$LD_MNN_ROOT/libs"; do
        if [ -f "$dir/libMNN.so" ]; then
            cp -f "$dir"/libMNN*.so "$LD_OUT/"
            return 0
        fi
    done
}
