"""A language model's output judged as llama.cpp users judge it: the next token and the KL divergence of the
distribution (analyzer/outputs/nexttoken.py), not the share of logits that moved. Real HDF5 dumps; the
numbers are checked against a plain numpy computation here."""
from __future__ import annotations

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.outputs import nexttoken
from layerdiff.analyzer.outputs.task import parse_task
from tests.analyze_dumps import write_dump

VOCAB = 70_000  # above the class-score limit (65,536): an LLM vocabulary, not a classifier's classes


def numpy_kld(ref: np.ndarray, run: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(run)) per row, written out plainly."""
    p = np.exp(ref - ref.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
    q = np.exp(run - run.max(1, keepdims=True)); q /= q.sum(1, keepdims=True)
    return (p * (np.log(p) - np.log(q))).sum(1)


def logits(positions: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 2.0, (positions, VOCAB)).astype(np.float32)
    x[np.arange(positions), rng.integers(0, VOCAB, positions)] += 20.0  # a clear next token per position
    return x


def ggml_dumps(folder, ref: np.ndarray, run: np.ndarray, **run_attrs):
    """Two ggml-like dumps whose output is llama.cpp's `result_output` (no task recorded)."""
    layers = [("inp_embd", "GET_ROWS", [], (ref.shape[0], 64)), ("result_output", "MUL_MAT", ["inp_embd"], ref.shape)]
    embd = np.random.default_rng(5).normal(size=(ref.shape[0], 64)).astype(np.float32)
    write_dump(folder / "cpu_high.h5", {"inp_embd": embd, "result_output": ref}, layers=layers, engine="ggml")
    write_dump(folder / "cpu_low.h5", {"inp_embd": embd, "result_output": run}, layers=layers, engine="ggml",
               precision="low", **run_attrs)


def verdict(folder, task=None) -> tuple[str, str, list[str]]:
    analysis = analyze_paths([folder], task=task)
    try:
        (row,) = [r for r in analysis.summary.to_dict("records") if r["role"] == "compared"]
        return row["verdict"], row["verdict_reason"], [f.sentence for f in analysis.findings]
    finally:
        analysis.close()


def test_numbers_agree_with_numpy():
    ref = logits(5)
    run = ref + np.random.default_rng(1).normal(0, 0.3, ref.shape).astype(np.float32)
    c = nexttoken.compare_logits(ref, run, tolerance=0.1)
    expected = numpy_kld(ref.astype(np.float64), run.astype(np.float64))
    assert c["kld_mean"] == pytest.approx(float(expected.mean()), rel=1e-9)
    assert c["kld_max"] == pytest.approx(float(expected.max()), rel=1e-9)
    assert c["positions"] == c["decided"] == 5 and c["flips"] == 0 and c["top5"] == 1.0
    assert c["top1_reference"] == int(np.argmax(ref[-1]))


def test_moved_logits_with_the_same_tokens_are_not_a_failure(tmp_path):
    """Like a q8_0 KV cache: many logits move beyond 1% of the largest, the next token and the distribution
    stay: the layer's own status is said (warn), the run is no failure."""
    ref = logits(4)
    run = ref + np.random.default_rng(2).normal(0, 0.3, ref.shape).astype(np.float32)
    moved = np.abs(run - ref) > 1e-3 + 1e-2 * np.abs(ref).max()
    assert moved.mean() > 0.2  # the element rule alone would fail this run
    ggml_dumps(tmp_path, ref, run)
    status, reason, findings = verdict(tmp_path)
    kld = float(numpy_kld(ref.astype(np.float64), run.astype(np.float64)).mean())
    assert kld < 0.01 and status == "warn" and "the decoded outputs are unchanged" in reason, (status, reason)
    assert any("next token kept at 4 of 4" in f and "language-model" in f for f in findings)


def test_a_changed_next_token_fails_and_names_both_tokens(tmp_path):
    ref = logits(3)
    run = ref.copy()
    best = int(np.argmax(ref[-1]))
    run[-1, best] -= 20.0  # the last position's clear winner loses
    ggml_dumps(tmp_path, ref, run)
    status, reason, _ = verdict(tmp_path)
    assert status == "fail"
    assert f"the last position's token {best} became {int(np.argmax(run[-1]))}" in reason


def test_a_distribution_that_moved_warns_and_fails_by_kl_divergence(tmp_path):
    ref = logits(2)
    flat = ref * 0.6  # the same order of tokens, a much flatter distribution
    kld = float(numpy_kld(ref.astype(np.float64), flat.astype(np.float64)).mean())
    ggml_dumps(tmp_path, ref, flat)
    assert verdict(tmp_path, f"language-model:kld_warn={kld / 2},kld_fail={kld * 2}")[0] == "warn"
    assert verdict(tmp_path, f"language-model:kld_warn={kld / 4},kld_fail={kld / 2}")[0] == "fail"


def test_nan_logits_fail(tmp_path):
    ref = logits(2)
    run = ref.copy()
    run[0, :10] = np.nan
    ggml_dumps(tmp_path, ref, run)
    assert verdict(tmp_path)[0] == "fail"


def test_other_engines_need_the_task_declared(tmp_path):
    """An ONNX or MNN output named anything is no LLM by default: only ggml's result_output is recognised."""
    ref = logits(2)
    run = ref + np.random.default_rng(3).normal(0, 0.3, ref.shape).astype(np.float32)
    layers = [("inp_embd", "Gather", [], (2, 64)), ("result_output", "MatMul", ["inp_embd"], ref.shape)]
    embd = np.zeros((2, 64), np.float32)
    write_dump(tmp_path / "a.h5", {"inp_embd": embd, "result_output": ref}, layers=layers)
    write_dump(tmp_path / "b.h5", {"inp_embd": embd, "result_output": run}, layers=layers, precision="low")
    assert verdict(tmp_path)[0] == "fail"  # judged by elements: a third of the logits moved
    status, reason, _ = verdict(tmp_path, "llm")
    assert status == "warn" and "the decoded outputs are unchanged" in reason


def test_task_options_are_checked():
    assert parse_task("lm").text == "language-model"
    assert parse_task("language-model:kld_warn=0.02").get("kld_warn") == 0.02
    with pytest.raises(Exception, match="unknown option"):
        parse_task("language-model:conf=0.5")


def test_the_logits_output_is_the_one_the_engine_declares_among_several(tmp_path):
    """A second vocabulary-wide output beside the logits: the engine's declared logits output is read (its next
    token changed: fail); an engine that declares none leaves the choice to `output=NAME`."""
    ref = logits(2)
    run = ref.copy()
    run[0] = logits(1, seed=9)[0]  # the clear next token at position 0 moves
    other = logits(2, seed=4)
    layers = [("inp_embd", "GET_ROWS", [], (2, 64)), ("result_output", "MUL_MAT", ["inp_embd"], ref.shape),
              ("aux_scores", "MUL_MAT", ["inp_embd"], other.shape)]
    embd = np.zeros((2, 64), np.float32)
    for engine, folder in (("ggml", tmp_path / "declared"), ("onnxruntime", tmp_path / "undeclared")):
        folder.mkdir()
        write_dump(folder / "cpu_high.h5", {"inp_embd": embd, "result_output": ref, "aux_scores": other},
                   layers=layers, engine=engine)
        write_dump(folder / "cpu_low.h5", {"inp_embd": embd, "result_output": run, "aux_scores": other},
                   layers=layers, engine=engine, precision="low")
    status, reason, _ = verdict(tmp_path / "declared", "language-model")
    assert status == "fail" and "result_output" in reason, reason
    status, reason, findings = verdict(tmp_path / "undeclared", "language-model")
    said = [reason, *findings]
    assert any("no single output holds next-token logits" in text for text in said), said
    status, reason, _ = verdict(tmp_path / "undeclared", "language-model:output=result_output")
    assert status == "fail" and "result_output" in reason, reason
