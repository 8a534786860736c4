"""`analyze` end to end: report files, --json, inspect, and one clear line for each kind of bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from layerdiff.analyzer.cli.app import main
from tests.analyze_dumps import DOWNSTREAM, LAYERS, perturbed, reference_arrays, write_dump

REPO = Path(__file__).resolve().parent.parent
REPORT_FILES = ("index.html", "summary.csv", "summary.md", "results.json")


@pytest.fixture
def dumps(tmp_path):
    ref = reference_arrays()
    run = perturbed(ref, 1e-4)
    for op in DOWNSTREAM["block/conv 2"]:
        run[op] = perturbed(run, 0.5, seed=3, ops=[op])[op]
    folder = tmp_path / "runs"
    folder.mkdir()
    return (write_dump(folder / "cpu_high.h5", ref),
            write_dump(folder / "vulkan_low.h5", run, backend="vulkan", precision="low"))


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("png", [False, True])
def test_subprocess_end_to_end_writes_every_report_file(tmp_path, dumps, png):
    """The page's charts always; static PNGs (matplotlib) only with --png. The verdict is printed
    before the page is written (the "Report:" line comes last)."""
    report = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(dumps[0].parent), "-o", str(report),
                           *(["--png"] if png else [])], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "block/conv 2:0" in proc.stdout and "Failure source" in proc.stdout
    assert proc.stdout.index("Failure source") < proc.stdout.index("Report: ")
    for name in REPORT_FILES:
        assert (report / name).stat().st_size > 0, name
    csv = (report / "summary.csv").read_text()
    assert "block/conv 2:0" in csv and "rel_l2" in csv
    assert "| vulkan/low | compared | fail |" in (report / "summary.md").read_text()
    html = (report / "index.html").read_text()
    assert "Verdict: FAIL" in html and "<details>" in html
    assert all(f'id="{chart}"' in html for chart in ("error-chart", "range-chart", "focus-chart"))
    pngs = sorted(p.name for p in report.glob("*.png"))
    if png:
        assert "error_by_layer.png" in pngs and (report / "error_by_layer.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<img alt='error_by_layer'" in html
    else:
        assert pngs == [] and "<img alt=" not in html


def test_json_output_schema(tmp_path, dumps, capsys):
    code, out, err = run_cli(capsys, dumps[0], dumps[1], "-o", tmp_path / "rep", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "layerdiff-results" and doc["schema_version"] == 1
    assert doc["reference"]["run"] == "cpu/high"
    run = next(r for r in doc["runs"] if r["run"] == "vulkan/low")
    assert run["first_divergence"]["layer"] == "block/conv 2:0"
    assert run["provenance"]["backend_requested"] == "vulkan"
    assert {f["kind"] for f in run["findings"]} >= {"first_divergence", "failure_source"}
    layer = next(l for l in run["layers"] if l["key"] == "conv1:0")
    assert layer["status"] == "pass" and isinstance(layer["rel_l2"], float)
    assert json.loads((tmp_path / "rep" / "results.json").read_text())["runs"][1]["run"] == run["run"]


def test_tolerance_and_rename_options(tmp_path, dumps, capsys):
    code, out, err = run_cli(capsys, dumps[0], dumps[1], "-o", tmp_path / "rep", "--json", "--fail-rel-l2", "10",
                             "--warn-rel-l2", "10", "--min-pass-fraction", "0", "--rename", "^block/=")
    assert code == 0, err
    run = json.loads(out)["runs"][1]
    assert run["verdict"] == "pass"


def test_inspect_answers_from_the_table(tmp_path, dumps, capsys):
    code, out, err = run_cli(capsys, "inspect", dumps[1])
    assert code == 0, err
    assert "backend_requested: vulkan" in out and "block/conv 2:0" in out
    code, out, err = run_cli(capsys, "inspect", dumps[1], "--layer", "add:1", "--json")
    doc = json.loads(out)
    assert doc["key"] == "add:1:0" and doc["fed_by"] == ["relu1:0", "block/conv 2:0"] and doc["feeds"] == ["pool:0"]
    code, out, err = run_cli(capsys, "inspect", dumps[1], "--layer", "nope")
    assert code == 1 and err.count("\n") == 1 and "no layer 'nope'" in err


def one_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert "Traceback" not in err
    return "\n".join(lines)


def test_not_a_dump_and_newer_version_are_skipped_with_one_line_each(tmp_path, dumps, capsys):
    junk = dumps[0].parent / "junk.h5"
    junk.write_text("hello")
    with h5py.File(dumps[0].parent / "plain.h5", "w") as f:
        f["x"] = np.zeros(3)
    newer = dumps[0].parent / "newer.h5"
    write_dump(newer, reference_arrays(), backend="opencl", precision="low")
    with h5py.File(newer, "r+") as f:
        f.attrs["format_version"] = 99
    code, out, err = run_cli(capsys, dumps[0].parent, "-o", tmp_path / "rep")
    lines = one_line(err).splitlines()
    assert code == 2 and len(lines) == 3
    assert any("junk.h5" in l and "not a readable HDF5" in l for l in lines)
    assert any("plain.h5" in l and "not a layerdiff dump" in l for l in lines)
    assert any("newer.h5" in l and "version 99" in l for l in lines)
    assert (tmp_path / "rep" / "index.html").exists()  # the usable runs were still compared


def test_missing_reference_and_too_few_dumps(tmp_path, dumps, capsys):
    code, out, err = run_cli(capsys, dumps[0], dumps[1], "-o", tmp_path / "rep", "--ref", tmp_path / "other.h5")
    assert code == 1 and "--ref" in one_line(err) and err.count("\n") == 1
    code, out, err = run_cli(capsys, dumps[0], "-o", tmp_path / "rep2")
    assert code == 1 and "at least two runs" in one_line(err)
    code, out, err = run_cli(capsys, tmp_path / "nowhere", "-o", tmp_path / "rep3")
    assert code == 1 and "no such file" in one_line(err)
    (tmp_path / "afile").write_text("x")
    code, out, err = run_cli(capsys, dumps[0], dumps[1], "-o", tmp_path / "afile")
    assert code == 1 and "not a directory" in one_line(err)


def test_zero_common_layers(tmp_path, dumps, capsys):
    """Another model: other names, other shapes, other values: neither names nor structure match."""
    other = [(f"other_{op}", t, [f"other_{i}" for i in ins], (1, 5) + tuple(d + 1 for d in s[2:]))
             for op, t, ins, s in LAYERS]
    rng = np.random.default_rng(7)
    alien = write_dump(tmp_path / "alien.h5", {op: rng.random(s).astype(np.float32) * 5 - 2 for op, _t, _i, s in other},
                       layers=other, backend="opencl", precision="low")
    code, out, err = run_cli(capsys, dumps[0], dumps[1], alien, "-o", tmp_path / "rep")
    assert code == 2 and "no layer in common" in one_line(err) and "alien.h5" in err
    assert (tmp_path / "rep" / "index.html").exists()
    runs = pd.read_csv(tmp_path / "rep" / "runs.csv").set_index("file")
    assert runs.loc["alien.h5", "verdict"] == "not compared"
    assert "no layer in common" in runs.loc["alien.h5", "verdict_reason"]


def test_renamed_run_with_wrong_values_is_matched_by_structure_and_fails(tmp_path, dumps, capsys):
    """The same graph under other names (a converter's renames) computing garbage: structure alone
    pairs every layer, and the run fails there instead of silently sharing no layer."""
    other = [(f"other_{op}", t, [f"other_{i}" for i in ins], s) for op, t, ins, s in LAYERS]
    rng = np.random.default_rng(7)
    renamed = write_dump(tmp_path / "renamed.h5", {f"other_{k}": rng.random(v.shape).astype(v.dtype) * 5 - 2
                                                   for k, v in reference_arrays().items()}, layers=other)
    code, out, err = run_cli(capsys, dumps[0], renamed, "-o", tmp_path / "rep")
    assert "no layer in common" not in err
    table = pd.read_csv(tmp_path / "rep" / "summary.csv")
    rows = table[table["run_key"].astype(str).str.startswith("other_")]
    assert len(rows) == len(LAYERS) and set(rows["match"]) == {"structure"}
    assert (rows["key"].str.replace("other_", "") == rows["run_key"].str.replace("other_", "")).all()
    assert "fail" in set(rows["status"])


def test_huge_declared_shape_is_refused_per_layer(tmp_path, dumps, capsys):
    with h5py.File(dumps[1], "r+") as f:
        del f["tensors/4"]
        huge = f["tensors"].create_dataset("4", shape=(1 << 20, 1 << 20), dtype="f4", chunks=(1, 1024))
        huge.attrs["key"] = "pool:0"  # a corrupt or hostile file: the table says 72 values, the dataset 2^40
    code, out, err = run_cli(capsys, dumps[0], dumps[1], "-o", tmp_path / "rep")
    line = one_line(err)
    assert code == 2 and line.count("\n") == 0 and "pool:0" in line and "GiB" in line
    rows = (tmp_path / "rep" / "summary.csv").read_text()
    assert "unreadable" in rows and "prob:0" in rows


def test_foreign_dumps_in_a_directory_get_per_input_provenance_with_set(tmp_path, capsys):
    """A colleague's .npz dumps (no provenance) analyzed directly: --set labels each one."""
    rng = np.random.default_rng(3)
    arrays = {f"blk/conv{i}": rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for i in range(3)}
    folder = tmp_path / "mail"
    folder.mkdir()
    np.savez(folder / "ort.npz", **arrays)
    np.savez(folder / "phone.npz", **{k: v + np.float32(0.05) for k, v in arrays.items()})
    code, out, err = run_cli(capsys, folder, "-o", tmp_path / "rep", "--json",
                             "--set", f"{folder / 'ort.npz'}:backend_requested=cpu",
                             "--set", f"{folder / 'ort.npz'}:precision_requested=high",
                             "--set", f"{folder / 'phone.npz'}:backend_requested=opencl",
                             "--set", "device_model=Pixel 8")
    doc = json.loads(out)
    assert code == 0, err
    assert doc["reference"]["run"] == "cpu/high"
    runs = {r["provenance"]["backend_requested"]: r for r in doc["runs"]}
    assert set(runs) == {"cpu", "opencl"} and all(r["provenance"]["device_model"] == "Pixel 8" for r in runs.values())
    assert runs["opencl"]["verdict"] in ("warn", "fail")


@pytest.mark.parametrize("args, expected", [
    (["--bogus-flag"], "No such option: --bogus-flag"),
    (["runs", "-o"], "requires an argument"),
    (["runs", "-o", "rep", "--atol", "abc"], "Invalid value for '--atol'"),
    (["inspect"], "Missing argument"),
    (["import", "x.npz"], "Missing option"),
    (["export", "a.h5", "-o", "x.json", "--to", "nothing"], "Invalid value"),
])
def test_usage_errors_follow_the_click_convention(tmp_path, args, expected):
    """Exit 2 with "Usage: ... Error: ..." and never a traceback, for the default command and sub-commands."""
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", *args], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "Error:" in proc.stderr and expected in proc.stderr, proc.stderr


def test_nothing_to_analyze_leaves_no_empty_report_directory(tmp_path, capsys):
    """A sweep of failed runs (no dump) asked for its report: one line, exit 1, and no empty report folder."""
    runs = tmp_path / "runs"
    runs.mkdir()
    code, _out, err = run_cli(capsys, runs, "-o", runs / "report")
    assert code == 1 and "no dumps inside" in err
    assert not (runs / "report").exists()
