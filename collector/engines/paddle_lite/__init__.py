"""collector/engines/paddle_lite: Paddle-Lite `.nb` models (from Paddle-Lite's opt) in the C++ harness.

On phones the harness is built against the user's Paddle-Lite inference library (PADDLE_LITE_ROOT)
with the NDK; the `local` device runs the same C++ engine built for the host (engine.py).
"""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.base import Engine, InputSpecs


def _input_specs(path: Path) -> InputSpecs:
    from layerdiff.collector.engines.paddle_lite.nbfile import read_nb

    model = read_nb(path)
    return {name: (model.var_dims.get(name) or None, model.var_dtypes.get(name, "float32")) for name in model.feeds}



def _harness_spec(abi: str, backend: str, test_build: bool):
    from layerdiff.collector.engines.paddle_lite.harness import harness_spec

    return harness_spec(abi, backend, test_build)


def _harness_absent(target: str, vulkan: bool, test_build: bool):
    from layerdiff.collector.engines.paddle_lite.harness import absent

    return absent(target, vulkan, test_build)


# Variables are read after the run; fusion removed the variables it fused from the .nb (never asked for), and
# those in OpenCL memory are listed as not readable (the header's options.not_observable), never dumped.
WRITES = (("*", "every variable of the optimised program is read after the run with GetTensor (variables fusion "
                "removed are not in the .nb; those held in OpenCL memory are listed as not readable, never dumped)"),)
# Why `collect repro` writes no Paddle-Lite bundle.
REPRO_REFUSAL = ("a Paddle-Lite `.nb` is written only by Paddle-Lite's `opt` from a Paddle program, and no Python "
                 "package writes or edits one, so no op can be cut out of it; `collect isolate` re-runs its layers")
# paddlelite's releases on PyPI are wheels only (no source distribution), and the harness links the user's own
# Paddle-Lite library (PADDLE_LITE_ROOT): no release can be built here from the package index.
RELEASE_REFUSAL = ("the package index has no Paddle-Lite source distribution (paddlelite's releases are wheels "
                   "only) to build the harness's Paddle-Lite from; the harness links the library in PADDLE_LITE_ROOT, "
                   "so set it to another release's library instead")


ENGINE = Engine("paddle-lite", (".nb",), _input_specs, writes=WRITES, repro_refusal=REPRO_REFUSAL, release_refusal=RELEASE_REFUSAL, backends=("cpu", "opencl"), on_phones=True, harness_spec=_harness_spec, harness_absent=_harness_absent, model_help="Paddle-Lite .nb")
