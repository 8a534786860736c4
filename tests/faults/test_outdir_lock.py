"""One writer per OUTDIR: two collects into one directory never both succeed."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from layerdiff.collector.run.outdir_lock import OutdirBusyError, OutdirLock
from tests.faults.support import REPO, assert_one_line_error, cli

MODELS = REPO / "samples" / "models"


def test_second_collect_fails_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    with OutdirLock(out):
        started = time.monotonic()
        proc = cli("collect", "--model", str(MODELS / "convnet.mnn"), "--input", "random", "-o", str(out))
        elapsed = time.monotonic() - started
    assert_one_line_error(proc, f"{out} is being written by pid {os.getpid()}")
    assert not (out / "index.csv").exists()
    assert elapsed < 60, elapsed  # figure: refused at once (start-up and planning only), no waiting


def test_lock_is_released_when_holder_dies(tmp_path):
    """The kernel drops the lock with its holder (even kill -9): no stale lock to clean by hand."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from layerdiff.collector.run.outdir_lock import OutdirLock;"
                               f"OutdirLock({str(out)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutdirBusyError, match=f"pid {holder.pid}"):
            OutdirLock(out).acquire()
    finally:
        holder.kill()
        holder.wait()
    with OutdirLock(out):
        pass


@pytest.mark.slow
def test_two_collects_of_different_models_never_both_succeed(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "layerdiff.collector.cli", "--model", str(MODELS / model), "--input", "random",
                               "--repeat", "2", "--no-report", "-o", str(out)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for model in ("convnet.mnn", "deepnet.mnn")]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = [code for code, _ in results]
    assert codes.count(0) == 1, results  # figure: exactly one of the two succeeds
    loser = next(err for code, err in results if code != 0)
    assert "is being written by pid" in loser or "another model" in loser, loser
