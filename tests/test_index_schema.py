"""One index.csv schema (analyzer/formats/index.py): a sweep and `analyze merge` write the same file,
so runs merge into a sweep's directory, the sweep resumes over them, and `analyze` reads them all."""
from __future__ import annotations

import csv
import json

from layerdiff.analyzer.formats.index import ALL_COLUMNS, MERGE_COLUMNS, SWEEP_COLUMNS
from tests.faults.support import REPO, cli

MODEL = REPO / "samples" / "models" / "convnet.mnn"


def _index(directory):
    with open(directory / "index.csv", newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        return reader.fieldnames, list(reader)


def test_merge_into_a_sweep_directory_then_resume_and_analyze(tmp_path):
    sweep, extra = tmp_path / "sweep", tmp_path / "extra"
    collect = ("collect", "--model", str(MODEL), "-i", "random:3", "--backend", "cpu", "--no-report")
    first = cli(*collect, "--precision", "high,low", "-o", str(sweep))
    assert first.returncode == 0, first.stderr[-2000:]
    header, rows = _index(sweep)
    assert header == SWEEP_COLUMNS and [r["status"] for r in rows] == ["done", "done"]
    made = cli(*collect, "--precision", "normal", "-o", str(extra))
    assert made.returncode == 0, made.stderr[-2000:]
    normal = next(extra.glob("*.h5"))

    merged = cli("analyze", "merge", str(normal), str(sweep / rows[0]["files"]), "-o", str(sweep))
    assert merged.returncode == 0, merged.stderr[-2000:]  # was: "not a layerdiff index"
    header, after = _index(sweep)
    assert header == ALL_COLUMNS
    assert after[:2] == [{**row, **{c: "" for c in ALL_COLUMNS if c not in SWEEP_COLUMNS}} for row in rows]
    assert len(after) == 3 and after[2]["precision_requested"] == "normal" and after[2]["status"] == ""
    assert (sweep / after[2]["file"]).is_file()  # the sweep's own high run was a duplicate: not copied again

    again = cli(*collect, "--precision", "high,low", "-o", str(sweep))
    assert again.returncode == 0 and "already collected" in again.stderr, again.stderr[-2000:]
    header, resumed = _index(sweep)
    assert header == ALL_COLUMNS and resumed[2] == after[2]  # the resumed sweep keeps the merged row as it was
    assert [r["reason"] for r in resumed[:2]] == ["already collected"] * 2

    report = cli("analyze", str(sweep), "-o", str(tmp_path / "report"), "--json")
    assert report.returncode == 0, report.stderr[-2000:]
    assert len(json.loads(report.stdout)["runs"]) == 3


def test_merge_only_index_keeps_its_columns(tmp_path):
    out = tmp_path / "one"
    made = cli("collect", "--model", str(MODEL), "-i", "random:3", "--no-report", "-o", str(out))
    assert made.returncode == 0, made.stderr[-2000:]
    merged = cli("analyze", "merge", str(next(out.glob("*.h5"))), "-o", str(tmp_path / "set"))
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert _index(tmp_path / "set")[0] == MERGE_COLUMNS


def test_a_foreign_csv_is_still_refused(tmp_path):
    (tmp_path / "index.csv").write_text("a,b\n1,2\n")
    (tmp_path / "run.npz").write_bytes(b"")
    proc = cli("analyze", "merge", str(REPO / "samples" / "dumps" / "ncnn_cpu_high_overflow.h5"), "-o", str(tmp_path))
    assert proc.returncode == 1 and "not a layerdiff index" in proc.stderr
