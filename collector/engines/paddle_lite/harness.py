"""Which C++ harness build runs Paddle-Lite on a phone (`Engine.harness_spec`): no ncnn, linked against the
user's Paddle-Lite inference library for that ABI (PADDLE_LITE_ROOT); and Paddle-Lite's part of every build."""
from __future__ import annotations

import json
import os

from layerdiff.collector.harness.build import HarnessError, HarnessLibrary, HarnessSpec, library_stamp, phone_target

SOURCE_PREFIX = "paddle_lite"  # the harness's Paddle-Lite-only source files


def harness_spec(abi: str, backend: str, test_build: bool) -> HarnessSpec:
    root = os.environ.get("PADDLE_LITE_ROOT") or None
    if not root:
        raise HarnessError(f"the paddle-lite harness for {abi} needs Paddle-Lite's inference library for that ABI: "
                           "set PADDLE_LITE_ROOT to its folder (cxx/include/paddle_api.h, cxx/lib/libpaddle_light_api_shared.so)")
    return paddle_lite_spec(phone_target(abi), root, test_build=test_build)


def paddle_lite_spec(target: str, root: str, *, test_build: bool = False) -> HarnessSpec:
    """The C++ harness build linking the Paddle-Lite inference library in `root`."""
    from layerdiff.collector.engines.phoneharness import cpp_harness_spec

    return cpp_harness_spec(target, {"paddle-lite": linked(root)}, test_build=test_build)


def linked(root: str) -> HarnessLibrary:
    """Paddle-Lite's part of a harness build that links it: its libraries (and PADDLE_LITE_EXTRA_LIBS) key the build."""
    stamp = library_stamp(root, "libpaddle_*") + [os.environ.get("PADDLE_LITE_EXTRA_LIBS", "")]
    return HarnessLibrary("Paddle-Lite", ("--paddle-lite-root", root), SOURCE_PREFIX,
                          key_spec=json.dumps({"paddle_lite_root": root}), key=json.dumps({"paddle_lite": stamp}))


def absent(target: str, vulkan: bool, test_build: bool) -> HarnessLibrary:
    """Without Paddle-Lite a build's key has no Paddle-Lite entry at all; only its source files stay out."""
    return HarnessLibrary(source_prefix=SOURCE_PREFIX)
