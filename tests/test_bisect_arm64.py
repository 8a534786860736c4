"""`collect bisect` on an arm64 phone: the static aarch64 C++ harness on an arm64-v8a stand-in under
qemu-aarch64 (-cpu max: real fp16 storage and arithmetic at precision low), through the real adb;
every run dumps only the model output."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.transport.adb import AdbDevice
from layerdiff.collector.fix.bisect import bisect, bisect_document, summary_lines
from layerdiff.collector.engines.ncnn.patch import layer_names
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from tests.conftest import MODELS, sample_input

pytestmark = pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-g++")),
                                reason="needs qemu-user and g++-aarch64-linux-gnu (apt) for the aarch64 harness")


def test_bisect_on_an_arm64_phone_names_the_end_of_the_kept_prefix(standins, monkeypatch, tmp_path):
    from tests.test_harness_support import aarch64_harness

    monkeypatch.setenv("LAYERDIFF_HARNESS_ARM64_V8A", str(aarch64_harness()))
    phone = AdbDevice(standins.start(abi="arm64-v8a").serial)
    model = resolve_model(MODELS / "overflow.param")
    inputs = [InputSet("overflow", {"data": sample_input("overflow")}, "samples/inputs/overflow.npy")]
    result = bisect(phone, model, "cpu", "low", inputs, tmp_path / "bisect")
    doc = bisect_document(result, device=phone.serial, model=model.name, backend="cpu", precision="low",
                          ref_config=("cpu", "high"))
    assert doc["status"] == "found" and doc["kept_with_producers"]
    assert doc["errors"]["failing"]["overflow"] == "inf"  # fp16 on the phone: NaN out
    # block2/amplify overflows fp16; kept fp32, its 9.5e5 still overflows block2/shrink's fp16 input:
    # the outputs need every layer through block2/shrink kept
    assert [c["layer"] for c in doc["culprits"]] == ["block2/shrink"]
    assert "block2/shrink: the outputs need it and every layer before it kept" in "\n".join(summary_lines(doc))
    movable = doc["layers_movable"]
    assert movable == len(layer_names(MODELS / "overflow.param")) - 1  # all but Input (Split moves on the CPU)
    assert doc["runs"] <= 2 + math.ceil(math.log2(movable))
    for path in sorted((tmp_path / "bisect").rglob("*.h5")):
        with DumpFile(path) as dump:
            assert list(dump.layers["key"]) == ["prob:0"], path
    # numpy: the passing trial (everything through block2/shrink kept) is within 1e-2 of the reference
    order = layer_names(MODELS / "overflow.param")[1:]
    passing = next(s for s in result.steps if s.kept == order[:order.index("block2/shrink") + 1])
    with DumpFile(result.references["overflow"]) as ref, DumpFile(passing.trial.paths["overflow"]) as run:
        a, b = ref.tensor_by_key("prob:0").astype(np.float64), run.tensor_by_key("prob:0").astype(np.float64)
    assert np.linalg.norm(a - b) / np.linalg.norm(a) < 1e-2
