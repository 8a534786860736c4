"""Tensor summaries from the ggml harness (llama.cpp, a transformer language model): the native writer agrees
with the Python one on every node, and a sketch-first copy of its low-precision run (q8_0 KV cache with flash
attention) gives the verdict, first divergence and failure sources of the whole dump."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats import sketchformat as sf
from layerdiff.analyzer.formats.rawdump import PULLED, convert_raw_dump, read_raw_dump
from tests.ggml_support import ggml_binary, ggml_samples, run_ggml  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama_runs(ggml_binary, ggml_samples, tmp_path_factory):  # noqa: F811
    work = tmp_path_factory.mktemp("sketch-ggml")
    for precision in ("high", "low"):
        proc = run_ggml(ggml_binary, work / precision, ggml_samples["tinyllama"], f"prompt={ggml_samples['prompt']}",
                        "cpu", precision)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return work


def test_ggml_summaries_agree_with_the_python_writer(llama_runs):
    raw = read_raw_dump(llama_runs / "high")
    written = sf.read_summaries(llama_runs / "high")
    assert len(written.tensors) == len(raw.tensors) > 20
    for tensor, array in raw.iter_arrays():
        mine, theirs = sf.summarize(array), written.tensors[tensor.order]
        assert theirs.sample.tobytes() == mine.sample.tobytes(), tensor.name
        assert {k: theirs.stats[k] for k in sf.STAT_FIELDS} == {k: mine.stats[k] for k in sf.STAT_FIELDS}
        scale = np.sqrt(mine.stats["sumsq"]) or 1.0
        assert np.allclose(theirs.sketch, mine.sketch, rtol=1e-9, atol=1e-12 * scale), tensor.name


def test_sketched_llm_run_gives_the_full_answers(llama_runs, tmp_path):
    golden = convert_raw_dump(llama_runs / "high", tmp_path / "high.h5")
    full = convert_raw_dump(llama_runs / "low", tmp_path / "low.h5")
    copy = shutil.copytree(llama_runs / "low", tmp_path / "low_raw")
    dump = read_raw_dump(copy)
    outputs = [dump.tensors[-1].order]  # only the logits pulled: every other node known by its summary
    (copy / PULLED).write_text(json.dumps({"orders": outputs, "bytes_pulled": 0}))
    sketched = convert_raw_dump(copy, tmp_path / "low_sketch.h5")
    answers = []
    for run in (full, sketched):
        analysis = analyze_paths([golden, run], ref=golden)
        answers.append((analysis.summary["verdict"].tolist(),
                        sorted((str(f.kind), f.layer) for f in analysis.findings
                               if str(f.kind) in ("first_divergence", "failure_source"))))
        estimated = int(analysis.comparison.table["estimated"].eq(True).sum())
        analysis.close()
    assert answers[0] == answers[1] and answers[0][1], answers
    assert estimated >= 5  # the nodes over 4,096 elements (smaller ones are their own sample: exact)
