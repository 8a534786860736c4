"""Another ncnn in the C++ harness: `--engine ncnn==1.0.20250916` on the emulated `arm64` core and on phones runs
layerdiff-harness built against that release's source distribution, beside the pinned release's build.

Why a source build there: those devices run ncnn inside the C++ harness (device_scripts/harness), linked against an
ncnn compiled here from its sdist on PyPI (device_scripts/fetch_ncnn_source.py); the local device runs ncnn's wheel,
so there `ncnn==RELEASE` installs that release's wheel (collector/engines/versions.py) and nothing is built. The
release is a field of the harness build (harness.py: the source folder, ncnn's own build folder and the binary are
keyed by it; the pinned release keeps the keys it always had), built once by the same builder (one at a time, the
same progress display) and reused by later runs. The binary reports ncnn's own version string, which ncnn's
CMake makes from the release (`1.0.20250916`); the dump records it as `engine_version` and the run fails when it
names another release than the one asked for.

Refused in one line: a release number that is not ncnn's `1.0.YYYYMMDD` (before anything is fetched), one the
package index has no sdist of (before a build starts), and one whose source the harness does not compile against
(naming its build log and the releases known to build).
"""
from __future__ import annotations

import re
from pathlib import Path

from layerdiff.collector.engines.ncnn.harness import NCNN_VERSION, harness_spec, ncnn_spec, source_folder
from layerdiff.collector.engines.versions import SourceRelease, published_sdists
from layerdiff.collector.harness.build import (DEVICE_SCRIPTS, HarnessError, HarnessSpec, _filled, binary_dir,
                                               ensure_built, wants_test_build)
from layerdiff.errors import DeviceError, EngineVersionError, LayerdiffError

SOURCE_PROJECT = "ncnn"
# The releases whose source the C++ harness is known to compile against and run (built and compared by
# tests/test_engine_versions_ncnn.py); named when another release's build fails.
KNOWN_BUILDING = ("1.0.20250916", NCNN_VERSION)
DEVICE_KINDS = ("qemu", "adb")  # the devices whose ncnn is the C++ harness's; `local` runs the wheel
_RELEASE = re.compile(r"1\.0\.(\d{8})")  # ncnn numbers its releases by date; the build stamps that date in


def check(release: str) -> None:
    """Refuse a release number the C++ harness's build cannot stamp into ncnn (it is not `1.0.YYYYMMDD`)."""
    if not _RELEASE.fullmatch(release):
        raise EngineVersionError(
            f"--engine ncnn=={release}: ncnn's releases are numbered 1.0.YYYYMMDD (e.g. {KNOWN_BUILDING[0]}); "
            f"the C++ harness on arm64 and phones is built from one of them")


def published() -> list[str] | None:
    """The releases the package index holds an sdist of, oldest first (None when the index cannot be asked)."""
    return published_sdists(DEVICE_SCRIPTS / "fetch_ncnn_source.py")


def check_published(release: str) -> None:
    """One line for a release the package index has no sdist of, naming the ones it has (a cached source tree, or
    an index that cannot be asked, passes: the fetch then says why it fails)."""
    if (Path(_filled(source_folder(release))) / "CMakeLists.txt").is_file():
        return
    releases = published()
    if releases is None or release in releases:
        return
    shown = ", ".join(releases[-12:]) or "none"
    raise EngineVersionError(f"--engine ncnn=={release}: the package index has no {SOURCE_PROJECT} {release} sdist to "
                             f"build the C++ harness from (the latest releases with one: {shown})")


def device_spec(device, release: str) -> HarnessSpec | None:
    """The CPU build a device runs `release` in: the static aarch64 build for `arm64` (qemu), a phone's CPU build
    for its ABI (None: a phone that cannot say, or whose build needs the Android NDK: left to its runs)."""
    info = device.info()
    test_build = wants_test_build(None)
    if info.kind == "qemu":
        return ncnn_spec("aarch64", test_build=test_build, release=release)
    if info.kind == "adb" and info.abi:
        spec = harness_spec(info.abi, "cpu", test_build, release)
        return None if spec.target.startswith("android") else spec
    return None


def build_failed(release: str, spec: HarnessSpec, err: HarnessError) -> EngineVersionError:
    """One line for a build that did not finish: a failed compile names its log and the releases known to build;
    anything else (the source could not be fetched) is the builder's own line."""
    log = binary_dir(spec) / "build.log"
    if not str(err).startswith("building the") or not log.is_file():
        return EngineVersionError(f"--engine ncnn=={release}: {err}")
    known = ", ".join(f"{r} (pinned)" if r == NCNN_VERSION else r for r in KNOWN_BUILDING)
    return EngineVersionError(f"--engine ncnn=={release}: the C++ harness did not build against ncnn {release}'s "
                              f"source (log: {log}); releases known to build: {known}")


def prepare(release: str, devices: list) -> None:
    """Fetch the release's source and build what the devices run, before the sweep's display starts; a build that
    fails stops the collect here in one line (each run would otherwise try it again)."""
    check(release)
    check_published(release)
    specs = []
    for device in devices:
        try:
            spec = device_spec(device, release)
        except LayerdiffError:  # a phone that cannot say its ABI, or an ABI without a build: its runs say so
            continue
        if spec is not None and spec not in specs:
            specs.append(spec)
    for spec in specs:
        try:
            ensure_built(spec)
        except HarnessError as err:
            raise build_failed(release, spec, err) from None


def harness(device, backend: str, release: str):
    """The invocation that runs `release` on `device`: the release's static aarch64 harness under qemu, or the
    phone's build of it staged on the phone (in a folder named by its content, beside the pinned one)."""
    info = device.info()
    if info.kind == "qemu":
        if backend != "cpu":
            raise DeviceError(f"{device.serial}: the static aarch64 harness runs ncnn {release} on the CPU only; "
                              "use --backend cpu")
        spec = ncnn_spec("aarch64", test_build=wants_test_build(None), release=release)
    else:
        spec = harness_spec(info.abi, backend, wants_test_build(None), release)
    try:
        binary = ensure_built(spec)
    except HarnessError as err:
        raise DeviceError(f"{device.serial} ({info.abi}): {build_failed(release, spec, err)}") from None
    if info.kind == "qemu":
        return device.emulated(binary, f"aarch64 ncnn {release} (static C++ harness)")
    return device.stage_program(binary)


def reported_release(engine_version: str) -> str:
    """The release the binary was built from: ncnn's own version string is the release (`1.0.20250916`)."""
    return (engine_version or "").strip()


def recipe() -> SourceRelease:
    return SourceRelease(SOURCE_PROJECT, DEVICE_KINDS, check, prepare, harness, reported_release)
