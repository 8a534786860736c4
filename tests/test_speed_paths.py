"""The paths that keep layerdiff fast: one measurement per set of runs, light engine children,
the fast tensor reader agreeing with h5py. (Speed itself is measured in tests/bench/, not here.)"""
from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

import analyzer.analysis as analysis_module
from analyzer import resultcache
from analyzer.analysis import analyze_paths
from analyzer.dumpfile import DumpFile, DumpWriter, TensorBuffer
from tests.analyze_dumps import perturbed, reference_arrays, write_dump


@pytest.fixture()
def runs(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    ref = reference_arrays(seed=1)
    write_dump(folder / "cpu.h5", ref)
    write_dump(folder / "vk.h5", perturbed(ref, 1e-3, seed=2), backend="vulkan", precision="low")
    return folder


def _results(analysis) -> dict:
    table = analysis.comparison.table
    return {"rows": len(table), "rel": table["rel_l2"].round(12).tolist(), "findings": [f.sentence for f in analysis.findings]}


def test_second_analysis_of_the_same_runs_reuses_the_measurement(runs, monkeypatch):
    first = analyze_paths([runs])
    expected = _results(first)
    first.close()
    assert len(list((runs / resultcache.CACHE_DIR).glob("*.json"))) == 1

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although nothing changed")

    monkeypatch.setattr(analysis_module, "compare_all", no_measuring)
    again = analyze_paths([runs])
    try:
        assert _results(again) == expected
    finally:
        again.close()


def test_changed_dump_or_options_are_measured_again(runs):
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
    assert len(list((runs / resultcache.CACHE_DIR).glob("*.json"))) == 2


def test_damaged_cache_entries_are_ignored(runs):
    analyze_paths([runs]).close()
    for entry in (runs / resultcache.CACHE_DIR).glob("*.json"):
        entry.write_text(json.dumps({"key": entry.stem, "table": "not a table"}))
    again = analyze_paths([runs])
    try:
        assert len(again.comparison.table) > 0
    finally:
        again.close()


def test_engine_children_import_neither_pandas_nor_h5py():
    code = ("import sys, collector.engines.ncnn_engine, collector.engines.mnn_engine, collector.engines.harness_cli;"
            "print([m for m in ('pandas', 'h5py', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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
