"""`collect fix` on an arm64 phone: the static aarch64 C++ harness on an arm64-v8a stand-in under
qemu-aarch64 (-cpu max: real fp16 storage and arithmetic at precision low), through the real adb."""
from __future__ import annotations

import shutil

import numpy as np

import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.transport.adb import AdbDevice
from layerdiff.collector.fix.search import fix
from layerdiff.collector.fix.fixjson import fix_document
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.engines.ncnn.patch import layer_names
from layerdiff.samples.catalog import reference
from tests.conftest import MODELS, sample_input

pytestmark = pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++")),
                                reason="needs qemu-user and g++-aarch64-linux-gnu (apt) for the aarch64 harness")


def test_fix_on_an_arm64_phone_patches_the_model_the_phone_runs(standins, monkeypatch, tmp_path):
    from tests.test_harness_support import aarch64_harness

    monkeypatch.setenv("LAYERDIFF_HARNESS_ARM64_V8A", str(aarch64_harness()))
    phone = AdbDevice(standins.start(abi="arm64-v8a").serial)
    model = resolve_model(MODELS / "overflow.param")
    inputs = [InputSet("overflow", {"data": sample_input("overflow")}, "samples/inputs/overflow.npy")]
    result = fix(phone, model, "cpu", "low", inputs, tmp_path / "fix")
    doc = fix_document(result, device=phone.serial, model=model.name, engine="ncnn", backend="cpu",
                       precision="low", tolerance=1e-2)
    assert doc["status"] == "fixed" and doc["errors"]["overflow"]["before"] == "inf"  # fp16 on the phone: NaN out
    assert doc["errors"]["overflow"]["after"] < 1e-2
    kinds = {item["layer"]: item["kind"] for item in doc["layers"]}
    assert kinds["block2/amplify"] == "inf_origin"
    # on the CPU a kept layer keeps its producers: the chosen layers are a prefix of the model
    order = layer_names(MODELS / "overflow.param")[1:]
    assert list(kinds) == order[:len(kinds)] and "block2/shrink" in kinds
    with DumpFile(result.after.paths["overflow"]) as dump:
        assert dump.attrs["abi"] == "arm64-v8a" and "fp16" in dump.attrs["precision_effective"]
        prob = dump.tensor_by_key("prob:0").astype(np.float64).ravel()
    ref = reference("overflow")["prob:0"].astype(np.float64).ravel()
    assert np.isfinite(prob).all() and np.linalg.norm(prob - ref) / np.linalg.norm(ref) < 1e-2


@pytest.mark.parametrize("model", ["overflow.param", "overflow.mnn"])
def test_fix_on_the_arm64_device_finds_finite_outputs(tmp_path, model):
    """`--device arm64` (the engines' aarch64 wheels under qemu, real fp16): ncnn gets a patched model,
    MNN the what-if; either way the outputs become finite and close to the high-precision run."""
    import json

    from tests.test_collect_cli import collect
    from tests.conftest import MODELS, SAMPLES

    out = tmp_path / "fix"
    done = collect("fix", "--device", "arm64", "--model", MODELS / model, "--backend", "cpu", "--precision", "low",
                   "--input", SAMPLES / "inputs" / "overflow.npy", "-o", out)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((out / "fix.json").read_text())
    assert doc["status"] == "fixed" and doc["layers"]
    before, after = doc["errors"]["overflow"]["before"], doc["errors"]["overflow"]["after"]
    assert not float(before) < 0.1 and float(after) < 1e-2  # before: NaN/Inf or far off; after: within tolerance
    if model.endswith(".param"):
        assert doc["mode"] == "feature-mask" and (out / "overflow.fixed.param").is_file()
