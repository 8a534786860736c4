"""The notebook API (layerdiff/__init__.py, layerdiff/api.py): cheap to import, the same analysis and
report as the `analyze` command, and `layerdiff.collect` as the `collect` command's library half."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

import layerdiff
from layerdiff.errors import NothingToCompareError
from tests.faults.support import REPO, cli

DUMPS = REPO / "samples" / "dumps"
MODEL = REPO / "samples" / "models" / "convnet.mnn"


def test_import_layerdiff_loads_nothing_heavy():
    code = "import sys, layerdiff; print(','.join(m for m in ('numpy', 'pandas', 'h5py', 'typer') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == ""


def test_tab_completion_lists_the_api_before_first_use():
    proc = subprocess.run([sys.executable, "-c", "import layerdiff; print(' '.join(dir(layerdiff)))"],
                          capture_output=True, text=True, timeout=60)
    assert {"analyze", "collect", "Results", "Collected"} <= set(proc.stdout.split()), proc.stdout


def test_analyze_sample_dumps_as_dataframes_and_the_commands_report(tmp_path):
    command = cli("analyze", str(DUMPS), "-o", str(tmp_path / "cli"))
    assert command.returncode == 0, command.stderr[-2000:]
    with open(tmp_path / "cli" / "runs.csv", newline="") as fh:
        verdicts = {row["run"]: row["verdict"] for row in csv.DictReader(fh)}

    with layerdiff.analyze(DUMPS) as result:
        runs = result.runs
        assert len(runs) == 4 and set(runs["engine"]) == {"ncnn"}
        assert dict(zip(runs["run"], runs["verdict"])) == verdicts  # the same verdicts as the command
        assert {"rel_l2", "max_abs", "status", "key", "run"} <= set(result.layers.columns)
        assert len(result.layers) > 0 and result.layers["rel_l2"].notna().any()
        findings = result.findings
        assert len(findings) > 0 and {"nan_origin", "first_divergence"} <= set(findings["kind"])
        assert set(findings["severity"]) <= {"fail", "warn", "info"}
        page = result.write_report(tmp_path / "api")
    assert page.is_file()
    ours = json.loads((tmp_path / "api" / "results.json").read_text())
    theirs = json.loads((tmp_path / "cli" / "results.json").read_text())
    assert [r["verdict"] for r in ours["runs"]] == [r["verdict"] for r in theirs["runs"]]
    assert [f["sentence"] for f in ours["findings"]] == [f["sentence"] for f in theirs["findings"]]


def test_analyze_refuses_nothing_to_compare_with_its_class():
    with pytest.raises(NothingToCompareError):
        layerdiff.analyze(DUMPS / "ncnn_cpu_high_overflow.h5")


def test_collect_then_analyze_a_real_sweep(tmp_path):
    done = layerdiff.collect(MODEL, precisions=["high", "low"], inputs=["random:1"], out=tmp_path / "runs")
    assert done.exit_code == 0 and len(done.paths) == 2 and all(p.is_file() for p in done.paths)
    with open(tmp_path / "runs" / "index.csv", newline="") as fh:
        assert [row["status"] for row in csv.DictReader(fh)] == ["done", "done"]
    again = layerdiff.collect(MODEL, precisions=["high", "low"], inputs=["random:1"], out=tmp_path / "runs")
    assert again.paths == done.paths and {r.row.reason for r in again.sweep.runs} == {"already collected"}
    with layerdiff.analyze(done.out_dir) as result:
        assert sorted(result.runs["precision_requested"]) == ["high", "low"]
        assert set(result.runs["engine"]) == {"mnn"} and result.runs["verdict"].notna().all()


def test_the_readme_example_runs(tmp_path):
    text = (REPO / "README.md").read_text()
    start = text.index("### In a notebook (Python API)")
    code = text[text.index("```python\n", start) + len("```python\n"):text.index("```", text.index("```python\n", start) + 9)]
    assert len(code.strip().splitlines()) <= 10
    (tmp_path / "samples").symlink_to(REPO / "samples")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verdict" in proc.stdout and (tmp_path / "report" / "index.html").is_file()
