"""`analyze` with isolated dumps: cumulative next to isolated error, and whose fault it is.

The real test runs the overflow sample on the local device (ncnn Vulkan on lavapipe at low
precision overflows in block2/amplify) and isolates that layer, the one it feeds (whose fp16 input cannot
hold the reference's values) and one further downstream; the
synthetic tests pin the matching rules with small dumps written by the project's DumpWriter.
"""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pandas as pd
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.cli.app import main
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import LayerdiffError
from layerdiff.analyzer.report.outdir import prepare_out_dir
from layerdiff.analyzer.report.plots import error_by_layer
from layerdiff.analyzer.formats.rawdump import sha256_file
from layerdiff.analyzer.report.page import write_report
from layerdiff.analyzer.report.tables import isolation_table
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.collector.run.isolate import isolate
from layerdiff.collector.inputs.modelfiles import resolve_model
from tests.analyze_dumps import DOWNSTREAM, perturbed, reference_arrays, write_dump
from tests.conftest import MODELS

AMPLIFY, SHRINK, HEAD = "block2/amplify:0", "block2/shrink:0", "head/conv:0"


# ---------------------------------------------------------------- real dumps from the local device

@pytest.fixture(scope="module")
def overflow_report(local_runs, tmp_path_factory):
    """cpu/high reference, vulkan/low cumulative, vulkan/low isolated [amplify, shrink, head/conv], analyzed by the CLI."""
    root = tmp_path_factory.mktemp("iso-real")
    ref, cumulative = local_runs("overflow.param", "cpu", "high"), local_runs("overflow.param", "vulkan", "low")
    outcome = isolate(LocalDevice(), resolve_model(MODELS / "overflow.param"), "vulkan", "low", ref,
                      [AMPLIFY, SHRINK, HEAD], root)
    assert outcome.status == "done", outcome.message
    return ref, cumulative, outcome.paths[0], root / "report"


def test_overflow_kernel_blamed_and_downstream_layer_cleared(overflow_report, capsys):
    ref, cumulative, isolated, report = overflow_report
    code = main([str(ref), str(cumulative), str(isolated), "-o", str(report), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(captured.out)
    assert [r["run"] for r in doc["runs"]] == ["cpu/high", "vulkan/low"]  # the isolated dump is not a run
    found = {f["layer"]: f for f in doc["findings"] if f["kind"] == "isolation"}
    assert set(found) == {AMPLIFY, SHRINK, HEAD}
    amplify, head = found[AMPLIFY], found[HEAD]
    assert "the kernel itself is off" in amplify["sentence"] and "overflow" in amplify["sentence"]
    assert amplify["severity"] == "fail" and amplify["numbers"]["verdict"] == "kernel"
    assert "fine given correct inputs; the error comes from upstream" in head["sentence"]
    assert "Convolution" in head["sentence"] and "vulkan/low" in head["sentence"]
    assert head["numbers"]["cumulative_status"] == "fail" and head["numbers"]["isolated_status"] == "pass"
    assert head["numbers"]["isolated_rel_l2"] < 0.01 < head["numbers"]["cumulative_rel_l2"]
    assert doc["isolated"][0]["layers"] == [AMPLIFY, SHRINK, HEAD] and doc["isolated"][0]["run"] == "vulkan/low"
    layers = {l["key"]: l for l in doc["runs"][1]["layers"]}
    assert layers[HEAD]["isolation"] == "upstream" and layers["stem/conv:0"]["isolated_status"] is None

    table = pd.read_csv(report / "summary.csv")
    both = table[table["isolated_status"].notna()].set_index("key")
    assert set(both.index) == {AMPLIFY, SHRINK, HEAD}
    assert both.loc[HEAD, "status"] == "fail" and both.loc[HEAD, "isolated_status"] == "pass"
    assert both.loc[HEAD, "isolated_rel_l2"] < both.loc[HEAD, "rel_l2"]
    markdown = (report / "summary.md").read_text()
    assert "## Isolation" in markdown and "| isolated_rel_l2 |" in markdown
    html = (report / "index.html").read_text()
    assert "<h2>Isolation</h2>" in html and "<th>isolated_rel_l2</th>" in html
    assert "layer run alone on the reference's inputs" in html  # the chart's triangles


def test_a_layer_fed_values_fp16_cannot_hold_is_not_blamed_on_its_kernel(overflow_report, capsys):
    """block2/shrink reads block2/amplify, whose reference values pass 65504: stored as fp16 on vulkan/low they
    cannot enter the layer as they are, so its failure alone is its input's type, not its kernel; with a run
    whose label keeps fp32 storage (`fp16-arith`) nothing excuses it."""
    ref, cumulative, isolated, report = overflow_report
    with DumpFile(ref) as reference, DumpFile(isolated) as alone:
        beyond = int((np.abs(reference.tensor_by_key(AMPLIFY)) > 65504).sum())  # numpy's count, not layerdiff's
        truth, got = reference.tensor_by_key(SHRINK).astype(np.float64), alone.tensor_by_key(SHRINK).astype(np.float64)
        assert alone.attrs["precision_effective"] == "fp16-storage+arith"
    assert beyond > 1000
    changed = ~np.isfinite(got) | (np.abs(got - truth) > 1e-2 * np.abs(truth).max())
    assert changed.mean() > 0.5  # the isolated output really is wrong, so the layer really fails alone
    assert main([str(ref), str(cumulative), str(isolated), "-o", str(report.parent / "fed"), "--json"]) == 0
    found = {f["layer"]: f for f in json.loads(capsys.readouterr().out)["findings"] if f["kind"] == "isolation"}
    shrink = found[SHRINK]
    assert shrink["numbers"]["verdict"] == "input_type" and shrink["severity"] == "info"
    assert shrink["numbers"]["fed_overflow"] == beyond and shrink["numbers"]["isolated_status"] == "fail"
    assert f"not by its own kernel: it reads {AMPLIFY} as fp16 ({beyond} of its" in shrink["sentence"]
    assert found[AMPLIFY]["numbers"]["verdict"] == "kernel"  # the overflow itself is still the amplifying kernel's

    relabelled = report.parent / "fp32-storage" / isolated.name
    relabelled.parent.mkdir()
    shutil.copy(isolated, relabelled)
    with h5py.File(relabelled, "r+") as dump:
        dump.attrs["precision_effective"] = "fp16-arith"
    assert main([str(ref), str(cumulative), str(relabelled), "-o", str(report.parent / "fp32"), "--json"]) == 0
    found = {f["layer"]: f for f in json.loads(capsys.readouterr().out)["findings"] if f["kind"] == "isolation"}
    assert found[SHRINK]["numbers"]["verdict"] == "kernel" and found[SHRINK]["numbers"]["fed_overflow"] == 0


# ---------------------------------------------------------------- synthetic dumps: matching rules

BROKEN = "block/conv 2"  # its kernel is broken in the "vulkan/low" dumps below; everything after inherits


def _cumulative(ref: dict) -> dict:
    run = perturbed(ref, 1e-4, seed=3)
    for op in DOWNSTREAM[BROKEN]:
        run[op] = perturbed(run, 0.5, seed=4, ops=[op])[op]
    return run


def _isolated_dump(path, ref_path, ref: dict, **attrs):
    """What `collect isolate` writes: only the targets, fed the reference's inputs; `BROKEN` stays broken."""
    arrays = {BROKEN: perturbed(ref, 0.5, seed=5, ops=[BROKEN])[BROKEN],
              "pool": perturbed(ref, 1e-4, seed=6, ops=["pool"])["pool"]}
    header = {"mode": "isolate", "isolated_from": ref_path.name, "reference_sha256": sha256_file(ref_path),
              "input_label": ref_path.stem, "input_sha256": "", **attrs}
    return write_dump(path, arrays, backend="vulkan", precision="low", **header)


@pytest.fixture
def dumps(tmp_path):
    """runs/: cpu/high reference, vulkan/low (repeats 0 and 1), vulkan/high; iso/: the isolated dump."""
    ref = reference_arrays()
    runs, iso = tmp_path / "runs", tmp_path / "iso"
    runs.mkdir()
    iso.mkdir()
    ref_path = write_dump(runs / "cpu_high.h5", ref)
    write_dump(runs / "vk_low_r1.h5", _cumulative(ref), backend="vulkan", precision="low", repeat=1)
    write_dump(runs / "vk_low.h5", _cumulative(ref), backend="vulkan", precision="low", repeat=0)
    write_dump(runs / "vk_high.h5", perturbed(ref, 1e-5, seed=9), backend="vulkan", precision="high")
    iso_path = _isolated_dump(iso / "isolated_vk_low.h5", ref_path, ref)
    return ref, runs, iso_path


def _analyzed(paths, **kwargs):
    analysis = analyze_paths(paths, **kwargs)
    analysis.close()
    return analysis


def test_isolated_dump_matches_the_lowest_repeat_of_its_setting(dumps):
    _, runs, iso_path = dumps
    analysis = _analyzed([runs, iso_path])
    assert analysis.problems == []
    assert iso_path not in [r.path for r in analysis.runs]
    table = isolation_table(analysis.comparison).set_index("key")
    assert set(table.index) == {BROKEN + ":0", "pool:0"}
    assert set(table["run"]) == {"vulkan/low r0"}
    assert table.loc[BROKEN + ":0", "isolation"] == "kernel" and table.loc["pool:0", "isolation"] == "upstream"
    assert table.loc["pool:0", "status"] == "fail" and table.loc["pool:0", "isolated_status"] == "pass"
    kinds = [f.kind for f in analysis.findings]
    assert kinds.index("isolation") == kinds.index("first_divergence") + kinds.count("first_divergence")
    sentences = {f.layer: f.sentence for f in analysis.findings if f.kind == "isolation"}
    assert "the kernel itself is off by rel L2" in sentences[BROKEN + ":0"]
    assert "layer pool:0 (Pooling)" in sentences["pool:0"] and "comes from upstream" in sentences["pool:0"]


def test_reference_found_beside_the_isolated_dump(dumps, tmp_path):
    """The reference is not among the inputs, but lies next to the isolated file (a copy is the run's base)."""
    _, runs, iso_path = dumps
    shutil.move(runs / "cpu_high.h5", iso_path.parent / "cpu_high.h5")
    shutil.copy(iso_path.parent / "cpu_high.h5", runs / "reference_copy.h5")
    analysis = _analyzed([runs, iso_path])
    assert analysis.problems == []
    assert len(isolation_table(analysis.comparison)) == 2
    assert analysis.isolation.matched[0]["reference"].endswith("iso/cpu_high.h5")


def test_missing_reference_is_one_line_and_the_rest_is_analyzed(dumps, tmp_path, capsys):
    _, runs, iso_path = dumps
    shutil.move(runs / "cpu_high.h5", tmp_path / "elsewhere.h5")
    shutil.copy(tmp_path / "elsewhere.h5", runs / "reference_copy.h5")
    code = main([str(runs), str(iso_path), "-o", str(tmp_path / "rep")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"analyze: {iso_path}: isolated against cpu_high.h5, which is neither among the inputs nor in "
                   f"{iso_path.parent}; pass that reference dump to analyze too"]
    assert "## Isolation" not in (tmp_path / "rep" / "summary.md").read_text()


def test_reference_changed_since_isolation_is_refused(dumps):
    ref, runs, iso_path = dumps
    write_dump(runs / "cpu_high.h5", perturbed(ref, 0.01, seed=11))  # re-collected under the same name
    analysis = _analyzed([runs, iso_path])
    assert len(analysis.problems) == 1 and "sha256 differs" in analysis.problems[0]
    assert analysis.isolation.table.empty and not [f for f in analysis.findings if f.kind == "isolation"]


def test_no_cumulative_run_of_that_setting(dumps):
    _, runs, iso_path = dumps
    for name in ("vk_low.h5", "vk_low_r1.h5"):
        (runs / name).unlink()
    analysis = _analyzed([runs, iso_path])
    assert analysis.problems == [f"{iso_path}: no compared run of ncnn vulkan/low on local fed the same input as "
                                 "cpu_high.h5 among the inputs; pass that run's dump too to see isolated next to "
                                 "cumulative errors"]


def test_other_device_or_model_does_not_match(dumps, tmp_path):
    ref, runs, iso_path = dumps
    other = _isolated_dump(tmp_path / "iso" / "isolated_other.h5", runs / "cpu_high.h5", ref, device_serial="phone2")
    analysis = _analyzed([runs, other])
    assert len(analysis.problems) == 1 and "no compared run of ncnn vulkan/low on phone2" in analysis.problems[0]


def test_isolated_dumps_are_not_runs(dumps):
    _, runs, iso_path = dumps
    with pytest.raises(LayerdiffError, match="cannot be the reference"):
        analyze_paths([runs, iso_path], ref=iso_path)
    with pytest.raises(LayerdiffError, match="only one readable dump .* isolated dump"):
        analyze_paths([runs / "cpu_high.h5", iso_path])


def test_report_files_carry_both_columns_and_the_plot_the_triangles(dumps, tmp_path):
    _, runs, iso_path = dumps
    analysis = analyze_paths([runs, iso_path])
    try:
        out = prepare_out_dir(tmp_path / "rep")
        write_report(analysis, out)
        rows = analysis.comparison.table
        measured = rows[(rows["comparison"] == "reference") & rows["status"].isin(["pass", "warn", "fail"])]
        plain = error_by_layer(measured, {})
        marked = error_by_layer(measured, {}, isolated=isolation_table(analysis.comparison))
    finally:
        analysis.close()
    assert plain != marked
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema_version"] == 1
    isolated_layers = [l for run in doc["runs"] for l in run["layers"] if l.get("isolation")]
    assert sorted(l["isolation"] for l in isolated_layers) == ["kernel", "upstream"]
    assert all(np.isfinite(l["isolated_rel_l2"]) for l in isolated_layers)
