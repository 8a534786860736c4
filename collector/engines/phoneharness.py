"""The harness binary a phone runs for an engine: the engine's own native program, or the C++ harness built
as the engine's folder says (`Engine.harness_spec`), from the cache (collector/harness/build.py).

Why here: which build runs an engine on an ABI and backend is the engine's fact (its folder's hook), and the
build machinery below knows no engine; this is where the two meet, for the ADB phones and `collect prepare`.
"""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines import ENGINES, PHONE_ENGINES, PREPARED_BY_DEFAULT
from layerdiff.collector.harness.build import (HarnessError, HarnessLibrary, HarnessSpec, ensure_built,
                                               prebuilt_override, wants_test_build)
from layerdiff.collector.harness.buildprogress import BuildReporter
from layerdiff.vocabulary import HARNESS_BACKENDS, host_abi


def spec_for(abi: str, engine: str, backend: str = "cpu", *, test_build: bool = False) -> HarnessSpec:
    """The C++ harness build that can run `engine` on `backend` for a device with `abi`, as its folder declares."""
    if engine not in PHONE_ENGINES:
        where = " (it runs on the local device only)" if engine in ENGINES else ""
        raise HarnessError(f"no device harness for engine {engine!r}{where}: use {' or '.join(PHONE_ENGINES)}")
    recipe = ENGINES[engine].harness_spec
    if recipe is None:
        raise HarnessError(f"the {engine} engine runs its own native harness on phones, not the C++ harness")
    return recipe(abi, backend, test_build)


def cpp_harness_spec(target: str, linked: dict[str, HarnessLibrary], *, vulkan: bool = False,
                     test_build: bool = False) -> HarnessSpec:
    """The C++ harness build for `target` linking `linked` (engine name -> the part its folder declares), with the
    part of every other engine the harness can link for a build without it (`Engine.harness_absent`)."""
    absent = tuple(engine.harness_absent(target, vulkan, test_build) for name, engine in ENGINES.items()
                   if engine.harness_absent is not None and name not in linked)
    return HarnessSpec(target, tuple(linked.values()), absent, vulkan, test_build)


def harness_for(abi: str, engine: str, backend: str = "cpu", *, test_build: bool | None = None,
                reporter: BuildReporter | None = None) -> Path:
    """The harness binary to run `engine`/`backend` on a device with `abi`, built on demand.

    test_build None reads $LAYERDIFF_HARNESS_TEST_BUILD (collector/harness/build.py `wants_test_build`).
    """
    own = ENGINES[engine].phone_harness if engine in ENGINES else None
    if own is not None:  # the engine's own native program for phones, built by its folder
        return own(abi, backend)
    override = prebuilt_override(abi)
    if override:
        return override
    return ensure_built(spec_for(abi, engine, backend, test_build=wants_test_build(test_build)), reporter)


def main(argv: list[str] | None = None) -> int:
    """`python -m layerdiff.collector.engines.phoneharness --abi arm64-v8a [--engine E] [--backend cpu] [--test-build]`:
    build (or find) the binary and print its path; lets CI and users warm the cache up front."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m layerdiff.collector.engines.phoneharness",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("--abi", default=host_abi())
    parser.add_argument("--engine", default=(PREPARED_BY_DEFAULT or PHONE_ENGINES)[0], choices=list(PHONE_ENGINES))
    parser.add_argument("--backend", default="cpu", choices=list(HARNESS_BACKENDS))
    parser.add_argument("--test-build", action="store_true", default=None)
    args = parser.parse_args(argv)
    try:
        print(harness_for(args.abi, args.engine, args.backend, test_build=args.test_build))
    except HarnessError as err:
        print(f"layerdiff: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
