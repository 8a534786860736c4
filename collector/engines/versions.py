"""Engine versions as an axis: `--engine mnn==3.5.0` runs that release of the engine beside the installed one.

The host engines already run as a child process (`python -m <folder>.engine`), so another release needs
only another place for that child to import the engine's library from. That place is a cached
environment of its own under the layerdiff cache, one per engine, version, Python and machine, filled
once by pip from the package index with that release's wheel. The child runs with it first on its
import path: the engine library comes from there, layerdiff and numpy from layerdiff's own environment
(the wheel is installed without its dependencies, which are the installed engine's). What the child
then reports as its version is what the dump records (`engine_version`), checked against the request.

An engine whose harness is a native program built here from a source distribution on PyPI (ggml: llama.cpp
from llama-cpp-python's sdist) instead declares a `SourceRelease` (`Engine.source_release`): that release's
source is fetched and built into the cache, keyed by the release, on the devices the folder says it builds for.
An engine may have both: ncnn's wheel runs a release on the host, its sdist is built into the C++ harness for the
emulated `arm64` core and phones; which one serves a device is the device's kind (`source_for`).
An engine with neither (Paddle-Lite's C++ harness) is refused in one line, and so are devices an engine's
releases do not run on (a wheel's release runs on the host only; the folder's `release_refusal` says why not
elsewhere).
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from layerdiff.cache import user_cache_root
from layerdiff.errors import EngineVersionError

ENVS_DIR = "engine-envs"
PIP_TIMEOUT_S = 900.0
# A version as the package index spells one (PEP 440 characters only: it becomes a path and a pip argument).
_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!_-]{0,63}")


def split_engine(text: str) -> tuple[str, str]:
    """`mnn==3.5.0` → ("mnn", "3.5.0"); `mnn` → ("mnn", ""): the engine and the release asked for."""
    name, sep, version = text.partition("==")
    name, version = name.strip(), version.strip()
    if sep and not _VERSION.fullmatch(version):
        raise EngineVersionError(f"--engine {text!r}: write NAME==VERSION with a release number, e.g. mnn==3.5.0")
    return name, version


def engine_label(engine: str, version: str) -> str:
    """How runs of one release are named in file names: `mnn-3.5.0` (the installed engine: `mnn`)."""
    return f"{engine}-{version}" if version else engine


def requested(engine: str, version: str) -> str:
    """How the request is recorded (index.csv's engine column, the dump's `engine_requested`): `mnn==3.5.0`."""
    return f"{engine}=={version}" if version else engine


def python_tag() -> str:
    """What a wheel must fit besides the release: the running Python and the host's architecture (`cp311-x86_64`)."""
    return f"cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine().lower()}"


def env_path(engine: str, version: str) -> Path:
    """The cached environment of one release of one engine for this Python (it may not exist yet)."""
    return user_cache_root() / ENVS_DIR / f"{engine}-{version}-{python_tag()}"


@dataclass(frozen=True)
class SourceRelease:
    """How an engine whose harness is built here runs another release: built from that release's source
    distribution on the package index. Declared by the engine's folder (`Engine.source_release` returns one);
    nothing outside the folder knows how the build goes."""

    project: str  # the PyPI project whose sdists hold the engine's source (`llama-cpp-python`)
    device_kinds: tuple[str, ...]  # the devices a release's build runs on, as DeviceInfo.kind names them
    # release -> None, or EngineVersionError: a release it cannot build, refused before anything is fetched
    check: Callable[[str], None]
    # (release, devices) -> None: fetch and build what the devices run, before the sweep (EngineVersionError: one line)
    prepare: Callable[[str, list], None]
    # (device, backend, release) -> the HarnessInvocation that runs that release on the device
    harness: Callable[[object, str, str], object]
    # the dump's `engine_version` (what the binary reports) -> the release it was built from ("" when it names none)
    reported_release: Callable[[str], str]


WHEEL_DEVICES = ("local",)  # a wheel's release runs in a host child process


def source_release(engine) -> SourceRelease | None:
    """The engine's declaration of how another release is built from source (None: a wheel engine, or neither)."""
    return engine.source_release() if engine.source_release is not None else None


def source_for(engine, kind: str) -> SourceRelease | None:
    """The source build that runs a release on a device of `kind` (DeviceInfo.kind); None where the wheel does."""
    recipe = source_release(engine)
    if recipe is not None and (kind in recipe.device_kinds or not engine.distribution):
        return recipe
    return None


def check_versionable(engine) -> None:
    """Refuse, in one line, an engine whose releases cannot be had: neither a wheel on the package index nor a
    source build its folder declares."""
    if not engine.distribution and engine.source_release is None:
        why = engine.release_refusal or (f"the {engine.name} harness is built here, not installed from the package "
                                         "index, so only its installed release runs")
        raise EngineVersionError(f"--engine {engine.name}==VERSION: {why}; drop the ==VERSION")


def check_release(engine, version: str, kinds: tuple[str, ...] | None = None) -> None:
    """Refuse, in one line, a release the engine cannot run, before any model is read or device touched.

    `kinds`: the device kinds the sweep runs on, once known; a source build's own check (a release it cannot
    build) applies when one of them is built from source (before that: when every device would be)."""
    check_versionable(engine)
    recipe = source_release(engine)
    if recipe is None:
        return
    built_everywhere = not engine.distribution
    if built_everywhere if kinds is None else any(source_for(engine, kind) for kind in kinds):
        recipe.check(version)


def release_devices(engine) -> tuple[str, ...]:
    """The device kinds (DeviceInfo.kind) another release of the engine runs on: its wheel's and its source
    build's."""
    recipe = source_release(engine)
    wheel = WHEEL_DEVICES if engine.distribution else ()
    return tuple(dict.fromkeys(wheel + (recipe.device_kinds if recipe is not None else ())))


def how_obtained(engine, version: str) -> str:
    """Where a release comes from, for messages: `MNN 3.5.0's wheel`, `llama-cpp-python 0.3.20's sdist, built here`."""
    recipe = source_release(engine)
    built = f"{recipe.project} {version}'s sdist, built here" if recipe else ""
    wheel = f"{engine.distribution} {version}'s wheel" if engine.distribution else ""
    return " or ".join(part for part in (wheel, built) if part)


def prepare_release(engine, version: str, devices: list, on_step=None,
                    kind_of: Callable[[object], str] = lambda device: device.info().kind) -> None:
    """Everything the release needs before the sweep: a wheel's environment for the devices that run it, a source
    release's builds for the others (`kind_of`: a device's DeviceInfo.kind; the sweep knows it without asking)."""
    built = [device for device in devices if source_for(engine, kind_of(device))]
    if built:
        source_release(engine).prepare(version, built)
    if len(built) < len(devices):
        ensure_env(engine, version, on_step=on_step)


def versioned_harness(device, engine, backend: str, version: str):
    """How `device` runs `version` of `engine`: the host engine's child importing that release's wheel, or the
    engine's own build of that release."""
    recipe = source_for(engine, device.info().kind)
    if recipe is not None:
        return recipe.harness(device, backend, version)
    from dataclasses import replace

    harness = device.prepare_harness(engine.name, backend)
    return replace(harness, env={**harness.env, **harness_env(engine, version)},
                   description=f"{harness.description} {requested(engine.name, version)}")


def reported_release(engine, reported: str, kind: str = "local") -> str:
    """The release a run's `engine_version` names: the text itself for a wheel, the release its build came from
    for a source release (a binary reports its library's own version beside where it was built from)."""
    recipe = source_for(engine, kind)
    return recipe.reported_release(reported) if recipe is not None else reported


def ensure_env(engine, version: str, on_step=None) -> Path:
    """The environment holding `version` of `engine`'s wheel, made once with pip (later calls reuse it).

    pip installs into a temporary folder renamed into place when complete, so a killed install leaves
    nothing a later run would take for an environment, and two collects making the same one do not clash."""
    if not engine.distribution:
        check_versionable(engine)
        raise EngineVersionError(f"--engine {engine.name}=={version}: {engine.name} releases are built from source, "
                                 "not installed from a wheel")
    path = env_path(engine.name, version)
    if path.is_dir():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    if on_step is not None:
        on_step(f"installing {engine.distribution}=={version} into {path}")
    try:
        _pip_install(engine, version, partial)
        try:
            partial.rename(path)
        except OSError:
            if not path.is_dir():  # another collect made it meanwhile: theirs is as good
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return path


def _pip_install(engine, version: str, target: Path) -> None:
    argv = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", ":all:", "--no-input",
            "--disable-pip-version-check", "--quiet", "--target", str(target), f"{engine.distribution}=={version}"]
    # a constraints file pins the installed engine's release; this environment is another release's own
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_REQUIRE_VIRTUALENV": "0"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise EngineVersionError(f"--engine {engine.name}=={version}: pip did not finish installing "
                                 f"{engine.distribution}=={version} within {PIP_TIMEOUT_S:.0f} s; check the "
                                 "package index is reachable and try again") from None
    except OSError as err:
        raise EngineVersionError(f"--engine {engine.name}=={version}: pip could not start ({err})") from None
    if done.returncode != 0:
        raise EngineVersionError(pip_failure(engine, version, done.stderr))
    if not any(target.glob(f"{engine.library}*")):
        raise EngineVersionError(f"--engine {engine.name}=={version}: {engine.distribution}=={version} installed "
                                 f"no {engine.library} module; this release cannot run as the {engine.name} engine")


_FROM_VERSIONS = re.compile(r"\(from versions: ([^)]*)\)")


def pip_failure(engine, version: str, stderr: str) -> str:
    """One line for a failed install: the release does not exist or has no wheel for this Python (naming
    the releases that do), else pip's own last error line."""
    where = f"Python {sys.version_info.major}.{sys.version_info.minor} on {platform.machine()}"
    found = _FROM_VERSIONS.search(stderr)
    if found:
        versions = [v.strip() for v in found.group(1).split(",") if v.strip() and v.strip() != "none"]
        offer = (f"releases with one: {', '.join(versions[-12:])}" if versions
                 else f"no release of {engine.distribution} has a wheel for it")
        return (f"--engine {engine.name}=={version}: the package index has no {engine.distribution} {version} "
                f"wheel for {where} ({offer})")
    errors = [line.strip() for line in stderr.splitlines() if line.strip().startswith("ERROR")]
    last = (errors or [line.strip() for line in stderr.splitlines() if line.strip()] or ["no message"])[-1]
    return f"--engine {engine.name}=={version}: pip could not install {engine.distribution}=={version}: {last[:300]}"


def harness_env(engine, version: str) -> dict[str, str]:
    """The host engine child's environment additions that make it import `version` of the engine."""
    path = ensure_env(engine, version)
    before = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(path), before) if p)}


def same_release(asked: str, reported: str) -> bool:
    """Does the version the engine reports name the release asked for? (`1.17.0` for `1.17.0`; an engine
    may report more or fewer parts: `3.5` and `3.5.0` are one release.)"""
    def parts(text: str) -> list[str]:
        items = re.split(r"[.+-]", text.strip().lstrip("v"))
        while len(items) > 1 and items[-1] == "0":
            items.pop()
        return items

    return bool(reported) and parts(asked) == parts(reported)


LIST_TIMEOUT_S = 120.0  # asking the package index which releases have an sdist


def release_number(release: str) -> tuple[int, ...]:
    """`0.3.17` -> (0, 3, 17), `1.0.20250916` -> (1, 0, 20250916): releases numbered with plain numbers, ordered as such."""
    return tuple(int(part) for part in re.findall(r"\d+", release))


def published_sdists(fetch_script: Path) -> list[str] | None:
    """The releases the package index holds an sdist of, oldest first, as an engine's stdlib fetch script lists them
    (`--list`); None when the index cannot be asked."""
    lister = [sys.executable, str(fetch_script), "--list"]
    try:
        done = subprocess.run(lister, capture_output=True, text=True, timeout=LIST_TIMEOUT_S, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if done.returncode != 0:
        return None
    return sorted((line.strip() for line in done.stdout.splitlines() if line.strip()), key=release_number)
