"""The analysis of a run known partly by its tensor summaries (a sketch-first collection): estimated rows,
the same verdict and findings as from the whole dump, and the layers the judge asks to see exactly.

Real dumps of a real network (tests/sketch_support.py: PP-OCRv4 det, pip ncnn fp32 against bf16).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.findings.exactneeds import exact_needs
from layerdiff.analyzer.findings.finding import FindingKind
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.formats.rawdump import PULLED, convert_raw_dump, read_raw_dump
from tests.sketch_support import det_model, dumps, gpu_dump, ort_golden  # noqa: F401 (fixtures; they run host_harness)

HEADLINE = (FindingKind.FIRST_DIVERGENCE, FindingKind.FAILURE_SOURCE)


def sketched_copy(raw, out, keep_bytes: int = 16384):
    """The raw dump as a sketch-first pull leaves it: tensors of at most `keep_bytes` pulled, the rest summarised."""
    shutil.copytree(raw, out)
    dump = read_raw_dump(out)
    pulled = [t.order for t in dump.tensors if t.nbytes <= keep_bytes]
    (out / PULLED).write_text(json.dumps({"orders": pulled, "bytes_pulled": sum(
        t.nbytes for t in dump.tensors if t.order in pulled)}))
    return out


@pytest.fixture(scope="module")
def runs(dumps, tmp_path_factory):
    work = tmp_path_factory.mktemp("sketch-analysis")
    paths = {"high": convert_raw_dump(dumps["high"], work / "high.h5"),
             "low": convert_raw_dump(dumps["low"], work / "low.h5"),
             "low_sketch": convert_raw_dump(sketched_copy(dumps["low"], work / "low_raw"), work / "low_sketch.h5"),
             "high_sketch": convert_raw_dump(sketched_copy(dumps["high"], work / "high_raw"), work / "high_sketch.h5")}
    return paths


def analysed(ref, run):
    analysis = analyze_paths([ref, run], ref=ref)
    table = analysis.comparison.table.copy()
    headline = {(f.kind, f.layer) for f in analysis.findings if f.kind in HEADLINE}
    verdict = analysis.summary.set_index("run")["verdict"].to_dict()
    analysis.close()
    return table, headline, verdict


def test_sketched_hdf5_keeps_every_layer_row_and_marks_the_estimated(runs):
    with DumpFile(runs["low"]) as full, DumpFile(runs["low_sketch"]) as sketched:
        assert len(sketched.layers) == len(full.layers)
        estimated = sketched.estimated_orders
        assert 50 < len(estimated) < len(full.layers)
        assert sketched.attrs["sketch_first"] and sketched.attrs["bytes_pulled"] < sketched.attrs["dump_bytes"] / 5
        merged = full.layers.merge(sketched.layers, on="order", suffixes=("", "_s"))
        for column in ("numel", "n_zero", "n_nan", "min", "max"):
            assert (merged[column] == merged[f"{column}_s"]).all(), column
        assert np.allclose(merged["std"], merged["std_s"], rtol=1e-5)


@pytest.mark.parametrize("ref, run", [("high", "low_sketch"), ("high_sketch", "low_sketch"), ("high_sketch", "low")])
def test_sketched_run_gives_the_full_analysis_verdict_and_findings(runs, ref, run):
    """A golden held whole or sketched itself, against a sketched run or a whole one: the same verdict,
    first divergence and failure sources as the analysis of both whole dumps."""
    full_table, full_headline, full_verdict = analysed(runs["high"], runs["low"])
    table, headline, verdict = analysed(runs[ref], runs[run])
    assert headline == full_headline and full_headline
    assert list(verdict.values()) == list(full_verdict.values())
    assert table["estimated"].eq(True).sum() > 50
    est = table[table["estimated"].eq(True)]
    assert (est["rel_l2_sigma"] > 0).any() and est["rel_l2"].notna().all()


def test_statuses_differ_only_where_the_judge_asks_for_the_tensor(runs):
    """Every layer whose estimated status differs from its exact status is among the layers the judge names
    for an exact pull (a borderline estimate, or a layer a headline finding names)."""
    full = analyze_paths([runs["high"], runs["low"]], ref=runs["high"])
    sketch = analyze_paths([runs["high"], runs["low_sketch"]], ref=runs["high"])
    try:
        needs = exact_needs(sketch.comparison.table, sketch.findings, sketch.thresholds,
                            {run.label: sketch.comparison.graph(run) for run in sketch.runs})
        exact = full.comparison.table.set_index("key")["status"]
        estimated = sketch.comparison.table.set_index("key")
        differ = [k for k in estimated.index if estimated.loc[k, "status"] != exact[k]]
        run_label = sketch.comparison.table["run"].iloc[0]
        assert set(differ) <= needs.keys.get(run_label, set())
        named = [k for (run, k), why in needs.why.items() if run == run_label and "finding" in why]
        assert named  # the headline layers are asked for whenever they were estimated
        assert len(needs.keys[run_label]) < len(estimated)
    finally:
        full.close()
        sketch.close()


def test_no_needs_for_a_run_measured_whole(runs):
    analysis = analyze_paths([runs["high"], runs["low"]], ref=runs["high"])
    try:
        assert not exact_needs(analysis.comparison.table, analysis.findings, analysis.thresholds)
    finally:
        analysis.close()


def test_a_summary_is_not_compared_across_axis_orders():
    """An NHWC run against an NCHW reference needs a transpose, which a sketch cannot undergo: the row says
    `not_pulled` instead of guessing."""
    from layerdiff.analyzer.measure.compare import _estimate

    row: dict = {}
    match = {"base_layout": "NCHW", "base_shape": [1, 2, 3, 4], "other_layout": "NHWC", "other_shape": [1, 3, 4, 2],
             "key": "x:0", "other_order": 0}
    _estimate(row, None, 0, None, None, match, None, None, [])
    assert row["status"] == "not_pulled"


def test_sketched_gpu_run_gives_the_full_analysis_verdict_and_findings(runs, gpu_dump, tmp_path):
    """A GPU run (ncnn Vulkan fp16 on lavapipe) sketched against the fp32 CPU golden: the same answers as whole."""
    full = convert_raw_dump(gpu_dump, tmp_path / "gpu.h5")
    sketched = convert_raw_dump(sketched_copy(gpu_dump, tmp_path / "gpu_raw"), tmp_path / "gpu_sketch.h5")
    _, full_headline, full_verdict = analysed(runs["high"], full)
    table, headline, verdict = analysed(runs["high"], sketched)
    assert headline == full_headline and list(verdict.values()) == list(full_verdict.values())
    assert table["estimated"].eq(True).sum() > 50


@pytest.mark.parametrize("text", ["{not json", '{"orders": "0,1"}', '{"orders": [0], "bytes_pulled": true}', "[1, 2]"])
def test_a_damaged_pulled_record_is_one_line_naming_it(dumps, tmp_path, text):
    from layerdiff.errors import DumpFormatError

    raw = sketched_copy(dumps["low"], tmp_path / "raw")
    (raw / PULLED).write_text(text)
    with pytest.raises(DumpFormatError, match="pulled.json"):
        convert_raw_dump(raw, tmp_path / "out.h5")
    assert not (tmp_path / "out.h5").exists()


def test_alignment_by_structure_works_on_a_sketched_run(runs, ort_golden, tmp_path):
    """An ONNX Runtime golden (ONNX names) against the ncnn run (pnnx's names): layers are matched by structure,
    the same pairs whether the ncnn run is whole or sketched, with the same answers."""
    golden = convert_raw_dump(ort_golden, tmp_path / "ort.h5")
    results = []
    for run in (runs["low"], runs["low_sketch"]):
        analysis = analyze_paths([golden, run], ref=golden)
        alignment = analysis.comparison.alignments[0]
        matched = sorted(zip(alignment.matched["key"], alignment.matched["other_key"]))
        headline = {(f.kind, f.layer) for f in analysis.findings if f.kind in HEADLINE}
        results.append((matched, headline, analysis.summary["verdict"].tolist()))
        analysis.close()
    assert len(results[0][0]) > 50 and any(a != b for a, b in results[0][0])  # names differ: matched by structure
    assert results[0] == results[1]
