"""Ctrl-C during a sketch-first sweep on a phone (the stand-in, its link throttled so the sweep takes a while):
the runs written keep their dumps on the phone and their summaries in `.sketch/` (a run cut short keeps
neither), `collect` says so and exits 130; the same command run again refines them and removes both."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.faults.support import REPO
from tests.faults.test_interrupt import EXIT_LIMIT_S, _rows, _start, _wait_for, assert_clean, interrupt
from tests.sketch_support import det_model  # noqa: F401 (fixture: PP-OCRv4 det as ncnn, and its input)
from tests.test_harness_support import host_harness

PHONE_RUNS = "/data/local/tmp/layerdiff/runs"


def test_ctrl_c_in_a_sketch_first_sweep_keeps_what_a_rerun_refines(standins, det_model, tmp_path):
    standin = standins.start(link_bytes_per_s=1.5e6)
    work, args = det_model
    out = tmp_path / "out"
    command = ["--device", standin.serial, "--model", args[args.index("--model") + 1], "--config",
               "cpu/high,cpu/low,cpu/normal", "-i", f"in0={work / 'in0.npy'}", "--sketch", "--no-report", "-o", str(out)]
    env = {"LAYERDIFF_HARNESS_X86_64": str(host_harness())}
    proc = _start(command, env)
    _wait_for(lambda: any(r["status"] == "done" for r in _rows(out)) or proc.poll() is not None, 300,
              "a run written")
    code, elapsed, err = interrupt(proc)
    if code == 0:
        pytest.skip("the sweep finished before the interrupt arrived")
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and elapsed < EXIT_LIMIT_S, err[-3000:]
    assert_clean(out)
    waiting = sorted((out / ".sketch").iterdir()) if (out / ".sketch").is_dir() else []
    assert waiting, "a written sketch-first run keeps its summaries until it is refined"
    for keep in waiting:  # each one: its HDF5 written, where its dump is on the phone, that dump still there
        assert (out / f"{keep.name}.h5").is_file()
        remote = json.loads((keep / "remote.json").read_text())
        assert standin.host_path(remote["remote_dir"]).is_dir()
    assert f"{len(waiting)} sketch-first runs are not refined yet" in err
    done = {r["files"] for r in _rows(out) if r["status"] == "done"}
    assert {f"{keep.name}.h5" for keep in waiting} <= done
    on_phone = list(standin.host_path(PHONE_RUNS).glob("*/dump"))
    assert len(on_phone) == len(waiting)  # the run cut short left nothing on the phone

    resumed = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", *command], capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "runs pulled sketch-first" in resumed.stderr
    assert not (out / ".sketch").exists()
    assert not list(standin.host_path(PHONE_RUNS).glob("*/dump"))
    assert all(r["status"] == "done" for r in _rows(out))
