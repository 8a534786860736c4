"""The layerdiff-ggml binary for a target, built on demand from llama-cpp-python's sdist into the cache.

Why like the ncnn harness: llama.cpp + ggml take minutes to compile, so the binary is built once per
(harness sources, build script, llama-cpp-python release, target, backends) and reused by every later
run, test session and CI step. The release is a field of the spec: the pinned one by default, another with
`--engine ggml==RELEASE` (its own source tree, build tree and binary, side by side with the pinned ones).
The CMake build directory is keyed without the harness sources, so editing device_scripts/ggml recompiles
those few files only, never llama.cpp. One builder at a time (file lock).

Cache layout (root: layerdiff's cache, ~/.cache/layerdiff):
    harness/src/llama.cpp-<release>/          llama.cpp + ggml from the sdist (fetch_source.py)
    harness/ggml-build-<target>-<options>/    CMake/ninja build tree (incremental; the options include the release)
    harness/ggml-<target>-<key>/layerdiff-ggml, build.log, builds.txt
$LAYERDIFF_GGML_BINARY names a prebuilt host binary to use as is for the pinned release (for every backend: its
--probe says which it has).
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from layerdiff.collector.harness.build import DEVICE_SCRIPTS, HarnessError, _locked, cache_root, run_build_script
from layerdiff.collector.harness.buildprogress import BuildReporter, default_reporter

PINNED_RELEASE = "0.3.36"  # the llama-cpp-python sdist whose vendor/llama.cpp is built by default (ggml 0.25.3)
SOURCE_PROJECT = "llama-cpp-python"  # the PyPI project whose sdists hold llama.cpp + ggml (vendor/llama.cpp)
# The oldest release whose llama.cpp the harness compiles against: older ones lack ggml APIs it calls (ggml_version,
# the SET_ROWS op); 0.3.12 to 0.3.16 take flash attention as a bool (compat/llama_flash_attn.h). Older releases are
# refused by collector/engines/ggml/releases.py before anything is fetched.
OLDEST_BUILDING = "0.3.12"
# How the `local` device's host engine (engine.py) is told the release `--engine ggml==RELEASE` asked for.
RELEASE_ENV = "LAYERDIFF_GGML_RELEASE"
GGML_DIR = DEVICE_SCRIPTS / "ggml"
SHARED_SOURCES = ("options", "engine", "npy", "sha256", "json", "json_read", "inject_source", "dump_writer", "sketch",
                  "plain_run", "sysutil")  # harness/src, reused
BUILD_MINUTES = {"host": 8, "aarch64": 10, "android": 12}  # measured on 2 busy cores: host CPU-only 7.3 min
# What ggml's Vulkan CMake needs beyond a compiler (Debian package -> what it provides): checked before a
# --vulkan build starts, so a missing one is one line naming the packages, not a CMake trace minutes in.
VULKAN_BUILD_PACKAGES = {"glslc": ("glslc",), "spirv-headers": ("share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake",
                                                                "lib/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake"),
                         "libvulkan-dev": ("include/vulkan/vulkan.h",)}


@dataclass(frozen=True)
class GgmlSpec:
    """What decides the binary: target (host, aarch64, android), the GPU backends compiled in, and the
    llama-cpp-python release whose llama.cpp + ggml it is built from."""

    target: str = "host"
    vulkan: bool = False
    opencl: bool = False
    release: str = PINNED_RELEASE


def sources_digest() -> str:
    """sha256 over every file the binary is built from (this repo's side)."""
    if not (GGML_DIR / "CMakeLists.txt").is_file():
        raise HarnessError(f"the ggml harness sources are missing from {GGML_DIR}; reinstall layerdiff")
    digest = hashlib.sha256()
    files = sorted(p for p in GGML_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".md")
    harness = DEVICE_SCRIPTS / "harness" / "src"
    files += [harness / f"{name}{ext}" for name in SHARED_SOURCES for ext in (".cpp", ".h")]
    files += [harness / "errors.h", DEVICE_SCRIPTS / "build_common.sh"]
    for path in files:
        digest.update(str(path.relative_to(DEVICE_SCRIPTS)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


# The compiler flags build.sh gives a target beyond the spec (host: no AMX kernels): part of the build
# tree's key, so a tree compiled with other flags is never half recompiled from another checkout.
TARGET_FLAGS = {"host": "native-no-amx"}


def _options_key(spec: GgmlSpec) -> str:
    # the release under the key name it always had, so the pinned release's trees keep their names
    options = {"llama_cpp_python": spec.release, **{k: v for k, v in asdict(spec).items() if k != "release"}}
    if spec.target in TARGET_FLAGS:
        options["flags"] = TARGET_FLAGS[spec.target]
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]


def binary_dir(spec: GgmlSpec) -> Path:
    key = hashlib.sha256((sources_digest() + _options_key(spec)).encode()).hexdigest()[:16]
    return cache_root() / "harness" / f"ggml-{spec.target}-{key}"


def build_dir(spec: GgmlSpec) -> Path:
    return cache_root() / "harness" / f"ggml-build-{spec.target}-{_options_key(spec)}"


def source_dir(release: str = PINNED_RELEASE) -> Path:
    return cache_root() / "harness" / "src" / f"llama.cpp-{release}"


def build_command(spec: GgmlSpec, out: Path) -> list[str]:
    """The build script invocation for `spec` (also what an error tells a user to run)."""
    return ["bash", str(GGML_DIR / "build.sh"), "--src", str(source_dir(spec.release)), "--out", str(out),
            "--build-dir", str(build_dir(spec)), "--target", spec.target,
            "--vulkan", "ON" if spec.vulkan else "OFF", "--opencl", "ON" if spec.opencl else "OFF",
            "--source-label", source_label(spec.release)]


def source_label(release: str) -> str:
    """Where the binary's llama.cpp came from, as the binary reports it in every dump's `engine_version`."""
    return f"{SOURCE_PROJECT} {release} sdist"


def fetch_source(release: str = PINNED_RELEASE) -> Path:
    """llama.cpp + ggml of `release` unpacked into the cache (once; later calls find it)."""
    dest = source_dir(release).parent
    if (source_dir(release) / "include" / "llama.h").is_file():
        return source_dir(release)
    fetch = [sys.executable, str(GGML_DIR / "fetch_source.py"), str(dest), "--version", release]
    with _locked(dest.parent / "src.lock"):
        result = subprocess.run(fetch, capture_output=True, text=True)
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"cannot fetch llama.cpp from PyPI ({detail}); run: {shlex.join(fetch)}")
    return source_dir(release)


def missing_vulkan_packages(prefixes: tuple[str, ...] = ("/usr", "/usr/local")) -> list[str]:
    """The Debian packages ggml's Vulkan build needs that are not here (none with $VULKAN_SDK: the SDK has all)."""
    if os.environ.get("VULKAN_SDK"):
        return []
    missing = []
    for package, provides in VULKAN_BUILD_PACKAGES.items():
        if package == "glslc":
            found = shutil.which("glslc") is not None
        else:
            found = any(Path(prefix, path).is_file() for prefix in prefixes for path in provides)
        if not found:
            missing.append(package)
    return missing


def check_vulkan_build(spec: GgmlSpec) -> None:
    """One line naming the missing packages before a host Vulkan build (android: the NDK brings glslc)."""
    missing = missing_vulkan_packages() if spec.vulkan and spec.target != "android" else []
    if missing:
        raise HarnessError(f"ggml's Vulkan build needs {', '.join(missing)}, missing here: install with "
                           f"`apt-get install {' '.join(missing)}` (or `bash device_scripts/setup_host.sh --ggml-vulkan`)")


def describe(spec: GgmlSpec) -> str:
    """The first line a user sees: what is built, why, how long."""
    incremental = (build_dir(spec) / "cmake" / "build.ninja").is_file()
    minutes = 1 if incremental else BUILD_MINUTES.get(spec.target, 10) * (3 if spec.vulkan else 1)
    gpu = "".join(f" with {name}" for name, on in (("Vulkan", spec.vulkan), ("OpenCL", spec.opencl)) if on)
    why = "the harness sources changed" if incremental else f"llama.cpp ({SOURCE_PROJECT} {spec.release}) is not built yet"
    return f"building the {spec.target} ggml harness{gpu}: {why}; about {minutes} min, once (cached in {binary_dir(spec)})"


def ensure_built(spec: GgmlSpec = GgmlSpec(), reporter: BuildReporter | None = None) -> Path:
    """The cached layerdiff-ggml for `spec`, built first if needed (progress on `reporter`)."""
    # it says which backends it has; a prebuilt binary stands for the pinned release only
    prebuilt = os.environ.get("LAYERDIFF_GGML_BINARY") if spec.target == "host" and spec.release == PINNED_RELEASE else None
    if prebuilt:
        if not Path(prebuilt).is_file():
            raise HarnessError(f"LAYERDIFF_GGML_BINARY={prebuilt} does not name a file: fix or unset it")
        return Path(prebuilt)
    out = binary_dir(spec)
    binary = out / "layerdiff-ggml"
    if binary.is_file():
        return binary
    if spec.target == "android" and not os.environ.get("ANDROID_NDK"):
        raise HarnessError(f"the android ggml harness needs the Android NDK; set ANDROID_NDK and run: "
                           f"{shlex.join(build_command(spec, out))}")
    check_vulkan_build(spec)
    with _locked(build_dir(spec).with_suffix(".lock")):
        if binary.is_file():
            return binary
        fetch_source(spec.release)
        out.mkdir(parents=True, exist_ok=True)
        cmd = build_command(spec, out)
        with open(out / "builds.txt", "a") as history:
            history.write(shlex.join(cmd) + "\n")
        ok = run_build_script(cmd, out / "build.log", describe(spec), reporter or default_reporter())
        if not ok or not binary.is_file():
            if spec.release != PINNED_RELEASE:  # another release's llama.cpp: its API may differ from what the harness calls
                raise HarnessError(f"the ggml harness did not build against {SOURCE_PROJECT} {spec.release}'s llama.cpp "
                                   f"(log: {out / 'build.log'}); releases known to build: {OLDEST_BUILDING} (oldest) "
                                   f"to {PINNED_RELEASE} (pinned)")
            raise HarnessError(f"building the ggml harness failed (log: {out / 'build.log'}); run: {shlex.join(cmd)}")
    return binary


def phone_spec(abi: str, backend: str, release: str = PINNED_RELEASE) -> GgmlSpec:
    """The build a phone with `abi` runs `backend` with: an arm64 phone's CPU gets the static aarch64 binary
    (no NDK; the armv8.2-a+fp16 kernels the `arm64` device runs), its Vulkan / OpenCL (Adreno) the NDK
    build; a phone (stand-in) with the host's ABI gets the host build."""
    from layerdiff.vocabulary import host_abi

    gpu = {"vulkan": backend == "vulkan", "opencl": backend == "opencl"}
    if abi == host_abi():
        return GgmlSpec("host", **gpu, release=release)
    if abi == "arm64-v8a":
        return GgmlSpec("android", **gpu, release=release) if backend != "cpu" else GgmlSpec("aarch64", release=release)
    raise HarnessError(f"no layerdiff-ggml build exists for ABI {abi!r} (ggml's phone builds: arm64-v8a, "
                       f"{host_abi()}; its fp16 kernels need ARMv8.2)")


def phone_harness(abi: str, backend: str, release: str = PINNED_RELEASE) -> Path:
    """layerdiff-ggml for a phone: cached, or built here for the CPU; a GPU build is never started inside a
    run (long; the android one needs $ANDROID_NDK): without one, one line saying what to set and run."""
    spec = phone_spec(abi, backend, release)
    if spec.target == "android" and not os.environ.get("ANDROID_NDK"):
        raise HarnessError(f"ggml's {backend} on an {abi} phone needs the Android NDK build of layerdiff-ggml: "
                           f"set ANDROID_NDK and run: {shlex.join(build_command(spec, binary_dir(spec)))}")
    binary = binary_dir(spec) / "layerdiff-ggml"
    if (spec.vulkan or spec.opencl) and not binary.is_file() and not (spec.target == "host" and os.environ.get("LAYERDIFF_GGML_BINARY")):
        flag = f"--target {spec.target} --{backend}" + (f" --release {release}" if release != PINNED_RELEASE else "")
        raise HarnessError(f"no ggml build with {backend} for {abi} here; build it once with `python -m "
                           f"layerdiff.collector.engines.ggml.build {flag}` or use --backend cpu")
    return ensure_built(spec)


def device_specs(devices: list, release: str = PINNED_RELEASE) -> list[GgmlSpec]:
    """The CPU builds these devices run: the host build for `local`, the static aarch64 build for `arm64`
    (qemu), a phone's CPU build for its ABI (a device that cannot say, or has no build, is left to its runs)."""
    from layerdiff.errors import LayerdiffError

    specs = set()
    for device in devices:
        try:
            info = device.info()
            kind = info.kind
            specs.add(GgmlSpec("aarch64", release=release) if kind == "qemu" else GgmlSpec(release=release)
                      if kind == "local" else phone_spec(info.abi, "cpu", release) if kind == "adb" and info.abi else None)
        except LayerdiffError:  # HarnessError included: an ABI without a build is reported by its runs
            continue
    return sorted((s for s in specs if s), key=lambda s: s.target)


def prebuild(devices: list) -> None:
    """The ggml engine is a C++ binary on every device (`device_specs`); built before the sweep's clock runs
    (a first build takes minutes), failures left to the runs to report."""
    for spec in device_specs(devices):
        try:
            ensure_built(spec)
        except HarnessError:
            continue


def arm64_harness(device, release: str = PINNED_RELEASE):
    """ggml's static aarch64 binary (ARMv8.2-A + fp16: its fp16 kernels, what phones run) under qemu."""
    from layerdiff.errors import DeviceError

    if not device.has_fp16_arithmetic:  # measured: cortex-a53 dies with SIGILL in ggml's fp16 kernels
        raise DeviceError(f"{device.serial}: ggml's aarch64 build needs ARMv8.2 fp16, which {device.cpu} lacks; "
                          "use --device arm64 (cortex-a76) or arm64:cortex-a55")
    try:
        binary = ensure_built(GgmlSpec("aarch64", release=release))
    except HarnessError as err:
        raise DeviceError(f"{device.serial}: {err}") from None
    built_from = f", {SOURCE_PROJECT} {release}" if release != PINNED_RELEASE else ""
    return device.emulated(binary, f"aarch64 ggml (static, armv8.2-a+fp16{built_from})")


def main(argv: list[str] | None = None) -> int:
    """`python -m layerdiff.collector.engines.ggml.build [--target host|aarch64|android] [--vulkan] [--opencl] [--release R]`:
    build (or find) layerdiff-ggml and print its path; warms the cache for CI and users."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m layerdiff.collector.engines.ggml.build",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("--target", default="host", choices=["host", "aarch64", "android"])
    parser.add_argument("--vulkan", action="store_true")
    parser.add_argument("--opencl", action="store_true")
    parser.add_argument("--release", default=PINNED_RELEASE,
                        help=f"the {SOURCE_PROJECT} release (PyPI sdist) whose llama.cpp is built (default {PINNED_RELEASE})")
    args = parser.parse_args(argv)
    try:
        print(ensure_built(GgmlSpec(args.target, args.vulkan, args.opencl, args.release)))
    except HarnessError as err:
        print(f"layerdiff: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
