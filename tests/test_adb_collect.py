"""End to end on a stand-in phone: collect_run through AdbDevice → raw dump pulled → HDF5."""
from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.transport.adb import AdbDevice
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from tests.conftest import MODELS


@pytest.fixture
def fake_harness_for_x86_64(fake_harness, monkeypatch):
    """layerdiff.collector.harness.build honours LAYERDIFF_HARNESS_<ABI>: the stand-in gets our fake harness."""
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))
    return fake_harness


def _spec(**kw) -> RunSpec:
    inputs = InputSet("random0", {"data": np.zeros((1, 3, 8, 8), np.float32)}, "random:0")
    return RunSpec(resolve_model(MODELS / "convnet.param"), "cpu", "normal", inputs, **kw)


def test_collect_on_a_standin_writes_hdf5_with_the_phone_in_provenance(standins, fake_harness_for_x86_64, tmp_path):
    phone = standins.start(props={"ro.soc.model": "SM8550", "ro.board.platform": "kalama"})
    device = AdbDevice(phone.serial)
    seen: list[tuple[int, int, str]] = []
    outcome = collect_run(device, _spec(extra_args=["--tensors", "4"]), tmp_path / "out",
                          on_progress=lambda k, n, op: seen.append((k, n, op)))
    assert outcome.status == "done", outcome.message
    assert seen[-1] == (4, 4, "layer3/conv")
    with h5py.File(outcome.paths[0]) as f:
        assert f.attrs["device_serial"] == phone.serial and f.attrs["soc"] == "SM8550"
        assert bool(f.attrs["complete"]) and int(f.attrs["exit_status"]) == 0 and len(f["layers"]) == 4
    assert not list(phone.host_path("/data/local/tmp/layerdiff/runs").iterdir())  # run dir cleaned up
    again = AdbDevice(phone.serial)
    assert collect_run(again, _spec(extra_args=["--tensors", "4"]), tmp_path / "out2").status == "done"
    assert again.pushed == []  # harness, model and input were already on the phone


def test_crash_on_a_standin_keeps_the_partial_dump(standin, fake_harness_for_x86_64, tmp_path):
    outcome = collect_run(AdbDevice(standin.serial), _spec(extra_args=["--abort-after", "2"]), tmp_path)
    assert outcome.status == "failed" and "signal 6" in outcome.message and outcome.exit_status == -6
    with h5py.File(outcome.paths[0]) as f:
        assert not bool(f.attrs["complete"]) and len(f["layers"]) == 2


def _real_spec(stem: str, backend: str = "cpu", precision: str = "high") -> RunSpec:
    inputs = InputSet(stem, {"data": np.load(MODELS.parent / "inputs" / f"{stem}.npy")}, f"samples/inputs/{stem}.npy")
    return RunSpec(resolve_model(MODELS / f"{stem}.param"), backend, precision, inputs, deadline_s=300)


def test_real_host_harness_on_an_x86_64_standin(standin, monkeypatch, tmp_path):
    """The C++ harness (host build) staged, run and pulled through adb exactly as on a phone."""
    from tests.test_harness_support import host_harness

    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(host_harness()))
    outcome = collect_run(AdbDevice(standin.serial), _real_spec("convnet"), tmp_path)
    assert outcome.status == "done", outcome.message
    with h5py.File(outcome.paths[0]) as f:
        assert bool(f.attrs["complete"]) and f.attrs["engine"] == "ncnn" and len(f["layers"]) > 3
        assert f.attrs["abi"] == "x86_64" and f.attrs["device_serial"] == standin.serial
    with DumpFile(outcome.paths[0]) as dump:  # the plain run's outputs came over adb with the dump (docs/fidelity.md)
        assert dump.provenance["raw_footer"]["plain_run"]["identical"] is True
        assert dump.plain_outputs()["prob:0"].tobytes() == dump.tensor_by_key("prob:0").tobytes()


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++")),
                    reason="needs qemu-user and g++-aarch64-linux-gnu (apt) to build and run the aarch64 harness")
def test_real_static_aarch64_harness_on_an_arm64_standin_under_qemu(standins, monkeypatch, tmp_path):
    """The static aarch64 harness runs on an arm64-v8a stand-in (qemu-aarch64 -cpu max), fp16 at low."""
    from tests.test_harness_support import aarch64_harness

    monkeypatch.setenv("LAYERDIFF_HARNESS_ARM64_V8A", str(aarch64_harness()))
    phone = standins.start(abi="arm64-v8a")
    outcome = collect_run(AdbDevice(phone.serial), _real_spec("convnet", precision="low"), tmp_path)
    assert outcome.status == "done", outcome.message
    with h5py.File(outcome.paths[0]) as f:
        assert bool(f.attrs["complete"]) and f.attrs["abi"] == "arm64-v8a" and len(f["layers"]) > 3
        assert "fp16" in f.attrs["precision_effective"]
