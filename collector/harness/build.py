"""Build the C++ harness binary for a device ABI and a set of linked libraries, on demand, into a cache.

Why a cache keyed by content: building a library such as a whole inference engine takes minutes, so a binary
is built once per (harness sources, build scripts, target, options) and reused by every later run, test
session and CI step; a change to any of those gives a new key, never a stale binary. A library built from
source is cached separately by its own folder's key, so editing the harness sources does not rebuild it.
Concurrent callers serialise on a file lock so only one of them builds.

Which libraries a build links, with which build-script options and cache-key entries, is declared by the
engine folders (`HarnessLibrary`, made by `collector/engines/<engine>/harness.py`); this module assembles
them and names no engine.

Cache layout (root: layerdiff.cache.user_cache_root(), i.e. $LAYERDIFF_CACHE, else
$XDG_CACHE_HOME/layerdiff, else ~/.cache/layerdiff):
    harness/src/...                        library sources fetched by a library's `fetch` command
    harness/<library>-<target>-<key>/      a library built from source, as its folder names it
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
from dataclasses import dataclass
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
TARGET_SCRIPTS = {"host": "build_host.sh", "aarch64": "build_aarch64.sh", "android": "build_android.sh"}


@dataclass(frozen=True)
class HarnessLibrary:
    """One library's part of a C++ harness build, as the engine folder that runs the library declares it.

    A build also carries the parts of the libraries it leaves out (`HarnessSpec.absent`): the build scripts
    take an option saying so, the library's own harness sources stay out of the key, and its entries keep
    the key's shape, so a key never depends on which libraries exist besides the linked ones."""

    title: str = ""  # how the build's first line names it (`MNN`); "" for an absent library
    args: tuple[str, ...] = ()  # build script options (`--mnn-root DIR`, or the option that leaves it out)
    source_prefix: str = ""  # harness source files (by name prefix) that only builds linking it read
    key_spec: str = "{}"  # JSON object: its fields in the cache key's "spec" entry
    key: str = "{}"  # JSON object: its entries at the cache key's top level (a library build's own key, a stamp)
    fetch: tuple[str, ...] = ()  # a command fetching its source into the cache before a build
    built_marker: str = ""  # a file present once its own slow build is cached ("" when it has none)
    # In args, fetch and built_marker, "{cache}" stands for the harness cache folder and "{python}" for this
    # Python: filled in when the build runs, so a spec made before the cache moved still builds into the new one.
    not_built_why: str = ""  # what the first line says while that build is missing


@dataclass(frozen=True)
class HarnessSpec:
    """Everything that decides which binary gets built.

    target: "host", "aarch64" (static Linux, runs on phones' CPUs and under qemu) or
    "android-<abi>" (NDK build, needed for OpenCL/Vulkan on phones).
    libraries: the linked libraries' parts; absent: the parts of those left out (see HarnessLibrary).
    vulkan: the Vulkan backend compiled in. test_build: the faster build the tests and CI use.
    """

    target: str
    libraries: tuple[HarnessLibrary, ...] = ()
    absent: tuple[HarnessLibrary, ...] = ()
    vulkan: bool = False
    test_build: bool = False

    @property
    def parts(self) -> tuple[HarnessLibrary, ...]:
        return self.libraries + self.absent


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


def _check_device_scripts() -> None:
    """The harness sources ship with the package; without them nothing can be built (a broken install)."""
    if not (DEVICE_SCRIPTS / "harness" / "CMakeLists.txt").is_file():
        raise HarnessError(f"the harness sources are missing from {DEVICE_SCRIPTS}; reinstall layerdiff "
                           "(pip install --force-reinstall layerdiff) or run from a checkout")


def sources_digest(left_out: tuple[str, ...] = ()) -> str:
    """sha256 over the harness sources and build scripts: any edit gives a new binary.

    A library's own files (by its `source_prefix`) count only for builds linking it: `left_out` holds the
    prefixes of the libraries a build leaves out, so working on one engine never invalidates the others'
    binaries (a library built from source can be a 10-minute rebuild)."""
    _check_device_scripts()
    digest = hashlib.sha256()
    files = sorted(p for p in (DEVICE_SCRIPTS / "harness").rglob("*")
                   if p.is_file() and not any(prefix and p.name.startswith(prefix) for prefix in left_out))
    files += sorted(DEVICE_SCRIPTS.glob("build_*.sh")) + sorted((DEVICE_SCRIPTS / "cmake").glob("*"))
    for path in files:
        digest.update(str(path.relative_to(DEVICE_SCRIPTS)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def harness_key(spec: HarnessSpec) -> str:
    """Cache key of a harness binary: sources + target + options + every library part's entries."""
    fields = {"target": spec.target, "vulkan": spec.vulkan, "test_build": spec.test_build}
    recipe: dict = {"sources": sources_digest(tuple(part.source_prefix for part in spec.absent)), "spec": fields}
    for part in spec.parts:
        fields.update(json.loads(part.key_spec))
        recipe.update(json.loads(part.key))
    blob = json.dumps(recipe, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _filled(word: str) -> str:
    """A library part's word with "{cache}" and "{python}" filled in (see HarnessLibrary)."""
    return word.replace("{cache}", str(cache_root() / "harness")).replace("{python}", sys.executable)


def library_stamp(library_root: str, pattern: str) -> list[list]:
    """Names, sizes and mtimes of a prebuilt library's files, so a rebuilt library gives a new key."""
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
    for part in spec.absent + spec.libraries:  # the options leaving libraries out come first
        cmd += [_filled(word) for word in part.args]
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


def _fetch_source(part: HarnessLibrary) -> None:
    """Run a library's fetch command (once: it skips what the cache holds) before a build needs its source."""
    fetch = [_filled(word) for word in part.fetch]
    dest = cache_root() / "harness" / "src"
    with _locked(dest.parent / "src.lock"):
        result = subprocess.run(fetch, capture_output=True, text=True)
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise HarnessError(f"cannot fetch the {part.title} source ({detail}); run: {shlex.join(fetch)}")


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
        for part in spec.libraries:
            if part.fetch:
                _fetch_source(part)
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
    missing = next((part for part in spec.libraries if part.built_marker and not Path(_filled(part.built_marker)).is_file()),
                   None)
    libraries = " + ".join(part.title for part in spec.libraries)
    vulkan = " with Vulkan" if spec.vulkan else ""
    minutes = estimate_minutes(spec.target, vulkan=spec.vulkan, library_cached=missing is None, test_build=spec.test_build)
    why = missing.not_built_why if missing else "no cached binary for these harness sources"
    return (f"building the {spec.target} harness ({libraries}{vulkan}): {why}; about {minutes} min, "
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
