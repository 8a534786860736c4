"""The analyzer on dumps from the real engines: sessions collected here, and the committed samples."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.cli.app import main

SAMPLE_DUMPS = Path(__file__).resolve().parent.parent / "samples" / "dumps"


def test_real_ncnn_runs_align_completely_and_get_a_verdict(local_runs):
    ref = local_runs("convnet.param", "cpu", "high")
    low = local_runs("convnet.param", "cpu", "low")
    analysis = analyze_paths([ref, low])
    try:
        assert analysis.comparison.plan.reference.path == ref
        alignment = analysis.comparison.alignments[0]
        assert alignment.only_base.empty and alignment.only_other.empty
        rows = analysis.comparison.table
        assert len(rows) == len(analysis.runs[0].layers)
        assert set(rows["status"]) <= {"pass", "warn", "fail"}
        assert rows["rel_l2"].max() > 0  # low precision really differs
        output = rows[rows["is_output"]]
        assert len(output) and output["top1"].notna().all()
    finally:
        analysis.close()


@pytest.mark.skipif(not SAMPLE_DUMPS.is_dir() or not any(SAMPLE_DUMPS.glob("*.h5")),
                    reason="samples/dumps not generated yet")
def test_committed_sample_dumps_analyze(tmp_path, capsys):
    code = main([str(SAMPLE_DUMPS), "-o", str(tmp_path / "report"), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 2), err
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and len(doc["runs"]) >= 2
    assert (tmp_path / "report" / "index.html").exists()
