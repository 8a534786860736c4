"""The report of a sketch-first run says what it is: the bytes each run pulled of its dump, and every figure
measured from a summary shown as an estimate with its uncertainty, never as an exact number.

A real sketched run (tests/sketch_support.py: PP-OCRv4 det, pip ncnn bf16 against fp32; the big tensors left
out as a sketch-first pull leaves them) analysed against the whole fp32 run, its report written and read back.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import h5py
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.rawdump import convert_raw_dump
from layerdiff.analyzer.report.page import write_report
from tests.sketch_support import det_model, dumps  # noqa: F401 (fixtures; they run host_harness)
from tests.test_analyze_report import CHROMIUM, _chromium
from tests.test_sketch_analysis import sketched_copy

ESTIMATE = re.compile(r"^(-?[0-9.e+-]+) ± ([0-9.e+-]+) \(estimated\)$")


@pytest.fixture(scope="module")
def report(dumps, tmp_path_factory):
    work = tmp_path_factory.mktemp("sketch-report")
    golden = convert_raw_dump(dumps["high"], work / "high.h5")
    sketched = convert_raw_dump(sketched_copy(dumps["low"], work / "low_raw"), work / "low.h5")
    analysis = analyze_paths([golden, sketched], ref=golden)
    try:
        table = analysis.comparison.table.copy()
        (work / "report").mkdir()
        write_report(analysis, work / "report")
    finally:
        analysis.close()
    with h5py.File(sketched) as file:
        pulled, whole = int(file.attrs["bytes_pulled"]), int(file.attrs["dump_bytes"])
    return work / "report", table, pulled, whole


def layer_data(page: str) -> dict:
    start = page.index("<script type='application/json' id='layer-data'>")
    body = page[page.index(">", start) + 1:page.index("</script>", start)]
    return json.loads(body)


def test_estimated_rows_show_their_figure_with_its_sigma_and_say_estimated(report):
    out, table, _pulled, _whole = report
    data = layer_data((out / "index.html").read_text())
    columns = data["columns"]
    rows = [dict(zip(columns, row)) for row in data["rows"]]
    assert "estimated" in columns
    by_key = table.set_index("key")
    estimated = [row for row in rows if row["estimated"] is True]
    exact = [row for row in rows if row["estimated"] is not True]
    assert len(estimated) > 50 and exact
    for row in estimated:  # never a bare number: figure ± sigma (estimated), from the table's own columns
        truth = by_key.loc[row["key"]]
        found = ESTIMATE.match(row["rel_l2"])
        assert found, row["rel_l2"]
        assert float(found.group(1)) == pytest.approx(float(truth["rel_l2"]), rel=1e-3)
        assert float(found.group(2)) == pytest.approx(float(truth["rel_l2_sigma"]), rel=1e-3)
        assert ESTIMATE.match(row["cosine"]) or row["cosine"] == ""
        assert isinstance(row["max_abs"], str) and row["max_abs"].startswith("≥ ") and row["max_abs"].endswith("(estimated)")
    for row in exact:  # rows measured from both tensors keep their numbers
        assert row["rel_l2"] is None or isinstance(row["rel_l2"], (int, float))


def test_the_markdown_layer_table_marks_the_estimates_too(report):
    out, table, _pulled, _whole = report
    text = (out / "summary.md").read_text()
    assert text.count("(estimated)") >= int(table["estimated"].eq(True).sum())


def test_the_runs_section_states_the_bytes_pulled_of_the_dump(report):
    out, table, pulled, whole = report
    page = (out / "index.html").read_text()
    n_estimated = int(table["estimated"].eq(True).sum())
    assert (f"pulled sketch-first, {pulled / 1e6:.1f} of {whole / 1e6:.1f} MB ({pulled / whole:.1%}) of its dump; "
            f"{n_estimated} layers estimated from summaries") in page


def test_results_json_keeps_the_numbers_their_sigmas_and_the_bytes(report):
    out, table, pulled, whole = report
    document = json.loads((out / "results.json").read_text())
    run = next(r for r in document["runs"] if r["role"] == "compared")
    assert run["summary"]["bytes_pulled"] == pulled and run["summary"]["dump_bytes"] == whole
    assert run["summary"]["n_estimated"] == int(table["estimated"].eq(True).sum())
    worst = table["rel_l2"].idxmax()
    assert run["summary"]["worst_estimated"] == bool(table["estimated"].eq(True)[worst])
    if run["summary"]["worst_estimated"]:  # the page's runs table shows it as the estimate it is
        assert run["summary"]["worst_rel_l2_sigma"] > 0
        shown = f"{run['summary']['worst_rel_l2']:.4g} ± {run['summary']['worst_rel_l2_sigma']:.4g} (estimated)"
        assert shown in (out / "index.html").read_text()
    layers = [layer for layer in run["layers"] if layer.get("estimated")]
    assert len(layers) == run["summary"]["n_estimated"]
    assert all(isinstance(layer["rel_l2"], float) and layer["rel_l2_sigma"] >= 0 for layer in layers)
    assert sum(layer["rel_l2_sigma"] > 0 for layer in layers) > len(layers) // 2


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")
def test_chromium_draws_the_estimated_cells_apart(report, tmp_path):
    """In the browser the estimated cells of the layer table carry their own class (drawn in italics) and read
    as estimates, `figure ± sigma (estimated)`."""
    out, table, _pulled, _whole = report
    dom = subprocess.run([*_chromium(tmp_path), "--dump-dom", (out / "index.html").as_uri()], capture_output=True,
                         text=True, timeout=180).stdout
    start = dom.index('id="layer-table"')
    body = dom[start:dom.index("</table>", start)]
    cells = re.findall(r'<td class="[^"]*\bestimate\b[^"]*">([^<]*)</td>', body)
    assert cells and all(c.endswith("(estimated)") for c in cells)
    assert any(ESTIMATE.match(c) for c in cells)
