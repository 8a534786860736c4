"""Which C++ harness build runs ncnn on a phone (`Engine.harness_spec`), and ncnn's part of every C++ harness build.

A CPU-only run on an arm64 phone uses the static aarch64 binary (no NDK needed, runs under qemu too);
GPU backends need the NDK build for the phone's ABI; the host's ABI gets the host build with Vulkan on.

ncnn is built from its PyPI source distribution (device_scripts/fetch_ncnn_source.py) into a cache folder of its
own, keyed by its release and build options (`ncnn_key`), so editing the harness sources does not rebuild it. The
release is a field of every function here: the pinned `NCNN_VERSION` by default, another one for
`--engine ncnn==RELEASE` on the devices that run the C++ harness (its own source tree, library and binary, side by
side with the pinned ones, whose keys do not change: collector/engines/ncnn/releases.py).
"""
from __future__ import annotations

import hashlib
import json

from layerdiff.collector.harness.build import DEVICE_SCRIPTS, HarnessLibrary, HarnessSpec, phone_target
from layerdiff.vocabulary import host_abi

NCNN_VERSION = "1.0.20261020"
# Bump when the ncnn CMake options in device_scripts/build_*.sh change: it keys cached ncnn builds.
NCNN_RECIPE = 2
SOURCE_PREFIX = "ncnn_"  # the harness's ncnn-only source files


def harness_spec(abi: str, backend: str, test_build: bool, release: str = NCNN_VERSION) -> HarnessSpec:
    if abi == "arm64-v8a" and backend == "cpu" and abi != host_abi():
        return ncnn_spec("aarch64", test_build=test_build, release=release)
    return ncnn_spec(phone_target(abi), vulkan=True, test_build=test_build, release=release)


def ncnn_spec(target: str, *, vulkan: bool = False, test_build: bool = False,
              layers: tuple[str, ...] | None = None, release: str = NCNN_VERSION) -> HarnessSpec:
    """The C++ harness build linking ncnn `release` (`layers`: build ncnn with only these layers; None: all)."""
    from layerdiff.collector.engines.phoneharness import cpp_harness_spec

    return cpp_harness_spec(target, {"ncnn": linked(target, vulkan, test_build, layers, release)}, vulkan=vulkan,
                            test_build=test_build)


def ncnn_key(target: str, vulkan: bool, test_build: bool, layers: tuple[str, ...] | None = None,
             release: str = NCNN_VERSION) -> str:
    """Cache key of the ncnn library a build links against (the release is one of its fields)."""
    recipe = {"recipe": NCNN_RECIPE, "ncnn": release, "target": target, "vulkan": vulkan,
              "layers": sorted(layers) if layers else None, "test_build": test_build}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def ncnn_folder(target: str, vulkan: bool, test_build: bool, layers: tuple[str, ...] | None = None,
                release: str = NCNN_VERSION) -> str:
    """The cache folder (under the harness cache, "{cache}") of the ncnn build a harness build links."""
    return f"{{cache}}/ncnn-{target}-{ncnn_key(target, vulkan, test_build, layers, release)}"


def source_folder(release: str = NCNN_VERSION) -> str:
    """The cache folder (under the harness cache, "{cache}") holding ncnn `release`'s unpacked sdist."""
    return f"{{cache}}/src/ncnn-{release}"


def linked(target: str, vulkan: bool, test_build: bool, layers: tuple[str, ...] | None = None,
           release: str = NCNN_VERSION) -> HarnessLibrary:
    """ncnn's part of a harness build that links it: built from source first, its options to the build scripts."""
    prefix = ncnn_folder(target, vulkan, test_build, layers, release)
    args = ["--ncnn-prefix", prefix, "--ncnn-src", source_folder(release), "--vulkan", "ON" if vulkan else "OFF"]
    if layers:
        args += ["--layers", ",".join(layers)]
    if test_build:
        args.append("--test-build")
    fetch = ("{python}", str(DEVICE_SCRIPTS / "fetch_ncnn_source.py"), "{cache}/src", "--version", release)
    return HarnessLibrary(f"ncnn {release}", tuple(args), SOURCE_PREFIX,
                          key_spec=json.dumps({"with_ncnn": True, "ncnn_layers": list(layers) if layers else None}),
                          key=json.dumps({"ncnn": ncnn_key(target, vulkan, test_build, layers, release)}), fetch=fetch,
                          built_marker=f"{prefix}/.complete", not_built_why="ncnn is not built yet for this target")


def absent(target: str, vulkan: bool, test_build: bool) -> HarnessLibrary:
    """ncnn's part of a harness build without it: the scripts are told, its key entries keep their place."""
    return HarnessLibrary(args=("--no-ncnn",), source_prefix=SOURCE_PREFIX,
                          key_spec=json.dumps({"with_ncnn": False, "ncnn_layers": None}),
                          key=json.dumps({"ncnn": ncnn_key(target, vulkan, test_build)}))
