"""Every precision label held against the bytes it describes, on real engines.

`precision_effective` is read from the engine (MNN's backend and its own selection rule, ncnn's
options after load, ONNX Runtime: fp32); these tests measure what the dumped values could have been
stored in (analyzer/measure/storage.py) and fail when a label says otherwise, and when two runs of
one engine give bit-identical tensors under different labels (the x86 MNN wheel used to say fp16 at
cpu/high, where its high and low dumps are the same bytes).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.measure.storage import storage_evidence

LOCAL_CASES = [("convnet.param", backend, precision) for backend in ("cpu", "vulkan")
               for precision in ("high", "normal", "low")] + \
              [("convnet.mnn", "cpu", precision) for precision in ("high", "normal", "low")] + \
              [("convnet.onnx", "cpu", precision) for precision in ("high", "low")]


def _label_and_tensors(path) -> tuple[str, dict[str, np.ndarray]]:
    with DumpFile(path) as dump:
        return str(dump.attrs["precision_effective"]), {row.key: dump.tensor(row.order) for row in dump.layers.itertuples()}


def _assert_label_matches_bytes(path) -> str:
    label, tensors = _label_and_tensors(path)
    evidence = storage_evidence(tensors.values())
    assert evidence.informative > 5, f"{path.name}: too few informative tensors to judge"
    assert evidence.agrees(label), f"{path.name}: labelled {label!r}, its bytes say {evidence.measured()} ({evidence})"
    return evidence.measured()


@pytest.mark.parametrize("model, backend, precision", LOCAL_CASES)
def test_local_label_agrees_with_the_bytes(local_runs, model, backend, precision):
    _assert_label_matches_bytes(local_runs(model, backend, precision))


def test_mnn_on_x86_is_fp32_at_every_precision_and_its_dumps_say_so(local_runs):
    """MNN's x86 AVX backend is forward type 13, as Arm82 is on a phone, but computes in fp32."""
    labels = {}
    for precision in ("high", "normal", "low"):
        with DumpFile(local_runs("convnet.mnn", "cpu", precision)) as dump:
            labels[precision] = dump.attrs["precision_effective"]
    assert labels == {"high": "fp32", "normal": "fp32", "low": "fp32"}


def test_bit_identical_runs_carry_one_label(local_runs):
    """Two runs of one engine whose every tensor is the same bytes computed the same way."""
    paths = [local_runs(*case) for case in LOCAL_CASES]
    loaded = [(path, *_label_and_tensors(path)) for path in paths]
    identical_pairs = 0
    for (p1, l1, t1), (p2, l2, t2) in itertools.combinations(loaded, 2):
        if t1.keys() != t2.keys() or not all(np.array_equal(t1[k], t2[k]) for k in t1):
            continue
        identical_pairs += 1
        assert l1 == l2, f"{p1.name} ({l1}) and {p2.name} ({l2}) hold bit-identical tensors under different labels"
    assert identical_pairs >= 3  # MNN high/normal/low on x86, ncnn cpu high/normal, ORT: the check really ran


def test_arm64_labels_agree_with_the_bytes(arm64_runs):
    """The emulated cortex-a76 really stores fp16 at low (MNN's Arm82, ncnn's fp16 storage), the
    cortex-a53 (no fp16 arithmetic) stays fp32, and every label says what the bytes show."""
    measured = {(cpu, model): _assert_label_matches_bytes(arm64_runs(cpu, model, "low"))
                for cpu in ("cortex-a76", "cortex-a53") for model in ("convnet.mnn", "convnet.param")}
    assert measured[("cortex-a76", "convnet.mnn")] == "fp16"
    assert measured[("cortex-a76", "convnet.param")] == "fp16"
    assert measured[("cortex-a53", "convnet.mnn")] == "fp32"
    assert _assert_label_matches_bytes(arm64_runs("cortex-a76", "convnet.mnn", "high")) == "fp32"
