"""Sketch-first collection through the real adb server and a stand-in phone: the first pass pulls the
summaries, outputs and small tensors, byte-range reads pull what the judge names, and the final analysis
gives the verdict, first divergence and failure sources of the full pull from a fraction of the bytes.

The dump on the phone is a real one (tests/sketch_support.py: PP-OCRv4 det, pip ncnn at bf16 against fp32).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.findings.finding import FindingKind
from layerdiff.analyzer.formats.rawdump import PULLED, TENSORS, convert_raw_dump, read_raw_dump
from layerdiff.collector.run.sketchpull import initial_orders, refine, start_pull
from layerdiff.collector.transport.adb import RANGE_BLOCKS, RANGE_BYTES, AdbDevice, block_span
from layerdiff.collector.transport.devices import DeviceError
from layerdiff.errors import DumpFormatError
from tests.sketch_support import det_model, dumps  # noqa: F401 (fixtures; they run host_harness)

REMOTE = "/data/local/tmp/layerdiff/runs/sketch/dump"
HEADLINE = (FindingKind.FIRST_DIVERGENCE, FindingKind.FAILURE_SOURCE)


@pytest.fixture
def phone(standin, dumps):
    """The stand-in phone holding the bf16 run's dump where a harness would have left it."""
    shutil.copytree(dumps["low"], standin.host_path(REMOTE))
    return AdbDevice(standin.serial)


def headline(analysis) -> set:
    return {(f.kind, f.layer) for f in analysis.findings if f.kind in HEADLINE}


def test_read_ranges_returns_exactly_the_bytes_asked(phone, dumps):
    data = (dumps["low"] / TENSORS).read_bytes()
    ranges = [(0, 10), (4096, 1), (len(data) - 7, 7), (123, 0)]
    got = phone.read_ranges(f"{REMOTE}/{TENSORS}", ranges)
    assert got == b"".join(data[o:o + n] for o, n in ranges)


OLD_DD = """#!/bin/sh
# dd as toybox had it before iflag=: byte flags are an unknown argument
for arg in "$@"; do
  case "$arg" in iflag=*|oflag=*) echo "dd: unknown arg ${arg%%=*}" >&2; exit 1;; esac
done
exec /bin/dd "$@"
"""


@pytest.fixture
def old_dd_phone(phone, standin):
    """The same phone with a `dd` that refuses `iflag=` (first on the PATH of every command it runs)."""
    tool = Path(standin.config.state) / "bin" / "dd"
    tool.write_text(OLD_DD)
    tool.chmod(0o755)
    return phone


def test_a_dd_without_byte_flags_reads_whole_blocks_trimmed_here(old_dd_phone, dumps):
    data = (dumps["low"] / TENSORS).read_bytes()
    size = len(data)
    ranges = [(0, 10), (4095, 2), (4096, 4096), (123, 0), (size - 7, 7), (size // 2 + 1, 70001), (size, 0)]
    got = old_dd_phone.read_ranges(f"{REMOTE}/{TENSORS}", ranges)
    assert old_dd_phone.range_style() == RANGE_BLOCKS
    assert got == b"".join(data[o:o + n] for o, n in ranges)


def test_a_dd_with_byte_flags_is_asked_for_exact_ranges(phone):
    assert phone.range_style() == RANGE_BYTES


def test_block_reads_past_the_end_are_one_line_naming_the_phone(old_dd_phone, dumps):
    size = (dumps["low"] / TENSORS).stat().st_size
    with pytest.raises(DeviceError, match="collect again with --full") as err:
        old_dd_phone.read_ranges(f"{REMOTE}/{TENSORS}", [(size - 4, 100)])
    assert old_dd_phone.serial in str(err.value)


def test_block_spans_cover_each_range_and_stop_at_the_end_of_the_file():
    assert block_span(0, 10, 10_000) == (0, 1, 4096)
    assert block_span(4095, 2, 10_000) == (0, 2, 8192)
    assert block_span(8192, 0, 10_000) == (2, 0, 0)
    assert block_span(9_000, 1_000, 10_000) == (2, 1, 10_000 - 8192)


def test_a_range_past_the_end_is_one_line_naming_the_phone(phone, dumps):
    size = (dumps["low"] / TENSORS).stat().st_size
    with pytest.raises(DeviceError, match="collect again with --full") as err:
        phone.read_ranges(f"{REMOTE}/{TENSORS}", [(size - 4, 100)])
    assert phone.serial in str(err.value)


def test_first_pass_pulls_summaries_outputs_and_small_tensors_only(phone, dumps, tmp_path):
    pull = start_pull(phone, REMOTE, tmp_path / "low")
    raw = read_raw_dump(dumps["low"])
    assert pull.pulled == set(initial_orders(raw))
    assert pull.bytes_pulled < 0.8 * pull.dump_bytes
    local = read_raw_dump(tmp_path / "low")
    for tensor in local.tensors:  # pulled tensors are byte-identical, the others were never read
        if tensor.order in pull.pulled:
            assert np.array_equal(local.read(tensor), raw.read(tensor))
    assert json.loads((tmp_path / "low" / PULLED).read_text())["bytes_pulled"] == pull.bytes_pulled


def test_refined_sketch_first_run_matches_the_full_pull(phone, dumps, tmp_path):
    """Against a local golden: the loop pulls what the judge names until nothing new is named; then the
    verdict, first divergence and failure sources equal those of the whole dump, every headline layer was
    measured exactly, and the bytes pulled stay below the whole dump's."""
    golden = convert_raw_dump(dumps["high"], tmp_path / "golden.h5")
    full = analyze_paths([golden, convert_raw_dump(dumps["low"], tmp_path / "full.h5")], ref=golden)
    full_headline, full_verdicts = headline(full), full.summary["verdict"].tolist()
    full.close()
    pull = start_pull(phone, REMOTE, tmp_path / "low")
    first = pull.bytes_pulled
    target = tmp_path / "h5" / "low.h5"
    result = refine({target: pull}, [golden], golden)
    assert result.rounds >= 2 and result.named[target] > 0 and pull.bytes_pulled > first
    final = analyze_paths([golden, target], ref=golden)
    try:
        assert headline(final) == full_headline and full_headline
        assert final.summary["verdict"].tolist() == full_verdicts
        table = final.comparison.table.set_index("key")
        for _kind, layer in full_headline:
            assert table.loc[layer, "estimated"] is not True
    finally:
        final.close()
    assert result.bytes_pulled[target] < result.dump_bytes[target]


def test_later_rounds_add_the_pulled_tensors_and_remeasure_only_them(phone, dumps, tmp_path):
    """The HDF5 a refinement updates round by round holds what one conversion of the final pull writes, and the
    analysis it keeps (its rows from earlier rounds reused) gives every number a fresh analysis gives."""
    golden = convert_raw_dump(dumps["high"], tmp_path / "golden.h5")
    pull = start_pull(phone, REMOTE, tmp_path / "low")
    target = tmp_path / "h5" / "low.h5"
    result = refine({target: pull}, [golden], golden, keep_analysis=True)
    (tmp_path / "fresh").mkdir()
    fresh_h5 = convert_raw_dump(tmp_path / "low", tmp_path / "fresh" / "low.h5")
    fresh = analyze_paths([golden, fresh_h5], ref=golden)
    try:
        assert result.rounds >= 2 and result.reused > 0
        kept, again = (a.comparison.table.set_index("key").sort_index() for a in (result.analysis, fresh))
        numbers = ["rel_l2", "cosine", "max_abs", "pass_fraction", "estimated", "rel_l2_sigma", "status"]
        pd.testing.assert_frame_equal(kept[numbers], again[numbers])
        assert headline(result.analysis) == headline(fresh)
    finally:
        result.analysis.close()
        fresh.close()
    with h5py.File(target) as updated, h5py.File(fresh_h5) as whole:
        assert sorted(updated["tensors"]) == sorted(whole["tensors"])
        for name in whole["tensors"]:
            assert np.array_equal(updated["tensors"][name][()], whole["tensors"][name][()])
        assert updated["layers"][()].tolist() == whole["layers"][()].tolist()
        for key in ("bytes_pulled", "tensors_pulled", "dump_bytes", "sketch_first"):
            assert updated.attrs[key] == whole.attrs[key]


def test_a_dump_without_summary_asks_for_a_full_pull(standin, dumps, tmp_path):
    target = standin.host_path(REMOTE)
    target.mkdir(parents=True)
    for name in ("manifest.jsonl", TENSORS):
        shutil.copy(dumps["low"] / name, target / name)
    with pytest.raises(DumpFormatError, match="--full"):
        start_pull(AdbDevice(standin.serial), REMOTE, tmp_path / "low")


def test_collect_sketch_on_a_phone_matches_collect_full(standin, monkeypatch, det_model, tmp_path):
    """`collect --sketch` and `collect --full` of the same sweep (cpu/high and cpu/low of the C++ harness on the
    stand-in): every run is pulled sketch-first, refined against the other, the phone's files removed after;
    the sweep's analysis gives the verdicts, first divergence and failure sources of the full pull."""
    from layerdiff.collector.sweep.collect import collect
    from tests.test_harness_support import host_harness

    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(host_harness()))
    work, args = det_model
    model = args[args.index("--model") + 1]
    answers = {}
    for mode in ("full", "sketch"):
        result = collect(model, devices=[standin.serial], configs=[("cpu", "high"), ("cpu", "low")],
                         inputs=[f"in0={work / 'in0.npy'}"], out=tmp_path / mode, pull=mode)
        assert result.exit_code == 0, [run.row.reason for run in result.sweep.runs]
        analysis = analyze_paths(result.paths)
        answers[mode] = (analysis.summary["verdict"].tolist(), headline(analysis))
        estimated = int(analysis.comparison.table["estimated"].eq(True).sum())
        pulled = analysis.summary["bytes_pulled"].tolist()
        n_estimated = analysis.summary["n_estimated"].fillna(0).sum()
        analysis.close()
        if mode == "sketch":
            sketched = result.sweep.sketched
            assert sketched.runs == 2 and 0 < sketched.bytes_pulled < sketched.dump_bytes
            assert estimated > 0 and not (tmp_path / mode / ".sketch").exists()
            assert all(0 < b < sketched.dump_bytes for b in pulled) and n_estimated == estimated
            assert not list(standin.host_path("/data/local/tmp/layerdiff/runs").glob("*/dump"))
        else:
            assert result.sweep.sketched is None or not result.sweep.sketched.runs and estimated == 0
    assert answers["sketch"] == answers["full"] and answers["full"][1]


def test_a_single_sketched_run_is_kept_with_its_estimates(standin, monkeypatch, det_model, tmp_path):
    """One configuration alone has no reference: nothing names a layer to pull, the run keeps its estimates,
    the collect succeeds saying so, and the phone's files are removed all the same."""
    from layerdiff.collector.sweep.collect import collect
    from layerdiff.analyzer.formats.dumpfile import DumpFile
    from tests.test_harness_support import host_harness

    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(host_harness()))
    work, args = det_model
    result = collect(args[args.index("--model") + 1], devices=[standin.serial], configs=[("cpu", "low")],
                     inputs=[f"in0={work / 'in0.npy'}"], out=tmp_path / "one", pull="sketch")
    assert result.exit_code == 0
    assert result.sweep.sketched.runs == 1 and "not refined" in result.sweep.sketched.problems[0]
    with DumpFile(result.paths[0]) as dump:
        assert dump.estimated_orders and dump.attrs["sketch_first"]
    assert not list(standin.host_path("/data/local/tmp/layerdiff/runs").glob("*/dump"))
