"""Runs are who they say they are: different model files never share a label, `--ref` makes its file
the reference, and a model whose own tensors are fp16 records fp16 as its effective precision.

The two models are one small ONNX network (MatMul, Add, Relu) saved twice under the same file name
in two folders: as float32, and as its float16 copy (weights and input cast, as fp16 export tools
do). Both are collected by ONNX Runtime on the same input file.
"""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import layerdiff


def tiny_model(path: Path, dtype) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    weights = [numpy_helper.from_array(rng.normal(size=(16, 8)).astype(dtype), "W"),
               numpy_helper.from_array(rng.normal(size=(8,)).astype(dtype), "B")]
    kind = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["a"]),
                               helper.make_node("Relu", ["a"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", kind, [1, 16])],
                              [helper.make_tensor_value_info("y", kind, [1, 8])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("identity")
    np.save(tmp / "x.npy", np.random.default_rng(1).normal(size=(1, 16)).astype(np.float32))
    paths = {}
    for kind, dtype in (("fp32", np.float32), ("fp16", np.float16)):
        model = tiny_model(tmp / kind / "tiny.onnx", dtype)
        result = layerdiff.collect(model, inputs=[f"x={tmp / 'x.npy'}"], out=tmp / f"runs-{kind}")
        assert result.exit_code == 0, result.sweep.failed
        [paths[kind]] = result.paths
    return paths


def test_a_model_whose_tensors_are_fp16_records_fp16(two_runs):
    with h5py.File(two_runs["fp16"]) as f:
        assert f.attrs["precision_effective"] == "fp16" and f.attrs["precision_requested"] == "high"
    with h5py.File(two_runs["fp32"]) as f:
        assert f.attrs["precision_effective"] == "fp32"


def test_different_model_files_with_one_name_get_different_labels(two_runs):
    assert two_runs["fp16"].name == two_runs["fp32"].name  # same engine, setting, input and file name
    with layerdiff.analyze([two_runs["fp32"], two_runs["fp16"]]) as results:
        labels = list(results.runs["run"])
    assert len(set(labels)) == 2, labels
    assert all("tiny.onnx (sha256 " in label for label in labels), labels


@pytest.mark.parametrize("ref", ["fp16", "fp32"])
def test_ref_makes_its_file_the_reference(two_runs, ref):
    other = "fp32" if ref == "fp16" else "fp16"
    with layerdiff.analyze([two_runs["fp32"], two_runs["fp16"]], ref=two_runs[ref]) as results:
        runs = results.runs
        reference = results.analysis.comparison.plan.reference
        assert reference.path == two_runs[ref]
        compared = [(p.base.path, p.other.path) for p in results.analysis.comparison.plan.pairs]
    assert compared == [(two_runs[ref], two_runs[other])], compared
    assert len(runs) == 2
