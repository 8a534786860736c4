"""Another llama.cpp as the ggml engine: `--engine ggml==0.3.20` runs layerdiff-ggml built from llama-cpp-python
0.3.20's source distribution, beside the pinned release's build.

Why a source build: the ggml engine's harness is a C++ program linked against llama.cpp + ggml, and the one
place their code may come from is llama-cpp-python's sdist on PyPI (vendor/llama.cpp). A release is a field of
the build spec (build.py's `GgmlSpec.release`), so its source tree, build tree and binary are cached under keys
of their own, built once by the same builder (one at a time, the same progress display) and reused by later
runs. The binary reports ggml's own version and the release it was built from (`ggml 0.9.8 (llama-cpp-python
0.3.17 sdist)`), which the dump records as `engine_version`; the request is checked against the release named
there, as a wheel's reported version is checked.

Refused in one line: a release older than the oldest whose llama.cpp the harness compiles against (before
anything is fetched), one the package index has no sdist of (before a build starts), and one whose build fails
(naming its build log).
"""
from __future__ import annotations

import re

from layerdiff.collector.engines.ggml.build import (GGML_DIR, OLDEST_BUILDING, PINNED_RELEASE, RELEASE_ENV,
                                                    SOURCE_PROJECT, arm64_harness, device_specs, ensure_built,
                                                    phone_harness, source_dir)
from layerdiff.collector.engines.versions import SourceRelease, published_sdists, release_number as release_key
from layerdiff.collector.harness.build import HarnessError
from layerdiff.errors import DeviceError, EngineVersionError

_REPORTED = re.compile(r"\(" + re.escape(SOURCE_PROJECT) + r" ([0-9][0-9A-Za-z.+!_-]*) sdist")


def check(release: str) -> None:
    """Refuse a release older than the oldest the harness builds against (its llama.cpp lacks ggml calls it makes)."""
    if release_key(release) < release_key(OLDEST_BUILDING):
        raise EngineVersionError(
            f"--engine ggml=={release}: {SOURCE_PROJECT} {release}'s llama.cpp is older than the ggml harness builds "
            f"against; releases known to build: {OLDEST_BUILDING} (oldest) to {PINNED_RELEASE} (pinned)")


def published(release: str) -> list[str] | None:
    """The releases the package index holds an sdist of, oldest first (None when the index cannot be asked)."""
    return published_sdists(GGML_DIR / "fetch_source.py")


def check_published(release: str) -> None:
    """One line for a release the package index has no sdist of, naming the ones it has that build (a cached
    source tree, or an index that cannot be asked, passes: the fetch then says why it fails)."""
    if (source_dir(release) / "include" / "llama.h").is_file():
        return
    releases = published(release)
    if releases is None or release in releases:
        return
    since = [r for r in releases if release_key(r) >= release_key(OLDEST_BUILDING)]
    shown = ", ".join(since[-12:]) if len(since) <= 12 else f"{since[0]}, ..., {', '.join(since[-11:])}"
    raise EngineVersionError(f"--engine ggml=={release}: the package index has no {SOURCE_PROJECT} {release} sdist "
                             f"(its releases from {OLDEST_BUILDING}, the oldest known to build: {shown or 'none'})")


def prepare(release: str, devices: list) -> None:
    """Fetch the release's source and build what the devices run, before the sweep's display starts; a build that
    fails stops the collect here in one line (each run would otherwise try it again)."""
    check(release)
    check_published(release)
    for spec in device_specs(devices, release):
        if spec.target == "android":  # phone GPU builds are never started inside a collect: the run says what to do
            continue
        try:
            ensure_built(spec)
        except HarnessError as err:
            raise EngineVersionError(f"--engine ggml=={release}: {err}") from None


def harness(device, backend: str, release: str):
    """The invocation that runs `release` on `device`: the host engine told the release (it builds or finds the
    binary itself), the release's static aarch64 binary under qemu, or the phone's build of it staged on the phone."""
    from dataclasses import replace

    kind = device.info().kind
    if kind == "local":
        invocation = device.prepare_harness("ggml", backend)
        return replace(invocation, env={**invocation.env, RELEASE_ENV: release},
                       description=f"{invocation.description} ggml=={release}")
    if kind == "qemu":
        return arm64_harness(device, release)
    abi = device.info().abi
    try:
        binary = phone_harness(abi, backend, release)
    except HarnessError as err:
        raise DeviceError(f"{device.serial} ({abi}): {err}") from None
    return device.stage_program(binary)


def reported_release(engine_version: str) -> str:
    """The release a binary was built from, as it reports it (`ggml 0.9.8 (llama-cpp-python 0.3.17 sdist)`)."""
    found = _REPORTED.search(engine_version or "")
    return found.group(1) if found else ""


def recipe() -> SourceRelease:
    return SourceRelease(SOURCE_PROJECT, ("local", "qemu", "adb"), check, prepare, harness, reported_release)

