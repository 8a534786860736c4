"""Ctrl-C arriving while a stand-in phone is mid-push, mid-run or mid-pull: the sweep stops within
seconds, the run is `interrupted`, completed runs are kept and nothing half-written is left.

The phone is real (the stand-in over the real adb server); the Ctrl-C is a real SIGINT to this
process, sent the moment the collector enters the step under test."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from layerdiff.collector.transport.adb import AdbDevice
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.sweep.plan import SweepPlan
from layerdiff.collector.sweep.execute import run_sweep
from tests.conftest import MODELS


class InterruptingPhone(AdbDevice):
    """An AdbDevice that sends this process SIGINT as it enters `step` during its second run."""

    def __init__(self, serial: str, step: str) -> None:
        super().__init__(serial)
        self.step, self.finished_runs, self.sent_at = step, 0, 0.0

    def _maybe_interrupt(self, step: str) -> None:
        if step == self.step and self.finished_runs >= 1 and not self.sent_at:
            self.sent_at = time.monotonic()
            os.kill(os.getpid(), signal.SIGINT)

    def stage(self, local, remote_dir):
        self._maybe_interrupt("push")
        return super().stage(local, remote_dir)

    def execute(self, argv, **kw):
        if "--probe" not in argv:
            self._maybe_interrupt("run")
        return super().execute(argv, **kw)

    def fetch_dir(self, remote_dir, local_dir):
        self._maybe_interrupt("pull")
        try:
            return super().fetch_dir(remote_dir, local_dir)
        finally:
            self.finished_runs += 1


@pytest.mark.parametrize("step", ["push", "run", "pull"])
def test_ctrl_c_mid_push_run_or_pull(standin, fake_harness, monkeypatch, tmp_path, step):
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))
    assert threading.current_thread() is threading.main_thread()
    phone = InterruptingPhone(standin.serial, step)
    inputs = [InputSet(f"random{k}", {"data": np.random.default_rng(k).random((1, 3, 8, 8), np.float32)}, f"random:{k}")
              for k in range(4)]
    out = tmp_path / "out"
    plan = SweepPlan(devices=[phone], model=resolve_model(MODELS / "convnet.param"), backends=["cpu"], precisions=["high"],
                     inputs=inputs, out_dir=out, deadline_s=60)
    result = run_sweep(plan)
    elapsed = time.monotonic() - phone.sent_at
    assert phone.sent_at, f"the sweep never reached a second {step}"
    print(f"figure: Ctrl-C mid-{step}: sweep stopped {elapsed:.2f}s after the signal")
    assert not [t for t in threading.enumerate() if t.name.startswith("sweep-") and t.is_alive()]  # none left running
    assert result.interrupted and elapsed < 10
    statuses = [r.row.status for r in result.runs]
    assert "interrupted" in statuses and statuses.count("done") >= 1, statuses
    for run in result.runs:
        if run.row.status == "done":
            assert all(p.is_file() for p in run.paths)
    assert not [p for p in out.rglob("*") if p.name.endswith(".partial") or ".layerdiff-fetch-" in p.name]
