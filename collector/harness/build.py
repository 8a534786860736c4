"""Pick the C++ harness binary for a device ABI and engine, building it on demand into a cache.

Why a cache keyed by content: building ncnn takes minutes, so a binary is built once per
(harness sources, build scripts, target, options) and reused by every later run, test session
and CI step; a change to any of those gives a new key, never a stale binary. ncnn itself is
cached separately (keyed by its version and build options) so editing the harness sources does
not rebuild ncnn. Concurrent callers serialise on a file lock so only one of them builds.

Cache layout (root: layerdiff.cache.user_cache_root(), i.e. $LAYERDIFF_CACHE, else
$XDG_CACHE_HOME/layerdiff, else ~/.cache/layerdiff):
    harness/src/ncnn-<version>/            the ncnn sdist from PyPI, unpacked
    harness/ncnn-<target>-<key>/           ncnn installed for one target and option set
    harness/<target>-<key>/layerdiff-harness
    harness/<target>-<key>/build.log       output of the last build
    harness/<target>-<key>/builds.txt      one line per build run (command)
A prebuilt binary can be named per ABI with $LAYERDIFF_HARNESS_<ABI> (e.g.
LAYERDIFF_HARNESS_ARM64_V8A=/path/layerdiff-harness); it is then used as is.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from layerdiff.vocabulary import PHONE_ABIS, host_abi
from layerdiff.cache import user_cache_root
from layerdiff.errors import HarnessError
from layerdiff.collector.harness import children
from layerdiff.collector.harness.buildprogress import BuildReporter, BuildWatcher, default_reporter, estimate_minutes
from layerdiff import device_scripts

# Installed as layerdiff.device_scripts by the wheel and sdist (package data), as in a checkout.
DEVICE_SCRIPTS = Path(device_scripts.__file__).resolve().parent
NCNN_VERSION = "1.0.20261020"
# Bump when the ncnn CMake options in device_scripts/build_*.sh change: it keys cached ncnn builds.
NCNN_RECIPE = 2
TARGET_SCRIPTS = {"host": "build_host.sh", "aarch64": "build_aarch64.sh", "android": "build_android.sh"}


@dataclass(frozen=True)
class HarnessSpec:
    """Everything that decides which binary gets built.

    target: "host", "aarch64" (static Linux, runs on phones' CPUs and under qemu) or
    "android-<abi>" (NDK build, needed for OpenCL/Vulkan on phones).
    test_build: ncnn without int8 and optional ISA variants, built faster for tests and CI.
    ncnn_layers: build ncnn with only these layers (None: all layers).
    """

    target: str
    with_ncnn: bool = True
    mnn_root: str | None = None
    vulkan: bool = False
    test_build: bool = False
    ncnn_layers: tuple[str, ...] | None = None
    paddle_lite_root: str | None = None  # Paddle-Lite inference library (PADDLE_LITE_ROOT): the paddle-lite engine


def cache_root() -> Path:
    """Root of layerdiff's caches, shared with the analyzer's conversion and results cache."""
    return user_cache_root()


def phone_target(abi: str) -> str:
    """The build target of the C++ harness for a device with `abi` that needs a full build (GPU backends, a
    linked engine library): the host's own build, or the NDK build for an Android ABI."""
    if abi == host_abi():
        return "host"
    if abi in PHONE_ABIS:
        return f"android-{abi}"
    raise HarnessError(f"no layerdiff harness build exists for ABI {abi!r} "
                       f"(supported: {', '.join(PHONE_ABIS)}, {host_abi()})")


def wants_test_build(test_build: bool | None) -> bool:
    """test_build None reads $LAYERDIFF_HARNESS_TEST_BUILD ("1": the faster CI build, which is what the test
    suite builds anyway, so a CI run never builds both variants)."""
    return os.environ.get("LAYERDIFF_HARNESS_TEST_BUILD", "") == "1" if test_build is None else test_build


def ncnn_key(spec: HarnessSpec) -> str:
    """Cache key of the ncnn library a spec links against."""
    layers = sorted(spec.ncnn_layers) if spec.ncnn_layers else None
    recipe = {"recipe": NCNN_RECIPE, "ncnn": NCNN_VERSION, "target": spec.target, "vulkan": spec.vulkan,
              "layers": layers, "test_build": spec.test_build}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _check_device_scripts() -> None:
    """The harness sources ship with the package; without them nothing can be built (a broken install)."""
    if not (DEVICE_SCRIPTS / "harness" / "CMakeLists.txt").is_file():
        raise HarnessError(f"the harness sources are missing from {DEVICE_SCRIPTS}; reinstall layerdiff "
                           "(pip install --force-reinstall layerdiff) or run from a checkout")


# Harness source files that belong to one engine (by file name prefix); every other file is common.
ENGINE_SOURCE_PREFIXES = {"ncnn": "ncnn_", "mnn": "mnn_", "paddle-lite": "paddle_lite"}


def spec_engines(spec: HarnessSpec) -> set[str]:
    return {name for name, on in (("ncnn", spec.with_ncnn), ("mnn", bool(spec.mnn_root)),
                                  ("paddle-lite", bool(spec.paddle_lite_root))) if on}


def sources_digest(engines: set[str] | None = None) -> str:
    """sha256 over the harness sources and build scripts: any edit gives a new binary.

    An engine's own files (`mnn_*`, `ncnn_*`, `paddle_lite*`) count only for builds with that engine
    (None: every file), so working on one engine never invalidates the others' binaries (the ncnn
    build is a 10-minute rebuild)."""
    _check_device_scripts()
    digest = hashlib.sha256()
    def counts(path: Path) -> bool:
        owner = next((e for e, prefix in ENGINE_SOURCE_PREFIXES.items() if path.name.startswith(prefix)), None)
        return owner is None or engines is None or owner in engines

    files = sorted(p for p in (DEVICE_SCRIPTS / "harness").rglob("*") if p.is_file() and counts(p))
    files += sorted(DEVICE_SCRIPTS.glob("build_*.sh")) + sorted((DEVICE_SCRIPTS / "cmake").glob("*"))
    for path in files:
        digest.update(str(path.relative_to(DEVICE_SCRIPTS)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def harness_key(spec: HarnessSpec) -> str:
    """Cache key of a harness binary: sources + spec + the ncnn it links."""
    mnn_lib = _mnn_library_stamp(spec.mnn_root) if spec.mnn_root else None
    recipe = {"sources": sources_digest(spec_engines(spec)), "spec": asdict(spec), "ncnn": ncnn_key(spec), "mnn": mnn_lib}
    if spec.paddle_lite_root:
        recipe["paddle_lite"] = _library_stamp(spec.paddle_lite_root, "libpaddle_*") + [os.environ.get("PADDLE_LITE_EXTRA_LIBS", "")]
    else:
        del recipe["spec"]["paddle_lite_root"]  # keys of ncnn/MNN builds stay what they were
    blob = json.dumps(recipe, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _mnn_library_stamp(mnn_root: str) -> list[list]:
    """Names, sizes and mtimes of the MNN libraries, so a rebuilt MNN gives a new key."""
    return _library_stamp(mnn_root, "libMNN*")


def _library_stamp(library_root: str, pattern: str) -> list[list]:
    root = Path(library_root)
    libs = sorted(p for p in root.rglob(pattern) if p.is_file())
    return [[str(p.relative_to(root)), p.stat().st_size, int(p.stat().st_mtime)] for p in libs]


def binary_dir(spec: HarnessSpec) -> Path:
    """Directory holding the cached binary for `spec`."""
    return cache_root() / "harness" / f"{spec.target}-{harness_key(spec)}"


def build_command(spec: HarnessSpec, out_dir: Path | None = None) -> list[str]:
    """The build script invocation that produces the binary for `spec` (also shown in errors)."""
    out = out_dir or binary_dir(spec)
    base = spec.target.split("-", 1)[0]
    cmd = ["bash", str(DEVICE_SCRIPTS / TARGET_SCRIPTS[base]), "--out", str(out), "--build-dir", str(out / "build")]
    if base == "android":
        cmd += ["--abi", spec.target.split("-", 1)[1]]
    if spec.with_ncnn:
        cache = cache_root() / "harness"
        cmd += ["--ncnn-prefix", str(cache / f"ncnn-{spec.target}-{ncnn_key(spec)}"),
                "--ncnn-src", str(cache / "src" / f"ncnn-{NCNN_VERSION}")]
        cmd += ["--vulkan", "ON" if spec.vulkan else "OFF"]
        if spec.ncnn_layers:
            cmd += ["--layers", ",".join(spec.ncnn_layers)]
        if spec.test_build:
            cmd.append("--test-build")
    else:
        cmd.append("--no-ncnn")
    if spec.mnn_root:
        cmd += ["--mnn-root", spec.mnn_root]
    if spec.paddle_lite_root:
        cmd += ["--paddle-lite-root", spec.paddle_lite_root]
    return cmd


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive lock on `path` for the duration; a second builder waits, then finds the binary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_ncnn_source() -> None:
    """Unpack ncnn's PyPI sdist into the cache (once) before a build needs it."""
    dest = cache_root() / "harness" / "src"
    fetch = [sys.executable, str(DEVICE_SCRIPTS / "fetch_ncnn_source.py"), str(dest),
             "--version", NCNN_VERSION]
    with _locked(dest.parent / "src.lock"):
        result = subprocess.run(fetch, capture_output=True, text=True)
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"cannot fetch the ncnn source from PyPI ({detail}); run: {shlex.join(fetch)}")


def ensure_built(spec: HarnessSpec, reporter: BuildReporter | None = None) -> Path:
    """Return the cached binary for `spec`, building it first if needed (one builder at a time).

    A build says what it builds, why and roughly how long it takes, then shows progress on
    `reporter` (default: a bar on a terminal, plain lines elsewhere).
    """
    out = binary_dir(spec)
    binary = out / "layerdiff-harness"
    if binary.is_file():
        return binary
    if spec.target.startswith("android") and not os.environ.get("ANDROID_NDK"):
        raise HarnessError(f"no {spec.target} harness: it needs the Android NDK; set ANDROID_NDK and run: "
                           f"{shlex.join(build_command(spec))}")
    with _locked(out.with_suffix(".lock")):
        if binary.is_file():
            return binary
        if spec.with_ncnn:
            _fetch_ncnn_source()
        out.mkdir(parents=True, exist_ok=True)
        cmd = build_command(spec)
        with open(out / "builds.txt", "a") as history:  # one line per build run: audit trail
            history.write(shlex.join(cmd) + "\n")
        ok = run_build_script(cmd, out / "build.log", describe_build(spec), reporter or default_reporter())
        if not ok or not binary.is_file():
            raise HarnessError(f"building the {spec.target} harness failed (log: {out / 'build.log'}); "
                               f"run: {shlex.join(cmd)}")
    return binary


def describe_build(spec: HarnessSpec) -> str:
    """What is about to be built, why, and roughly how long it takes (first line a user sees)."""
    ncnn_cached = not spec.with_ncnn or (cache_root() / "harness" / f"ncnn-{spec.target}-{ncnn_key(spec)}"
                                         / ".complete").is_file()
    engines = " + ".join(e for e, on in (("ncnn " + NCNN_VERSION, spec.with_ncnn), ("MNN", bool(spec.mnn_root)),
                                         ("Paddle-Lite", bool(spec.paddle_lite_root))) if on)
    vulkan = " with Vulkan" if spec.vulkan else ""
    minutes = estimate_minutes(spec.target, vulkan=spec.vulkan, ncnn_cached=ncnn_cached, test_build=spec.test_build)
    why = "ncnn is not built yet for this target" if not ncnn_cached else "no cached binary for these harness sources"
    return (f"building the {spec.target} harness ({engines}{vulkan}): {why}; about {minutes} min, "
            f"once (cached in {binary_dir(spec)})")


def run_build_script(cmd: list[str], log: Path, what: str, reporter: BuildReporter) -> bool:
    """Run a build script with its output in `log`, following its steps for the reporter (`what`: the
    first line a user sees). Used by every native build: the C++ harness here, ggml's in its folder."""
    watcher = BuildWatcher(reporter)
    watcher.start(what)
    ok = False
    env = {**os.environ, "PYTHON": sys.executable}
    with open(log, "w") as handle:
        # its own process group, so an interrupted build takes cmake, ninja and the compilers with it
        # (registered: Ctrl-C during a sweep ends it from the main thread while a worker builds)
        # (guarded: if this process is killed outright, the guard ends the group within a second)
        proc = subprocess.Popen(children.guarded(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, errors="replace", start_new_session=True)
        children.register(proc)
        try:
            for line in proc.stdout:
                handle.write(line)
                watcher.feed(line)
            ok = proc.wait() == 0
        finally:
            children.unregister(proc)
            if proc.poll() is None:  # interrupted: never leave cmake/ninja compiling behind
                children.end_group(proc)
            watcher.stop(ok)
    return ok


def prebuilt_override(abi: str) -> Path | None:
    """A binary named by $LAYERDIFF_HARNESS_<ABI>, if set (must exist)."""
    variable = "LAYERDIFF_HARNESS_" + abi.upper().replace("-", "_")
    value = os.environ.get(variable)
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise HarnessError(f"{variable}={value} does not name a file: fix or unset it")
    return path
