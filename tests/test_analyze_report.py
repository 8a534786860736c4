"""The HTML report: readable with a sweep of 20 inputs x 2 configurations, and rendered by Chromium."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.report.outdir import prepare_out_dir
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
    assert len(data["rows"]) == len(doc_layers(sweep_report)) and html.count('"type":"scatter"') == INPUTS
    assert "per input" in html and (sweep_report / "per_input.png").exists()
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "<script></script>", html, flags=re.S)  # inlined code aside
    assert not re.search(r"(src|href)=['\"]?https?:", markup) and "<script></script>" in markup  # self-contained
    doc = json.loads((sweep_report / "results.json").read_text())
    assert len(doc["reference"]["per_input"]) == INPUTS


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
def test_chromium_renders_the_page(sweep_report, tmp_path):
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2000", "--hide-scrollbars"]
    page = (sweep_report / "index.html").as_uri()
    dom = subprocess.run([*cmd, "--dump-dom", page], capture_output=True, text=True, timeout=120)
    assert "layerdiff report" in dom.stdout and "Failure source in vulkan/low" in dom.stdout
    subprocess.run([*cmd, f"--screenshot={shot}", page], capture_output=True, timeout=120)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
