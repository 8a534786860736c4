"""Alignment by graph structure on a real conversion: ONNX -> pnnx -> ncnn against an ONNX Runtime golden.

pnnx renames every layer, so no name is shared with the ONNX model. The test converts the bundled
sample ONNX model with the pnnx from PyPI, collects it with the real ncnn engine on the local
device, makes the golden with onnxruntime (every intermediate tensor), and checks that structure
matches >= 90% of the ncnn layers that have a counterpart, each match confirmed by its values.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.align.byname import NameRules, align_layers
from layerdiff.analyzer.align.naming import naming_of
from layerdiff.analyzer.measure.compare import value_error
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.importers import import_any
from layerdiff.analyzer.align.structure import op_class, type_agreement
from tests.corpus import pnnx_binary

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "models"


def test_op_class_folds_vocabularies_and_fused_names():
    assert op_class("Convolution") == op_class("Conv") == op_class("", "conv2d_53.tmp_0") == "conv"
    assert op_class("", "batch_norm_0.tmp_2") == "norm"
    assert op_class("Convolution", "convrelu_3") == "act"  # pnnx fused Conv+ReLU writes the ReLU tensor
    assert op_class("", "/blk/act/Relu_output_0") == "act"
    assert op_class("", "x") == ""
    assert type_agreement("conv", "norm") == 1.0 and type_agreement("conv", "softmax") < 0.5


@pytest.fixture(scope="module")
def pnnx_case(tmp_path_factory):
    """The sample model converted by pnnx, run on ncnn, and its ONNX Runtime golden."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    pnnx = str(pnnx_binary())  # the converter inside the pnnx wheel (its console script imports torch)
    work = tmp_path_factory.mktemp("pnnx")
    model = onnx.load(str(SAMPLES / "convnet.onnx"))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(3).random(shape, dtype=np.float32)
    np.save(work / "x.npy", x)
    names = [o for node in model.graph.node for o in node.output if o]
    del model.graph.output[:]
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    np.savez(work / "golden.npz", **dict(zip(names, session.run(None, {model.graph.input[0].name: x}))))
    shutil.copy(SAMPLES / "convnet.onnx", work / "net.onnx")
    subprocess.run([pnnx, "net.onnx"], cwd=work, check=True, capture_output=True, timeout=600)
    param = work / "net.ncnn.param"
    # pnnx declares no Input shape; give it one (the collector side reads it from the input)
    text = re.sub(r"^(Input\s+\S+\s+0 1 \S+)\s*$", rf"\1 0={shape[3]} 1={shape[2]} 2={shape[1]}",
                  param.read_text(), flags=re.M)
    param.write_text(text)
    input_name = re.search(r"^Input\s+(\S+)", text, flags=re.M).group(1)
    subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model", str(param),
                    "--backend", "cpu", "--precision", "high", "--input", f"{input_name}={work / 'x.npy'}",
                    "-o", str(work / "runs"), "--no-report"], check=True, capture_output=True, timeout=600)
    return import_any(work / "golden.npz"), next((work / "runs").glob("*.h5"))


class _Run:
    def __init__(self, dump: DumpFile) -> None:
        self.dump, self.layers = dump, dump.layers


def test_pnnx_ncnn_aligns_with_onnx_golden_by_structure(pnnx_case):
    golden_path, ncnn_path = pnnx_case
    with DumpFile(golden_path) as golden, DumpFile(ncnn_path) as ncnn:
        assert not set(golden.layers["op"]) & set(ncnn.layers["op"])  # no name in common
        result = align_layers(golden.layers, ncnn.layers, NameRules(), value_error(_Run(golden), _Run(ncnn)),
                              naming=naming_of(golden.attrs, ncnn.attrs))
        error = value_error(_Run(golden), _Run(ncnn))
        rows_g = {int(o): i for i, o in enumerate(golden.layers["order"])}
        rows_n = {int(o): j for j, o in enumerate(ncnn.layers["order"])}
        matched = result.matched
        assert set(matched["match"]) == {"structure"}
        assert matched["confidence"].between(0, 1).all()
        errors = [error(rows_g[b], rows_n[o]) for b, o in zip(matched["base_order"], matched["other_order"])]
        assert max(errors) < 0.05, "a structural match pairs tensors that differ"  # no false match
        # every ncnn layer (not Input/Split copies) whose tensor exists in the golden is matched
        with_counterpart = [j for j, (op, kind) in enumerate(zip(ncnn.layers["op"], ncnn.layers["op_type"]))
                            if kind not in ("Input", "Split")
                            and any(error(i, j) < 0.02 for i in range(len(golden.layers)))]
        hit = set(rows_n[o] for o in matched["other_order"])
        assert len(hit & set(with_counterpart)) >= 0.9 * len(with_counterpart)
        assert len(with_counterpart) >= 5
