"""The paths that keep layerdiff fast: one measurement per set of runs, light engine children,
the fast tensor reader agreeing with h5py. (Speed itself is measured in tests/bench/, not here.)"""
from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np
import orjson
import pandas as pd
import pytest

import layerdiff.analyzer.measure.compare as measuring
from layerdiff.analyzer.formats import jsontable
from layerdiff.analyzer.measure import resultcache
from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile, DumpWriter, TensorBuffer
from tests.analyze_dumps import cpu_and_vulkan_runs, perturbed, reference_arrays, write_dump


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """The user's layerdiff cache (layerdiff.analyzer.importers.convcache), here a private folder of this test."""
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def runs(tmp_path, cache):
    return cpu_and_vulkan_runs(tmp_path / "runs")


def _results(analysis) -> dict:
    table = analysis.comparison.table
    return {"rows": len(table), "rel": table["rel_l2"].round(12).tolist(), "findings": [f.sentence for f in analysis.findings]}


def _entries(cache):
    return list(cache.glob(f"{resultcache.PREFIX}*.json"))


def test_second_analysis_of_the_same_runs_reuses_the_measurement(runs, cache, monkeypatch):
    first = analyze_paths([runs])
    expected = _results(first)
    first.close()
    assert len(_entries(cache)) == 1 and not (runs / ".layerdiff-cache").exists()

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although nothing changed")

    monkeypatch.setattr(measuring, "compare_all", no_measuring)
    again = analyze_paths([runs])
    try:
        assert _results(again) == expected
    finally:
        again.close()


def test_a_threshold_change_rejudges_the_stored_measurement(runs, cache, monkeypatch):
    """Thresholds judge, they do not measure: a stricter --warn-rel-l2 reuses the stored numbers (no tensor
    is read) and moves the statuses exactly where the numbers cross the new threshold."""
    from layerdiff.analyzer.findings.verdict import Thresholds

    first = analyze_paths([runs])
    rel = first.comparison.table["rel_l2"].astype(float)
    strict = float(rel[rel > 0].min()) / 2  # every layer with any error crosses it
    before = first.comparison.table["status"].tolist()
    first.close()

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again for a threshold change")

    monkeypatch.setattr(measuring, "compare_all", no_measuring)
    again = analyze_paths([runs], thresholds=Thresholds(warn_rel_l2=strict, fail_rel_l2=max(strict * 2, 0.1)))
    try:
        table = again.comparison.table
        assert table["rel_l2"].astype(float).round(12).tolist() == rel.round(12).tolist()
        crossed = table["rel_l2"].astype(float) > strict
        assert crossed.any() and (table.loc[crossed, "status"] != "pass").all()
        assert table["status"].tolist() != before and "measured" not in set(table["status"])
    finally:
        again.close()
    assert len(_entries(cache)) == 1


def test_rejudging_reads_no_tensor_and_judges_as_a_fresh_analysis(runs, cache, tmp_path, monkeypatch):
    """Every judge threshold re-judges the stored measurement without reading a tensor (the storage
    evidence of the precision labels included; only a failing layer's packed-order check reads its two
    tensors, so these thresholds warn), keeps the one stored entry, and finds exactly what a fresh
    analysis with those thresholds finds."""
    from layerdiff.analyzer.findings.verdict import Thresholds

    analyze_paths([runs]).close()
    judged = Thresholds(warn_rel_l2=1e-5, fail_rel_l2=0.5, min_pass_fraction=0.999, warn_zero_collapse=0.01,
                        fail_zero_collapse=0.9, underflow_risk_share=0.01, growth_factor=2.0)

    def no_tensor(*args, **kwargs):
        raise AssertionError("a tensor was read to judge")

    with monkeypatch.context() as patched:
        for name in ("tensor", "sample"):
            patched.setattr(DumpFile, name, no_tensor)
        rejudged = analyze_paths([runs], thresholds=judged)
        rejudged_results, storage = _results(rejudged), dict(rejudged.comparison.storage)
        statuses = rejudged.comparison.table["status"].tolist()
        rejudged.close()
    assert len(_entries(cache)) == 1 and storage
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "another-cache"))
    fresh = analyze_paths([runs], thresholds=judged)
    try:
        assert _results(fresh) == rejudged_results and fresh.comparison.table["status"].tolist() == statuses
        assert fresh.comparison.storage == storage
        assert "warn" in statuses
    finally:
        fresh.close()


def test_rejudging_reads_no_layer_table_and_keeps_the_files_own(runs, cache, monkeypatch):
    """The stored measurement keeps each run's /layers table as it was read and checked, so a re-judge
    reads none from the files, and the tables it judges with equal the files' own, dtypes included."""
    from layerdiff.analyzer.findings.verdict import Thresholds
    from layerdiff.analyzer.formats import dumpfile

    analyze_paths([runs]).close()

    def no_table(*args, **kwargs):
        raise AssertionError("a /layers table was read to judge")

    with monkeypatch.context() as patched:
        patched.setattr(dumpfile, "_read_layers", no_table)
        rejudged = analyze_paths([runs], thresholds=Thresholds(warn_rel_l2=1e-5))
        adopted = {run.path: run.layers.copy() for run in rejudged.runs}
        rejudged.close()
    assert len(adopted) >= 2
    for path, table in adopted.items():
        with DumpFile(path) as dump:
            pd.testing.assert_frame_equal(table, dump.layers)


def test_a_task_change_rejudges_the_stored_outputs_without_reading_a_tensor(runs, cache, tmp_path, monkeypatch):
    """The model outputs a task decodes are kept with the measurement: judging the stored runs with a
    declared --task opens no tensor and says exactly what a fresh analysis with that task says."""
    from layerdiff.analyzer.findings.verdict import Thresholds

    analyze_paths([runs]).close()
    judged = Thresholds(warn_rel_l2=1e-5, fail_rel_l2=0.5)  # every layer warns; none fails (no packed-order read)

    def no_tensor(*args, **kwargs):
        raise AssertionError("a tensor was read to judge")

    with monkeypatch.context() as patched:
        for name in ("tensor", "sample"):
            patched.setattr(DumpFile, name, no_tensor)
        rejudged = analyze_paths([runs], thresholds=judged, task="classification")
        results, summary = _results(rejudged), rejudged.summary.copy()
        rejudged.close()
    assert len(_entries(cache)) == 1
    assert "top-1" in summary.to_json(), "the task judged the stored outputs"
    monkeypatch.setenv("LAYERDIFF_CACHE_DIR", str(tmp_path / "another-cache"))
    fresh = analyze_paths([runs], thresholds=judged, task="classification")
    try:
        assert _results(fresh) == results
        pd.testing.assert_frame_equal(fresh.summary, summary)
    finally:
        fresh.close()


def test_outputs_too_big_to_keep_are_left_out_without_being_read(runs, cache, monkeypatch):
    """A model output over the size kept with the measurement is skipped by what the /layers table declares:
    reading a 256 MB output whole only to drop it would cost a fresh analysis as much as measuring it."""
    analysis = analyze_paths([runs])
    try:
        comparison = analysis.comparison
        graphs = {run.label: comparison.graph(run) for run in comparison.plan.references.values()}
        kept = measuring.kept_outputs(comparison.plan, comparison.alignments, graphs)
        assert kept, "the runs' outputs are small enough to keep"
        smallest = min(values.nbytes for values in kept.values())

        def no_tensor(*args, **kwargs):
            raise AssertionError("an output too big to keep was read")

        monkeypatch.setattr(measuring, "MAX_KEPT_OUTPUT_BYTES", smallest - 1)
        monkeypatch.setattr(DumpFile, "tensor", no_tensor)
        assert measuring.kept_outputs(comparison.plan, comparison.alignments, graphs) == {}
    finally:
        analysis.close()


def test_stored_outputs_that_do_not_fill_their_shape_are_measured_again(runs, cache, monkeypatch):
    analyze_paths([runs]).close()
    (entry,) = _entries(cache)
    doc = orjson.loads(entry.read_bytes())
    assert doc["outputs"], "the model outputs are kept with the measurement"
    doc["outputs"][0][2]["shape"] = [int(d) + 1 for d in doc["outputs"][0][2]["shape"]]
    entry.write_bytes(orjson.dumps(doc))
    measured = []
    real = measuring.compare_all
    monkeypatch.setattr(measuring, "compare_all", lambda *a, **k: measured.append(1) or real(*a, **k))
    analyze_paths([runs]).close()
    assert measured == [1]


def test_stored_outputs_whose_side_file_is_gone_are_measured_again(runs, cache, monkeypatch):
    analyze_paths([runs]).close()
    (entry,) = _entries(cache)
    side = entry.with_suffix(resultcache.OUTPUTS_SUFFIX)
    assert side.stat().st_size > 0, "the kept outputs' bytes sit beside the entry"
    side.unlink()  # trimmed from the cache apart from its entry
    measured = []
    real = measuring.compare_all
    monkeypatch.setattr(measuring, "compare_all", lambda *a, **k: measured.append(1) or real(*a, **k))
    analyze_paths([runs], task="classification").close()
    assert measured == [1] and side.is_file()


def test_changed_dump_or_options_are_measured_again(runs, cache):
    before = analyze_paths([runs])
    worst_before = float(before.comparison.table["rel_l2"].max())
    before.close()
    ref = reference_arrays(seed=1)
    write_dump(runs / "vk.h5", perturbed(ref, 0.5, seed=3), backend="vulkan", precision="low")
    changed = analyze_paths([runs])
    try:
        assert worst_before < 0.01 < float(changed.comparison.table["rel_l2"].max())
    finally:
        changed.close()
    assert len(_entries(cache)) == 2


def test_changed_analyzer_code_is_measured_again(tmp_path):
    """A stored measurement is keyed by the analyzer's sources, not only its version number: a
    development install that changes a metric must not be answered from an older entry."""
    import shutil
    from pathlib import Path

    copy = tmp_path / "code"  # a copy of the analyzer package, fingerprinted by a child that imports the copy
    shutil.copytree(Path(resultcache.__file__).parents[1], copy / "analyzer", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import importlib.util, sys; from pathlib import Path; "
            "spec = importlib.util.spec_from_file_location('rc', Path('analyzer/formats/fingerprint.py').resolve()); "
            "rc = importlib.util.module_from_spec(spec); spec.loader.exec_module(rc); print(rc.code_fingerprint())")
    probe = [sys.executable, "-c", code]

    def fingerprint() -> str:
        return subprocess.run(probe, cwd=copy, capture_output=True, text=True, check=True).stdout.strip()

    before = fingerprint()
    assert before == fingerprint()
    with open(copy / "analyzer" / "measure" / "metrics.py", "a") as source:
        source.write("\n# a changed metric\n")
    assert fingerprint() != before


def test_damaged_cache_entries_are_ignored(runs, cache):
    analyze_paths([runs]).close()
    for entry in _entries(cache):
        key = entry.stem.removeprefix(resultcache.PREFIX)
        entry.write_text(json.dumps({"key": key, "format": resultcache.FORMAT, "alignments": [], "table": "not a table"}))
    again = analyze_paths([runs])
    try:
        assert len(again.comparison.table) > 0
    finally:
        again.close()


@pytest.mark.parametrize("column", [
    {"dtype": "|O", "base64": ""},  # an object column read from bytes would be pointers
    {"strings": ["a"], "codes": {"dtype": "<i4", "base64": "BQAAAA=="}},  # code 5 of 1 text
    {"strings": ["a"], "codes": {"dtype": "<i4", "base64": "/////w=="}},  # code -1 would wrap around
    {"dtype": "<f8", "base64": "not base64!"},
])
def test_stored_columns_that_do_not_decode_are_measured_again(runs, cache, column):
    analyze_paths([runs]).close()
    (entry,) = _entries(cache)
    doc = orjson.loads(entry.read_bytes())
    doc["table"]["data"]["rel_l2"] = column
    entry.write_bytes(orjson.dumps(doc))
    again = analyze_paths([runs])
    try:
        assert again.comparison.table["rel_l2"].dtype == np.float64 and len(again.comparison.table) > 0
    finally:
        again.close()


def test_stored_table_keeps_non_finite_values_strings_and_shapes():
    frame = pd.DataFrame({"key": ["nan", "inf", "x"], "rel_l2": [np.nan, np.inf, 0.5], "max_abs": [1.0, 2.0, 3.0],
                          "n": np.array([1, 2, 3]), "ok": [True, False, True], "note": ["a", None, "b"],
                          "base_shape": [(1, 2), (3,), ()], "mixed": [-np.inf, "inf", 1]})
    stored = orjson.loads(b"".join(jsontable.table_chunks(frame)))
    assert stored["data"]["key"]["strings"] == ["nan", "inf", "x"] and "base64" in stored["data"]["rel_l2"]
    back = jsontable.table_frame(stored)
    assert back["key"].tolist() == ["nan", "inf", "x"]  # strings that spell non-finite numbers stay strings
    assert np.isnan(back["rel_l2"][0]) and back["rel_l2"][1] == np.inf and back["rel_l2"].dtype == np.float64
    assert back["mixed"].tolist() == [-np.inf, "inf", 1] and back["base_shape"].tolist() == [(1, 2), (3,), ()]
    assert back["n"].tolist() == [1, 2, 3] and back["ok"].tolist() == [True, False, True]
    assert back["note"].tolist()[::2] == ["a", "b"] and pd.isna(back["note"][1])


def test_engine_children_import_neither_pandas_nor_h5py():
    code = ("import sys, layerdiff.collector.engines.ncnn.engine, layerdiff.collector.engines.mnn.engine, layerdiff.collector.engines.harness_cli;"
            "print([m for m in ('pandas', 'h5py', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", ["layerdiff.analyzer.cli.app", "layerdiff.collector.cli"])
def test_command_line_start_up_imports_neither_pandas_nor_matplotlib(module):
    """`analyze --help` / `collect --help` (and every command's start-up) stay light: pandas and
    matplotlib are imported by the steps that use them (they were 0.2 s and 0.4 s CPU of start-up)."""
    code = f"import sys, {module}; print([m for m in ('pandas', 'matplotlib', 'plotly', 'itables') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_contributed_sub_commands_are_imported_only_when_asked_for():
    """`analyze runs/ -o report/` builds none of the sub-commands other modules contribute (import, merge,
    export, cache) and imports none of their modules; each is still listed and found by its name."""
    code = ("import json, sys, typer, typer.main, layerdiff.analyzer.cli.app as cli\n"
            "group = typer.main.get_command(cli.app)\n"
            "ctx = typer.Context(group)\n"
            "group.parse_args(ctx, ['runs', '-o', 'report'])\n"
            "before = [m for m in ('layerdiff.analyzer.cli.offline', 'layerdiff.analyzer.cli.cache') if m in sys.modules]\n"
            "names = group.list_commands(ctx)\n"
            "print(json.dumps([before, names, [group.get_command(ctx, n).name for n in names]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, names, found = json.loads(out.stdout)
    assert before == []
    assert names == ["compare", "inspect", "import", "merge", "export", "cache"] and found == names


def test_engine_probe_starts_no_process():
    """A sweep probes each engine once; that probe must not run `vulkaninfo` (only a Vulkan run
    needs the fp16 features it reads), so a cpu-only run starts no Vulkan instance at all."""
    code = ("import sys\n"
            "started = []\n"
            "sys.addaudithook(lambda event, args: started.append(str(args[0])) if event == 'subprocess.Popen' else None)\n"
            "from layerdiff.collector.engines.ncnn import engine as ncnn_engine\n"
            "report = ncnn_engine.probe()\n"
            "print(started, report['engines']['ncnn']['backends']['cpu']['ok'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] True", out.stdout + out.stderr


def test_fast_reader_matches_h5py_and_falls_back(tmp_path):
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.float16([1, 2]), np.arange(5, dtype=np.int64),
              np.float64(3.5), np.array([True, False])]
    with DumpWriter(tmp_path / "d.h5", {}) as w:
        for i, a in enumerate(arrays):
            w.add_tensor({"order": i, "op": f"op{i}"}, a)
    with h5py.File(tmp_path / "d.h5", "a") as f:  # a chunked dataset and a lying shape in /layers
        data = f["tensors/2"][()]
        del f["tensors/2"]
        f.create_dataset("tensors/2", data=data, chunks=(5,))
        table = f["layers"][()]
        table["shape"][0] = b"[4, 3]"
        table["dtype"][1] = b"float32"
        f["layers"][...] = table
    buffer = TensorBuffer()
    with DumpFile(tmp_path / "d.h5") as dump:
        for i, a in enumerate(arrays):
            got = dump.tensor(i, buffer)
            np.testing.assert_array_equal(got.reshape(-1), np.asarray(a).reshape(-1))
            assert got.dtype == np.asarray(a).dtype


@pytest.mark.parametrize("numel", [5000, 1 << 18, 3 << 20])
def test_sampled_blocks_read_as_one_span_equal_the_blocks_read_one_by_one(tmp_path, monkeypatch, numel):
    """The focus chart's samples: blocks within a few MB come from one read of their span, the same values
    as a read per block; wider ones (12 MB here) are still read per block."""
    from layerdiff.analyzer.formats import tensorread
    from layerdiff.analyzer.formats.dumpfile import _sample_blocks

    values = np.random.default_rng(numel).standard_normal(numel).astype(np.float32)
    with DumpWriter(tmp_path / "d.h5", {}) as w:
        w.add_tensor({"order": 0, "op": "op0"}, values)
    with DumpFile(tmp_path / "d.h5") as dump:
        dump.sample(0, 2000)  # learns the tensor's offset
        reader, offset = dump._fast, dump._fast.offsets[0]
        starts, length = _sample_blocks(numel, 2000)
        calls = []
        real = reader._pread
        monkeypatch.setattr(reader, "_pread", lambda out, at: calls.append(at) or real(out, at))
        spanned = reader.blocks_at(offset, values.dtype, starts, length)
        limit = tensorread.SPAN_READ_BYTES
        monkeypatch.setattr(tensorread, "SPAN_READ_BYTES", 0)
        one_by_one = reader.blocks_at(offset, values.dtype, starts, length)
    expected = values[(starts[:, None] + np.arange(length)).reshape(-1)]
    np.testing.assert_array_equal(spanned, expected)
    np.testing.assert_array_equal(one_by_one, expected)
    assert len(calls) == (1 if numel * 4 <= limit else len(starts)) + len(starts)


def test_big_tensors_are_mapped_read_only_and_measure_the_same(runs, cache, monkeypatch):
    from layerdiff.analyzer.formats import tensorread

    copied = analyze_paths([runs])
    expected = _results(copied)
    copied.close()
    monkeypatch.setattr(tensorread, "MAP_MIN_BYTES", 1)  # every contiguous tensor of the sample is "big"
    with DumpFile(runs / "vk.h5") as dump:
        orders = [int(o) for o in dump.layers["order"]]
        mapped = [dump.tensor(o, TensorBuffer()) for o in orders]
        assert mapped and not any(t.flags.writeable for t in mapped)  # a view of the file, never written
        for order, tensor in zip(orders, mapped):
            np.testing.assert_array_equal(tensor, dump.tensor(order))
    for entry in _entries(cache):
        entry.unlink()  # measured again, this time through the maps
    again = analyze_paths([runs])
    try:
        assert _results(again) == expected
    finally:
        again.close()
