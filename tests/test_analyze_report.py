"""The HTML report: readable with a sweep of 20 inputs x 2 configurations, and rendered by Chromium."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.report.outdir import prepare_out_dir
from layerdiff.analyzer.report import charts
from layerdiff.analyzer.report.page import write_report
from tests.analyze_dumps import DOWNSTREAM, perturbed, reference_arrays, write_dump

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
INPUTS = 20
FAILING = {"in03", "in11", "in17"}


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    """20 inputs x (cpu/high, vulkan/low); three inputs break vulkan at `pool`."""
    root = tmp_path_factory.mktemp("sweep")
    runs = root / "runs"
    runs.mkdir()
    for i in range(INPUTS):
        name = f"in{i:02d}"
        ref = reference_arrays(seed=100 + i)
        attrs = {"input_label": name, "input_sha256": f"{i:064x}"}
        write_dump(runs / f"cpu_{name}.h5", ref, **attrs)
        run = perturbed(ref, 1e-4, seed=i)
        if name in FAILING:
            for op in DOWNSTREAM["pool"]:
                run[op] = perturbed(run, 0.5, seed=7, ops=[op])[op]
        run = {op: a.astype(np.float16).astype(np.float32) for op, a in run.items()}  # fp16 bytes, as labelled
        write_dump(runs / f"vk_{name}.h5", run, backend="vulkan", precision="low", **attrs)
    out = prepare_out_dir(root / "report")
    analysis = analyze_paths([runs])
    try:
        write_report(analysis, out)
    finally:
        analysis.close()
    return out


def test_sweep_report_is_summarized_and_folded(sweep_report):
    html = (sweep_report / "index.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "Verdict: FAIL" in html
    assert "20 run(s) compared: 3 fail, 17 pass" in html
    dependence = re.search(r"Input dependence on [^<]*", html).group(0)
    assert "3 of 20 inputs fail" in dependence and all(name in dependence for name in FAILING)
    # summaries first: findings and the matrix come before any folded detail
    assert html.index("<h2>Findings</h2>") < html.index("<h2>Runs</h2>") < html.index("<details>")
    assert "id='layer-table'" in html and 'id="error-chart"' in html  # interactive table and chart
    data = json.loads(re.search(r"id='layer-data'>(.*?)</script>", html, re.S).group(1))
    lines = [t for t in chart_traces(html, "error-chart") if t["mode"] == "lines"]
    assert len(data["rows"]) == len(doc_layers(sweep_report)) and len(lines) == INPUTS
    assert {t["line"]["color"] for t in lines} == {charts.PALETTE[0]}  # one configuration, one colour
    assert [t["name"] for t in lines if t.get("showlegend", True)] == ["host ncnn vulkan/low"]  # one entry, not 20
    bars = chart_traces(html, "input-chart")
    assert [b["name"] for b in bars] == ["host ncnn vulkan/low"] and sorted(bars[0]["text"]).count("fail") == 3
    assert 'id="error-heatmap"' in html and not list(sweep_report.glob("*.png"))  # 20 runs: the heatmap adds something
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "<script></script>", html, flags=re.S)  # inlined code aside
    assert not re.search(r"(src|href)=['\"]?https?:", markup) and "<script></script>" in markup  # self-contained
    doc = json.loads((sweep_report / "results.json").read_text())
    assert len(doc["reference"]["per_input"]) == INPUTS


def chart_traces(html: str, chart_id: str) -> list[dict]:
    """The traces a chart of the page draws (the JSON handed to Plotly.newPlot)."""
    start = html.index(f'Plotly.newPlot("{chart_id}", ') + len(f'Plotly.newPlot("{chart_id}", ')
    return json.JSONDecoder().raw_decode(html, start)[0]


def doc_layers(report: Path) -> list[dict]:
    doc = json.loads((report / "results.json").read_text())
    return [layer for run in doc["runs"] for layer in run["layers"]]


def _chromium(tmp_path: Path) -> list[str]:
    return [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2000", "--hide-scrollbars",
            "--virtual-time-budget=10000"]


def _status_cells(dom: str) -> list[str]:
    """The status of every row the layer table drew (its status cells carry class s-<status>)."""
    start = dom.index('id="layer-table"')
    return re.findall(r'<td class="[^"]*\bs-(\w+)', dom[start:dom.index("</table>", start)])


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")
def test_chromium_runs_the_interactive_table_and_chart(sweep_report, tmp_path):
    """DataTables (from the itables wheel) and plotly.js run offline from the page: rows render
    from the inlined data, a filter from the address applies, and the error chart draws."""
    page = (sweep_report / "index.html").as_uri()
    dom = subprocess.run([*_chromium(tmp_path), "--dump-dom", page], capture_output=True, text=True, timeout=180).stdout
    total = len(doc_layers(sweep_report))
    assert len(_status_cells(dom)) >= 10 and f"of {total} entries" in dom
    assert "js-plotly-plot" in dom and "main-svg" in dom and dom.count('class="trace scatter') >= INPUTS
    fails = subprocess.run([*_chromium(tmp_path), "--dump-dom", page + "#status=fail&run=vulkan/low in03"],
                           capture_output=True, text=True, timeout=180).stdout
    shown = _status_cells(fails)
    expected = [r for r in doc_layers(sweep_report) if r["status"] == "fail"]
    assert 0 < len(shown) < len(expected) and set(shown) == {"fail"}
    assert f"(filtered from {total} total entries)" in fails


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed")
def test_chromium_shows_the_page_at_a_glance(sweep_report, tmp_path):
    """The page as a reader meets it, in headless Chromium: no script error, every chart drawn, run
    labels whole on the heatmap's axis, legends below the plots (never over a marker), the layer
    table numbering layers as the findings do (#N), zeros printed as 0; and a screenshot
    (LAYERDIFF_SCREENSHOT=path keeps it, to look at)."""
    html = (sweep_report / "index.html").read_text()
    sentence = re.search(r"First divergence in (vulkan/low in03): layer (\S+) \((\w+)\), #(\d+) in execution order", html)
    run, key, number = sentence.group(1), sentence.group(2), sentence.group(4)
    page = (sweep_report / "index.html").as_uri()
    proc = subprocess.run([*_chromium(tmp_path), "--enable-logging=stderr", "--v=0", "--dump-dom",
                           f"{page}#search={key}&run={run}"], capture_output=True, text=True, timeout=180)
    dom = proc.stdout
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line and "WebGL" not in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console
    charts_on_page = re.findall(r'Plotly\.newPlot\("([\w-]+)"', html)
    assert set(charts_on_page) == {"error-chart", "error-heatmap", "range-chart", "input-chart", "focus-chart"}
    assert dom.count("plotly-graph-div js-plotly-plot") == len(charts_on_page) and "main-svg" in dom  # each drew
    heatmap = dom[dom.index('id="error-heatmap"'):dom.index('id="range-chart"')]
    compared = {f"vulkan/low in{i:02d}" for i in range(INPUTS)}
    assert compared <= set(re.findall(r'class="ytick"><text[^>]*>([^<]*)</text>', heatmap))  # whole labels
    for chart_id in charts_on_page:
        start = html.index(f'Plotly.newPlot("{chart_id}", ') + len(f'Plotly.newPlot("{chart_id}", ')
        layout = json.JSONDecoder().raw_decode(html, json.JSONDecoder().raw_decode(html, start)[1] + 2)[0]
        assert not layout.get("showlegend") or layout["legend"]["y"] < 0, chart_id  # below the plot area
    start = dom.index('id="layer-table"')
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in
            re.findall(r"<tr[^>]*>(.*?)</tr>", dom[start:dom.index("</table>", start)], re.S)]
    hit = [cells for cells in rows if cells[:3] == [run, number, key]]
    assert hit, rows[:3]  # the table's # is the findings' #N
    assert "0" in hit[0][4:] and "" not in hit[0][4:16]  # a zero reads 0, measured cells are never blank
    shot = Path(os.environ.get("LAYERDIFF_SCREENSHOT") or tmp_path / "shot.png")
    subprocess.run([*_chromium(tmp_path), "--window-size=1280,4200", f"--screenshot={shot}", page],
                   capture_output=True, timeout=180)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
