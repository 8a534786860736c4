"""The `arm64` device: MNN's and ncnn's real aarch64 builds under qemu-user, precision read from the engines."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.transport.arm64 import Arm64Device
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.sweep.plan import resolve_devices
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from tests.conftest import MODELS, sample_input

COLLECT = [sys.executable, "-m", "layerdiff.collector.cli"]


def _options(dump: DumpFile) -> dict:
    return dump.provenance["raw_header"]["options"]


def test_mnn_low_is_fp16_on_a_big_core_and_fp32_on_a_little_one(arm64_runs):
    with DumpFile(arm64_runs("cortex-a76", "convnet.mnn", "low")) as big:
        assert big.attrs["precision_effective"] == "fp16" and big.attrs["abi"] == "arm64-v8a"
        assert _options(big)["forward_type_code"] == 13  # MNN ran its Arm82 backend
        assert _options(big)["cpu_features"]["fp16"] == 1
        assert big.attrs["device_serial"] == "arm64" and big.attrs["soc"] == "cortex-a76"
        big_prob = big.tensor_by_key("prob:0")
    with DumpFile(arm64_runs("cortex-a53", "convnet.mnn", "low")) as little:
        assert little.attrs["precision_effective"] == "fp32"
        assert _options(little)["forward_type_code"] == 0 and _options(little)["cpu_features"]["fp16"] == 0
        assert little.attrs["device_serial"] == "arm64:cortex-a53"
        little_prob = little.tensor_by_key("prob:0")
    assert float(np.abs(big_prob - little_prob).max()) > 1e-6  # fp16 arithmetic really happened


def test_ncnn_runs_its_aarch64_fp16_kernels(arm64_runs):
    with DumpFile(arm64_runs("cortex-a76", "convnet.param", "low")) as low:
        assert low.attrs["precision_effective"] == "fp16-storage+arith"
        assert _options(low)["cpu_fp16_arithmetic"] and low.complete
        assert low.attrs["engine"] == "ncnn" and len(low.layers) > 10


def test_a_stuck_emulator_is_killed_at_the_deadline(tmp_path):
    inputs = InputSet("convnet", {"data": sample_input("convnet")}, "samples/inputs/convnet.npy")
    spec = RunSpec(resolve_model(MODELS / "convnet.mnn"), "cpu", "high", inputs, deadline_s=1.0)
    device = Arm64Device("cortex-a76")
    device.runtime()  # built (or found) before the clock starts
    start = time.monotonic()
    outcome = collect_run(device, spec, tmp_path)
    assert outcome.status == "failed" and "deadline of 1s exceeded" in outcome.message
    assert time.monotonic() - start < 10  # the emulator was killed, not waited for
    assert not list(tmp_path.glob("*.h5"))


def test_unknown_cpu_model_is_one_line_naming_the_models(tmp_path):
    result = subprocess.run(COLLECT + ["--device", "arm64:pentium", "-o", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "arm64:pentium: qemu-aarch64 has no such CPU model" in result.stderr and "cortex-a53" in result.stderr


def test_all_lists_this_machine_and_the_emulated_core_first():
    devices = resolve_devices(["all"])
    assert [d.serial for d in devices[:2]] == ["local", "arm64"]
    assert [d.serial for d in resolve_devices(["all"], exclude=["local"])][:1] == ["arm64"]


def test_collect_devices_lists_this_machine_next_to_the_phones():
    Arm64Device().runtime()  # prepared, so the listing probes it (listing itself never downloads)
    done = subprocess.run(COLLECT + ["devices", "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["devices"]
    assert [(r["serial"], r["kind"]) for r in rows[:2]] == [("local", "local"), ("arm64", "qemu")]
    arm64 = rows[1]
    assert arm64["abi"] == "arm64-v8a" and arm64["soc"] == "cortex-a76"
    assert arm64["backends"] == {"ncnn": ["cpu"], "mnn": ["cpu"]}  # the runtime exists: both engines probed


def test_first_arm64_run_prepares_the_runtime_saying_so_and_the_second_does_not(tmp_path):
    """A fresh cache: the runtime is built from apt and PyPI (real downloads), then reused."""
    env = {**os.environ, "LAYERDIFF_CACHE": str(tmp_path / "cache")}
    args = COLLECT + ["--device", "arm64", "--model", str(MODELS / "convnet.param"), "-o", str(tmp_path / "runs")]
    first = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert first.returncode == 0, first.stderr
    assert "arm64: preparing the emulated ARM runtime once" in first.stderr
    assert "arm64 runtime [3/4] installing the aarch64 wheels" in first.stderr and "[4/4] ready" in first.stderr
    assert len(list((tmp_path / "cache" / "arm64").glob("*/READY"))) == 1
    again = subprocess.run(args + ["--force"], capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and "preparing" not in again.stderr, again.stderr
