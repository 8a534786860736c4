"""Explanations that hold against a layer's inputs, on real HDF5 dumps with one known defect placed at a
known layer: a NaN/Inf origin or failure source whose input already holds the anomaly moves to where it
starts, the first divergence is where the error enters (not where it first crosses a threshold), and
statistics of tensors near float32's limit stay finite."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.tensorstats import tensor_stats
from layerdiff.collector.engines import ENGINES
from tests.analyze_dumps import write_dump

SHAPE = (1, 4, 8, 8)


def chain(*ops: tuple[str, str]) -> list[tuple]:
    """A straight graph: each layer reads the one before it (the first reads the model input)."""
    layers, previous = [], "data"
    for op, op_type in ops:
        layers.append((op, op_type, [previous], SHAPE))
        previous = op
    return layers


def kinds(analysis, kind):
    return [f for f in analysis.findings if f.kind == kind]


def noisy(array: np.ndarray, rel: float, seed: int) -> np.ndarray:
    """`array` with noise of relative L2 size `rel` (exactly, up to float32 rounding)."""
    noise = np.random.default_rng(seed).normal(size=array.shape)
    noise *= rel * np.linalg.norm(array) / np.linalg.norm(noise)
    return (array + noise).astype(np.float32)


def rel_l2(ref: np.ndarray, run: np.ndarray) -> float:
    ref, run = ref.astype(np.float64), run.astype(np.float64)
    return float(np.linalg.norm(run - ref) / np.linalg.norm(ref))


LOG_GRAPH = chain(("conv", "Convolution"), ("scale", "BinaryOp"), ("clip", "Clip"), ("log", "UnaryOp"),
                  ("fc", "InnerProduct"))


def log_fed_zeros(tmp_path):
    """The reference's `scale` holds a few tiny positive values; the run flushes them to exact zeros there
    (and `clip` carries them), so `log` makes -Inf: the Log did not break, it was fed zeros."""
    rng = np.random.default_rng(0)
    ref = {"conv": rng.normal(size=SHAPE).astype(np.float32)}
    scale = (np.abs(rng.normal(size=SHAPE)) + 0.5).astype(np.float32)
    scale.reshape(-1)[:12] = 2e-6
    ref.update(scale=scale, clip=scale.copy(), log=np.log(scale), fc=rng.normal(size=SHAPE).astype(np.float32))
    run = {k: noisy(v, 1e-5, seed=i) for i, (k, v) in enumerate(ref.items())}
    for op in ("scale", "clip"):
        run[op].reshape(-1)[:12] = 0.0
    with np.errstate(divide="ignore"):
        run["log"] = np.log(run["clip"])
    run["fc"] = noisy(ref["fc"], 0.5, seed=9)
    run["fc"].reshape(-1)[:12] = -np.inf
    write_dump(tmp_path / "ref.h5", ref, layers=LOG_GRAPH)
    write_dump(tmp_path / "low.h5", run, layers=LOG_GRAPH, backend="cpu", precision="low")
    return ref, run


def test_inf_origin_and_failure_source_move_to_where_the_zeros_start(tmp_path):
    ref, run = log_fed_zeros(tmp_path)
    # numpy's judgement: the Log's input passes on rel L2 yet holds zeros the reference does not have,
    # born at `scale` (its input `conv` has none)
    assert rel_l2(ref["clip"], run["clip"]) < 1e-2
    new_zeros = {op: int(np.count_nonzero((run[op] == 0) & (ref[op] != 0))) for op in ("conv", "scale", "clip")}
    assert new_zeros == {"conv": 0, "scale": 12, "clip": 12}
    assert np.isinf(run["log"]).sum() == 12 and not np.isinf(run["clip"]).any()
    analysis = analyze_paths([tmp_path])
    try:
        table = analysis.comparison.table.set_index("key")
        assert table.loc["clip:0", "n_zero_new"] == 12 and table.loc["conv:0", "n_zero_new"] == 0
        assert table.loc["clip:0", "status"] == "pass"
        (origin,) = kinds(analysis, "inf_origin")
        assert origin.layer == "scale:0" and origin.numbers["moved_from"] == "log:0"
        assert origin.numbers["anomalous_input"] == "clip:0" and origin.numbers["anomaly_count"] == 12
        assert "its input clip:0 already holds 12 exact zeros" in origin.sentence
        assert "that starts at layer scale:0" in origin.sentence
        assert "overflowed" not in origin.sentence
        (source,) = kinds(analysis, "failure_source")
        assert source.layer == "scale:0" and source.numbers["moved_from"] == "log:0"
        assert "this op breaks" not in source.sentence and "rel L2 does not show them" in source.sentence
    finally:
        analysis.close()


OVERFLOW_GRAPH = chain(("conv", "Convolution"), ("mel", "MatMul"), ("square", "BinaryOp"), ("fc", "InnerProduct"))


def test_inf_origin_moves_to_the_input_far_outside_the_reference_range(tmp_path):
    """An audio front end in fp16: `mel` already reaches -28,450 where the reference's minimum is -10, and
    `square` overflows on it. "An intermediate sum overflowed" would blame `square` for its input."""
    rng = np.random.default_rng(1)
    ref = {op: np.clip(rng.normal(size=SHAPE), -3, 3).astype(np.float32) for op, *_ in OVERFLOW_GRAPH}
    ref["mel"].reshape(-1)[0] = -10.0
    ref["square"] = ref["mel"] ** 2
    run = {k: noisy(v, 1e-4, seed=i) for i, (k, v) in enumerate(ref.items())}
    run["mel"].reshape(-1)[:5] = -28450.0
    run["square"] = (ref["mel"] ** 2).astype(np.float32)
    run["square"].reshape(-1)[:5] = np.inf
    run["fc"].reshape(-1)[:5] = np.nan
    write_dump(tmp_path / "ref.h5", ref, layers=OVERFLOW_GRAPH)
    write_dump(tmp_path / "low.h5", run, layers=OVERFLOW_GRAPH, backend="cpu", precision="low")
    assert run["mel"].min() < ref["mel"].min() - 1000 and np.isfinite(run["mel"]).all()
    analysis = analyze_paths([tmp_path])
    try:
        table = analysis.comparison.table.set_index("key")
        assert table.loc["mel:0", "n_out_of_range"] == 5 and table.loc["mel:0", "range_excess"] > 1000
        assert table.loc["conv:0", "range_excess"] < 0.01  # rounding past the maximum is no anomaly
        (origin,) = kinds(analysis, "inf_origin")
        assert origin.layer == "mel:0" and origin.numbers["moved_from"] == "square:0"
        assert "down to -28,450 where the reference's minimum is -10" in origin.sentence
        assert "overflowed" not in origin.sentence
    finally:
        analysis.close()


ENCODER = chain(("embed", "Gather"), ("fc1", "MatMul"), ("gelu", "GELU"), ("fc2", "MatMul"), ("add", "BinaryOp"),
                ("norm", "LayerNorm"), ("next/fc1", "MatMul"), ("next/gelu", "GELU"))


def test_first_divergence_is_where_the_error_enters_not_where_it_crosses(tmp_path):
    """The error enters at `gelu` (3.2e-7 -> 5.5e-4: a tanh approximation) and doubles on its way until
    `next/fc1` crosses the warn threshold (1e-2): that layer only carries it."""
    rng = np.random.default_rng(3)
    ref = {op: rng.normal(0.0, 0.1, size=SHAPE).astype(np.float32) for op, *_ in ENCODER}  # allclose passes below 1e-2
    errors = {"embed": 0.0, "fc1": 3.2e-7, "gelu": 5.5e-4, "fc2": 1.1e-3, "add": 2.2e-3, "norm": 4.4e-3,
              "next/fc1": 1.2e-2, "next/gelu": 2.4e-2}
    run = {op: noisy(ref[op], rel, seed=i) if rel else ref[op].copy() for i, (op, rel) in enumerate(errors.items())}
    write_dump(tmp_path / "ref.h5", ref, layers=ENCODER)
    write_dump(tmp_path / "mnn.h5", run, layers=ENCODER, backend="cpu", precision="normal", engine="mnn")
    measured = {op: rel_l2(ref[op], run[op]) for op in errors}  # numpy's judgement: the biggest jump is gelu's
    jumps = {op: measured[op] / measured[prev] for prev, op in zip(list(errors), list(errors)[1:]) if measured[prev]}
    assert max(jumps, key=jumps.get) == "gelu" and jumps["next/fc1"] < 3
    analysis = analyze_paths([tmp_path])
    try:
        (first,) = kinds(analysis, "first_divergence")
        assert first.layer == "gelu:0" and first.op_type == "GELU"
        assert first.numbers["threshold_layer"] == "next/fc1:0"
        assert first.numbers["input_rel_l2"] == pytest.approx(measured["fc1"], rel=1e-3)
        assert "the error enters at layer gelu:0" in first.sentence and "next/fc1:0" in first.sentence
    finally:
        analysis.close()


@pytest.mark.filterwarnings("error")
def test_statistics_of_an_attention_mask_bias_stay_finite(tmp_path):
    """-3.4e38 (float32's lowest, an attention mask's bias) summed in float32 overflows: mean -inf, std NaN."""
    mask = np.zeros((1, 1, 512, 512), np.float32)
    mask[..., 300:] = np.finfo(np.float32).min
    stats = tensor_stats(mask)
    wide = mask.astype(np.float64)
    assert stats.mean == pytest.approx(wide.mean(), rel=1e-12) and stats.std == pytest.approx(wide.std(), rel=1e-9)
    layers = [("mask", "BinaryOp", ["data"], mask.shape)]
    write_dump(tmp_path / "ref.h5", {"mask": mask}, layers=layers)
    with DumpFile(tmp_path / "ref.h5") as dump:
        row = dump.layers.iloc[0]
        assert math.isfinite(row["mean"]) and math.isfinite(row["std"])
        assert row["mean"] == pytest.approx(wide.mean(), rel=1e-12)


BERT_LIKE = [("inp_embd", "GET_ROWS", ["data"], (1, 4, 8)), ("attn_norm-0", "NORM", ["inp_embd"], (1, 4, 8)),
             ("kq-0", "MUL_MAT", ["attn_norm-0"], (1, 4, 8)), ("ffn_out-0", "MUL_MAT", ["kq-0"], (1, 4, 8))]
LLAMA_LIKE = BERT_LIKE[:3] + [("cache_k_l0 (view)", "SET_ROWS", ["kq-0"], (1, 4, 8)),
                              ("ffn_out-0", "MUL_MAT", ["cache_k_l0 (view)"], (1, 4, 8))]


def ggml_pair(folder, layers):
    """ggml's cpu/high and cpu/normal runs of one graph, the same bytes, recorded as the collector records
    them: each with its engine's declaration of what separates the two precisions."""
    folder.mkdir()
    rng = np.random.default_rng(5)
    arrays = {op: rng.normal(size=shape).astype(np.float32) for op, _t, _i, shape in layers}
    for precision, kv in (("high", "f32"), ("normal", "f16")):
        reach = json.dumps(ENGINES["ggml"].reach_of("cpu", precision))
        write_dump(folder / f"ggml_{precision}.h5", arrays, layers=layers, engine="ggml", precision=precision,
                   precision_requested=precision, precision_effective=f"weights F32, kv {kv}", precision_reach=reach)
    return analyze_paths([folder])


def test_identical_ggml_precisions_are_a_question_only_where_a_kv_cache_could_differ(tmp_path):
    """ggml's high and normal differ on the CPU only in the KV cache's type and a convolution's IM2COL type:
    a BERT graph (neither) computes the same bytes at both by design; a graph with a cache that gives the
    same bytes has a wrong label."""
    assert ENGINES["ggml"].reach_of("cpu", "high") == {"normal": ["IM2COL", "SET_ROWS"]}
    encoder = ggml_pair(tmp_path / "bert", BERT_LIKE)
    decoder = ggml_pair(tmp_path / "llama", LLAMA_LIKE)
    try:
        (same,) = [f for f in encoder.findings if f.kind == "precision_label"]
        assert same.severity == "info" and same.numbers["same_by_design"] is True
        assert "at least one label is wrong" not in same.sentence and "SET_ROWS" in same.sentence
        (question,) = [f for f in decoder.findings if f.kind == "precision_label"]
        assert question.severity == "warn" and "at least one label is wrong" in question.sentence
    finally:
        encoder.close()
        decoder.close()
