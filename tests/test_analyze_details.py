"""Report details that misled users: near-zero references, empty op types of
imported layers, a single zero called a collapse, a run that never started said to have died in a layer."""
from __future__ import annotations

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.importers import import_any
from layerdiff.analyzer.importers.optypes import op_type_from_name
from layerdiff.analyzer.measure.metrics import PairKernel, Tolerances
from layerdiff.analyzer.findings.verdict import Thresholds, classify
from tests.analyze_dumps import LAYERS, perturbed, reference_arrays, write_dump


def _compare(ref, run):
    stats = {"n_zero": int(np.count_nonzero(ref == 0)), "mean": float(ref.mean()), "std": float(ref.std())}
    run_stats = {"n_zero": int(np.count_nonzero(run == 0)), "mean": float(run.mean()), "std": float(run.std())}
    return PairKernel(Tolerances()).compare(ref, run, stats, run_stats)


def test_max_rel_is_scale_aware_near_zero_references():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(4096).astype(np.float32)
    ref[:10] = 1e-20  # near-zero references: dividing by them gave max_rel ~1e14
    run = ref + np.float32(1e-6)
    row = _compare(ref, run)
    assert row["max_rel"] < 1e-2 and row["mean_rel"] < 1e-3


def test_one_zero_or_a_flush_of_negligible_values_is_no_collapse():
    t = Thresholds()
    tiny = np.array([1.0, 2.0], dtype=np.float32)
    row = _compare(tiny, np.array([0.0, 2.0], dtype=np.float32))  # one zero = 50% of a 2-value tensor
    assert row["zero_collapse"] == 0.5  # measured, but one value is not a collapse:
    assert "became 0" not in classify(row, t)[1]
    rng = np.random.default_rng(1)
    probs = rng.random(10_000).astype(np.float32)
    probs[:3000] = 3e-5  # background probabilities below fp16's normal range, negligible against the tensor
    flushed = probs.copy()
    flushed[:3000] = 0.0
    row = _compare(probs, flushed)
    assert row["zero_collapse"] == 0.0 and classify(row, t)[0] == "pass"
    real = probs.copy()
    real[5000:9000] = 0.0  # values that matter gone: still a collapse
    row = _compare(probs, real)
    assert row["zero_collapse"] > 0.3 and "became 0" in classify(row, t)[1]


def test_imported_layers_get_op_types_from_names_and_an_onnx_beside(tmp_path):
    assert op_type_from_name("/blk/conv/Conv_output_0") == "Conv"
    assert op_type_from_name("p2o.pd_op.conv2d.43.0") == "conv2d"
    assert op_type_from_name("batch_norm_0.tmp_2") == "batch_norm"
    assert op_type_from_name("x") == "" and op_type_from_name("logits") == ""
    ref = reference_arrays()
    np.savez(tmp_path / "golden.npz", **{"/net/conv/Conv_output_0": ref["conv1"], "logits": ref["prob"]})
    with DumpFile(import_any(tmp_path / "golden.npz", None, tmp_path / "g.h5")) as dump:
        assert dict(zip(dump.layers["op"], dump.layers["op_type"])) == {"/net/conv/Conv_output_0": "Conv", "logits": ""}
    onnx = pytest.importorskip("onnx")
    helper = onnx.helper
    graph = helper.make_graph([helper.make_node("Softmax", ["z"], ["logits"])], "g",
                              [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 10])],
                              [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 10])])
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    with DumpFile(import_any(tmp_path / "golden.npz", None, tmp_path / "g2.h5")) as dump:
        assert dict(zip(dump.layers["op"], dump.layers["op_type"]))["logits"] == "Softmax"


def test_a_run_that_never_started_is_not_said_to_die_in_a_layer(tmp_path):
    ref = reference_arrays()
    write_dump(tmp_path / "ref.h5", ref)
    inputs_only = [("data", "Input", [], (1, 3, 8, 8))] + LAYERS
    write_dump(tmp_path / "cl.h5", {"data": np.zeros((1, 3, 8, 8), np.float32)}, layers=inputs_only,
               backend="opencl", complete=False, exit_status=1)
    write_dump(tmp_path / "vk.h5", perturbed(ref, 1e-5), backend="vulkan")
    analysis = analyze_paths([tmp_path])
    try:
        (finding,) = [f for f in analysis.findings if f.kind == "incomplete_run"]
        assert "before its first layer" in finding.sentence and "died in" not in finding.sentence
    finally:
        analysis.close()
