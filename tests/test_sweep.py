"""Sweeps over a fleet of stand-in phones on the real adb server: skip, isolate failures, resume, Ctrl-C."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from tests.conftest import MODELS

COLLECT = [sys.executable, "-m", "layerdiff.collector.cli"]


@pytest.fixture
def fleet_env(fake_harness, monkeypatch):
    """The fake harness stands in for the phone build (its --probe checks the phone's GPU libraries)."""
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))
    return dict(os.environ)


def _sweep(out, *extra, env, timeout=300):
    args = COLLECT + ["--device", "all", "--exclude", "local,arm64", "--model", str(MODELS / "convnet.param"), "--backend", "cpu,opencl",
                      "--precision", "high,low", "-o", str(out), *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def _index(out):
    with open(out / "index.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _by_serial(rows):
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["serial"], []).append(row)
    return out


def test_fleet_sweep_skips_what_a_phone_cannot_do_survives_a_lost_phone_and_resumes(standins, fleet_env, tmp_path):
    good = standins(2)
    no_gpu = standins.start(gpu_libs=[])
    doomed = standins.start()
    doomed.set_faults(die_on_command=r"--precision low", die_after_s=0.2)  # unplugged during its 2nd run
    out = tmp_path / "sweep"
    first = _sweep(out, env=fleet_env)
    assert first.returncode == 1, first.stderr
    rows = _by_serial(_index(out))
    for phone in good:
        assert sorted(r["status"] for r in rows[phone.serial]) == ["done"] * 4
    assert sorted(r["status"] for r in rows[no_gpu.serial]) == ["done", "done", "skipped", "skipped"]
    assert all("libOpenCL.so not found" in r["reason"] for r in rows[no_gpu.serial] if r["status"] == "skipped")
    lost = [r for r in rows[doomed.serial] if r["status"] == "failed"]
    assert lost and all(r["status"] in ("done", "failed") for r in rows[doomed.serial])
    assert any("device lost" in r["reason"] or "lost" in r["reason"] for r in lost)
    for phone in good + [no_gpu]:
        files = list((out / phone.serial.replace(":", "_")).glob("*.h5"))
        assert len(files) == (4 if phone in good else 2)
    # the lost phone's runs stay recorded; the others are not run again
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.h5")}
    again = _sweep(out, env=fleet_env)
    assert again.returncode == 3  # the lost phone is gone; of the rest nothing failed, OpenCL was skipped
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.h5")} == before
    rows_again = _by_serial(_index(out))
    assert [r["status"] for r in rows_again[doomed.serial]] == [r["status"] for r in rows[doomed.serial]]
    assert "already collected" in again.stderr


def test_ctrl_c_leaves_a_consistent_index_and_a_rerun_finishes_the_rest(standins, fleet_env, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_FAKE_HARNESS_SLEEP", "0.4")  # each run takes ~1.5 s on the phone
    env = dict(os.environ)
    standins(2)
    out = tmp_path / "sweep"
    args = COLLECT + ["--device", "all", "--exclude", "local,arm64", "--model", str(MODELS / "convnet.param"), "--backend", "cpu,opencl",
                      "--precision", "high,normal,low", "-o", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (out / "index.csv").exists() and any(r["status"] == "done" for r in _index(out)):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    rows = _index(out)
    statuses = {r["status"] for r in rows}
    assert "running" not in statuses and statuses <= {"done", "interrupted", "planned"}
    assert "re-run the same command to resume" in stderr
    assert not list(out.rglob("*.partial"))
    done = [r for r in rows if r["status"] == "done"]
    assert done and len(done) < len(rows)
    for row in done:
        with DumpFile(out / row["files"]) as dump:
            assert dump.complete
    kept = {r["files"]: (out / r["files"]).stat().st_mtime_ns for r in done}
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert rerun.returncode == 0, rerun.stderr
    final = _index(out)
    assert all(r["status"] == "done" for r in final) and len(final) == len(rows)
    assert {f: (out / f).stat().st_mtime_ns for f in kept} == kept
