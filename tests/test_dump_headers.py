"""Dump headers kept in the cache: a re-judged analysis reads attributes, tables and the focus chart's
tensors without HDF5, gives what a fresh analysis gives, and never trusts a header of a changed file."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile, TensorBuffer
from layerdiff.analyzer.runs import dumpheaders
from tests.analyze_dumps import perturbed, reference_arrays, write_dump
from tests.test_speed_paths import cache  # noqa: F401 (fixture: the user's layerdiff cache, private to the test)


@pytest.fixture()
def failing_runs(tmp_path, cache):
    """A cpu/high reference and a vulkan/low run 30% off it: every layer fails, so the report draws a focus chart."""
    folder = tmp_path / "runs"
    folder.mkdir()
    ref = reference_arrays(seed=1)
    write_dump(folder / "cpu.h5", ref)
    write_dump(folder / "vk.h5", perturbed(ref, 0.3, seed=2), backend="vulkan", precision="low")
    return folder


def _analyze(runs, out, *options, cache_dir=None):
    env = {**os.environ, **({"LAYERDIFF_CACHE_DIR": str(cache_dir)} if cache_dir else {})}
    code = ("import sys; from layerdiff.analyzer.cli.app import main; code = main(sys.argv[1:]); "
            "print('H5PY-LOADED' if 'h5py' in sys.modules else 'H5PY-ABSENT', file=sys.stderr); "
            "print('REGISTRY-LOADED' if 'layerdiff.collector.engines' in sys.modules else 'REGISTRY-ABSENT', "
            "file=sys.stderr); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, str(runs), "-o", str(out), "--json", *options],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def _verdicts(results: dict) -> list:
    return [(run["run"], run["verdict"], [(layer["key"], layer["status"]) for layer in run["layers"]])
            for run in results["runs"] if "layers" in run]


def test_a_rejudged_analysis_loads_no_hdf5_and_agrees_with_a_fresh_one(failing_runs, cache, tmp_path):
    _, first = _analyze(failing_runs, tmp_path / "r1")
    assert "H5PY-LOADED" in first and len(list(cache.glob(f"{dumpheaders.PREFIX}*.json"))) == 2
    rejudged, log = _analyze(failing_runs, tmp_path / "r2", "--warn-rel-l2", "0.005", "--fail-rel-l2", "0.2")
    assert "H5PY-ABSENT" in log
    fresh, _ = _analyze(failing_runs, tmp_path / "r3", "--warn-rel-l2", "0.005", "--fail-rel-l2", "0.2",
                        cache_dir=tmp_path / "other-cache")
    assert _verdicts(rejudged) == _verdicts(fresh) and any(v[1] == "fail" for v in _verdicts(fresh))
    for entry in cache.glob(f"{dumpheaders.PREFIX}*.json"):  # trimmed from the cache: the measurement stays
        entry.unlink()
    _, log = _analyze(failing_runs, tmp_path / "r4", "--warn-rel-l2", "0.006")
    assert "H5PY-LOADED" in log  # read from HDF5 once more, the focus chart's offsets learnt on the way
    _, log = _analyze(failing_runs, tmp_path / "r5", "--warn-rel-l2", "0.007")
    assert "H5PY-ABSENT" in log
    page = (tmp_path / "r2" / "index.html").read_text()
    assert 'id="focus-chart"' in page  # the failing layer's values, read at the header's offsets
    assert page.split('Plotly.newPlot("focus-chart"')[1][:20000] == \
        (tmp_path / "r3" / "index.html").read_text().split('Plotly.newPlot("focus-chart"')[1][:20000]


def test_a_dump_without_engine_facts_is_rejudged_without_the_engine_registry(failing_runs, cache, tmp_path):
    """These dumps name their engine but record none of its facts: a fresh analysis reads that engine's
    declaration from its folder, the kept header keeps it, and a re-judge reads it from there, with the same
    verdicts as a fresh analysis of the same thresholds."""
    with DumpFile(failing_runs / "cpu.h5") as dump:
        assert "engine_facts" not in dump.attrs and dump.attrs["engine"] == "ncnn"
    _, first = _analyze(failing_runs, tmp_path / "r1")
    assert "REGISTRY-LOADED" in first
    kept = [json.loads(entry.read_text()) for entry in cache.glob(f"{dumpheaders.PREFIX}*.json")]
    assert len(kept) == 2 and all("declared" in doc for doc in kept)
    rejudged, log = _analyze(failing_runs, tmp_path / "r2", "--warn-rel-l2", "0.004")
    assert "REGISTRY-ABSENT" in log and "H5PY-ABSENT" in log
    fresh, log = _analyze(failing_runs, tmp_path / "r3", "--warn-rel-l2", "0.004", cache_dir=tmp_path / "other-cache")
    assert "REGISTRY-LOADED" in log and _verdicts(rejudged) == _verdicts(fresh)
    assert rejudged["findings"] == fresh["findings"]


def test_reads_at_the_headers_offsets_equal_the_hdf5_reads(failing_runs, cache):
    path = failing_runs / "vk.h5"
    with DumpFile(path) as opened:
        orders = opened.layers["order"].tolist()
        expected = {order: opened.tensor(order).copy() for order in orders}
        samples = {order: opened.sample(order, 100) for order in orders}
        for order in orders:  # the measuring path: one buffer, offsets recorded
            from layerdiff.analyzer.formats.dumpfile import TensorBuffer
            opened.tensor(order, TensorBuffer())
        header = opened.header()
    assert set(header.offsets) == set(orders)
    dumpheaders.store(path, header)
    kept = dumpheaders.load(path)
    assert kept is not None and kept.offsets == header.offsets
    with DumpFile(path, header=kept) as again, DumpFile(path) as reread:
        assert again.from_header and repr(again.attrs) == repr(reread.attrs)  # NaN included
        for order in orders:
            np.testing.assert_array_equal(again.tensor(order), expected[order])
            np.testing.assert_array_equal(again.sample(order, 100), samples[order])
        assert again._h5 is None  # nothing above needed the file open in HDF5


def test_a_header_is_never_used_for_a_changed_file(failing_runs, cache):
    path = failing_runs / "cpu.h5"
    with DumpFile(path) as opened:
        dumpheaders.store(path, opened.header())
    assert dumpheaders.load(path) is not None
    with h5py.File(path, "r+") as f:  # the same size and, set back, the same modification time
        f.attrs["precision_requested"] = "loww"[:4]
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert dumpheaders.load(path) is None  # its change time moved
    with DumpFile(path) as opened:
        dumpheaders.store(path, opened.header())
    assert dumpheaders.load(path).attrs["precision_requested"] == "loww"
    os.utime(path)
    assert dumpheaders.load(path) is None


def test_a_damaged_header_is_ignored_and_a_nan_attribute_survives(failing_runs, cache, tmp_path):
    path = failing_runs / "cpu.h5"
    with DumpFile(path) as opened:
        header = opened.header()
    assert math.isnan(header.attrs["infer_ms"])
    dumpheaders.store(path, header)
    kept = dumpheaders.load(path)
    assert math.isnan(kept.attrs["infer_ms"]) and kept.layers.equals(header.layers)
    entry = dumpheaders.entry_path(path)
    for damage in (b"{not json", b'{"format": 1}', entry.read_bytes().replace(b'"offsets":{', b'"offsets":{"0":-5,')):
        entry.write_bytes(damage)
        assert dumpheaders.load(path) is None
    entry.write_bytes(b"\x00" * 10)
    analysis = analyze_paths([failing_runs])
    try:
        assert len(analysis.runs) == 2 and not analysis.runs[0].dump.from_header
    finally:
        analysis.close()


def test_a_sweep_folder_with_its_index_and_report_is_searched_without_the_foreign_format_readers(failing_runs, cache):
    """A sweep's folder holds, besides its dumps, its index.csv, its lock and its report: layerdiff's own files,
    so no other tool's dump is looked for among them (the readers of other formats load h5py and more)."""
    from layerdiff.analyzer.formats.index import SWEEP_COLUMNS
    from layerdiff.analyzer.runs.discovery import discover

    (failing_runs / "index.csv").write_text(",".join(SWEEP_COLUMNS) + "\n")
    (failing_runs / ".layerdiff.lock").write_text("")
    report = failing_runs / "report"
    report.mkdir()
    for name in ("index.html", "results.json", "summary.csv"):
        (report / name).write_text("{}")
    code = ("import sys; from layerdiff.analyzer.runs.discovery import discover; "
            f"found, _ = discover([{str(failing_runs)!r}]); "
            "print(len(found), 'layerdiff.analyzer.importers.common' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stderr
    (failing_runs / "index.csv").write_text("a,b\n1,2\n")  # another tool's CSV: the readers look at it
    found, _ = discover([failing_runs])
    assert len(found) == 2


def test_a_program_with_its_own_engine_lookup_is_asked_itself_not_a_kept_declaration(failing_runs, cache, tmp_path):
    """A kept header keeps the declaration of the lookup installed when it was written. A program that installs its
    own lookup, without saying what its declarations are made of, gets its own answers and keeps none."""
    from layerdiff.analyzer.formats import declared, enginefacts

    _analyze(failing_runs, tmp_path / "r1")  # the headers keep the installed registry's declaration of ncnn
    assert dumpheaders.entry_path(failing_runs / "cpu.h5").is_file()
    installed, sources = declared.lookup, declared.sources
    assert installed("ncnn") != enginefacts.NO_FACTS
    declared.install(lambda engine: enginefacts.NO_FACTS)
    try:
        for name in ("cpu.h5", "vk.h5"):
            dumpheaders.load(failing_runs / name)
        assert enginefacts.declared_facts("ncnn") == enginefacts.NO_FACTS
        assert enginefacts.declared_text("ncnn") is None
    finally:
        declared.install(installed, sources)
    assert enginefacts.declared_facts("ncnn") == installed("ncnn")
