"""Which C++ harness build runs MNN on a phone (`Engine.harness_spec`): linked against the user's MNN build
for that ABI (MNN_ROOT), no ncnn."""
from __future__ import annotations

import os

from layerdiff.collector.harness.build import HarnessError, HarnessSpec, phone_target


def harness_spec(abi: str, backend: str, test_build: bool) -> HarnessSpec:
    root = os.environ.get("MNN_ROOT") or None
    if not root:
        raise HarnessError(f"the MNN harness for {abi} needs an MNN build: set MNN_ROOT to a directory with include/ and lib/")
    return HarnessSpec(phone_target(abi), False, root, False, test_build)
