"""Which C++ harness build runs Paddle-Lite on a phone (`Engine.harness_spec`): no ncnn, linked against the
user's Paddle-Lite inference library for that ABI (PADDLE_LITE_ROOT)."""
from __future__ import annotations

import os

from layerdiff.collector.harness.build import HarnessError, HarnessSpec, phone_target


def harness_spec(abi: str, backend: str, test_build: bool) -> HarnessSpec:
    root = os.environ.get("PADDLE_LITE_ROOT") or None
    if not root:
        raise HarnessError(f"the paddle-lite harness for {abi} needs Paddle-Lite's inference library for that ABI: "
                           "set PADDLE_LITE_ROOT to its folder (cxx/include/paddle_api.h, cxx/lib/libpaddle_light_api_shared.so)")
    return HarnessSpec(phone_target(abi), False, None, False, test_build, paddle_lite_root=root)
