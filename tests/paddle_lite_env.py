"""Paddle-Lite for the tests: `opt` from PyPI's paddlelite (a Python 3.10 venv made by setup_host.sh --test),
and the C++ harness's paddle-lite engine where PADDLE_LITE_ROOT names a Paddle-Lite inference library.

Both are optional on a machine: tests that need them skip, saying which is missing.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from layerdiff.collector.harness.build import cache_root


def opt_binary() -> Path | None:
    """paddle_lite_opt: $LAYERDIFF_PADDLELITE_OPT, else the venv setup_host.sh --test makes."""
    named = os.environ.get("LAYERDIFF_PADDLELITE_OPT")
    candidate = Path(named) if named else cache_root() / "paddlelite-py310" / "bin" / "paddle_lite_opt"
    return candidate if candidate.is_file() else None


def optimise(program: Path, target: str, out_stem: Path) -> Path:
    """`opt --valid_targets=TARGET` of a .pdmodel (+ .pdiparams): the .nb a Paddle-Lite user deploys."""
    opt = opt_binary()
    if opt is None:
        pytest.skip("Paddle-Lite's opt is not installed (setup_host.sh --test makes it where a Python 3.10 exists)")
    cmd = [str(opt), f"--model_file={program}", f"--param_file={program.with_suffix('.pdiparams')}",
           f"--optimize_out={out_stem}", f"--valid_targets={target}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    nb = out_stem.with_suffix(".nb")
    assert proc.returncode == 0 and nb.is_file(), proc.stdout[-1000:] + proc.stderr[-1000:]
    return nb


def need_paddle_lite_root() -> str:
    root = os.environ.get("PADDLE_LITE_ROOT")
    if not root:
        pytest.skip("PADDLE_LITE_ROOT is not set: no Paddle-Lite C++ library to build the paddle-lite engine against")
    return root
