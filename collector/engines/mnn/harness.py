"""Which C++ harness build runs MNN on a phone (`Engine.harness_spec`): linked against the user's MNN build
for that ABI (MNN_ROOT), no ncnn; and MNN's part of every C++ harness build."""
from __future__ import annotations

import json
import os

from layerdiff.collector.harness.build import HarnessError, HarnessLibrary, HarnessSpec, library_stamp, phone_target

SOURCE_PREFIX = "mnn_"  # the harness's MNN-only source files


def harness_spec(abi: str, backend: str, test_build: bool) -> HarnessSpec:
    root = os.environ.get("MNN_ROOT") or None
    if not root:
        raise HarnessError(f"the MNN harness for {abi} needs an MNN build: set MNN_ROOT to a directory with include/ and lib/")
    return mnn_spec(phone_target(abi), root, test_build=test_build)


def mnn_spec(target: str, root: str, *, test_build: bool = False) -> HarnessSpec:
    """The C++ harness build linking the MNN build in `root` (include/ and lib/)."""
    from layerdiff.collector.engines.phoneharness import cpp_harness_spec

    return cpp_harness_spec(target, {"mnn": linked(root)}, test_build=test_build)


def linked(root: str) -> HarnessLibrary:
    """MNN's part of a harness build that links it; its libraries' names, sizes and mtimes key the build."""
    return HarnessLibrary("MNN", ("--mnn-root", root), SOURCE_PREFIX, key_spec=json.dumps({"mnn_root": root}),
                          key=json.dumps({"mnn": library_stamp(root, "libMNN*")}))


def absent(target: str, vulkan: bool, test_build: bool) -> HarnessLibrary:
    return HarnessLibrary(source_prefix=SOURCE_PREFIX, key_spec=json.dumps({"mnn_root": None}), key=json.dumps({"mnn": None}))
