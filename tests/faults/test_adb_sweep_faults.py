"""Phones failing in the middle of a sweep, through the stand-in (tests/standin/faults.py), with the
fake harness so no build is waited on: killed mid-push, mid-run, mid-pull; offline and unauthorized
mid-run; 8 phones with one dying. Figures: completed runs lost (always 0), partial runs marked."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.transport.adb import AdbDevice
from layerdiff.collector.sweep.index import read_index
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.sweep.plan import SweepPlan
from layerdiff.collector.sweep.execute import run_sweep
from tests.conftest import MODELS

RUNS = 4
FAULT_AFTER = 2  # the fault is armed once this many runs of the device are complete


@pytest.fixture(autouse=True)
def fake_phone_harness(fake_harness, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))


def _inputs(n: int) -> list[InputSet]:
    return [InputSet(f"random{k}", {"data": np.random.default_rng(k).random((1, 3, 8, 8), np.float32)}, f"random:{k}")
            for k in range(n)]


def _plan(devices, out: Path, runs: int = RUNS, **options) -> SweepPlan:
    return SweepPlan(devices=devices, model=resolve_model(MODELS / "convnet.param"), backends=["cpu"],
                     precisions=["high"], inputs=_inputs(runs), out_dir=out, deadline_s=60, **options)


class ArmAfter:
    """A sweep observer that arms a fault once a device has finished `after` runs."""

    def __init__(self, serial: str, after: int, arm) -> None:
        self.serial, self.after, self.arm = serial, after, arm
        self.done = 0
        self._lock = threading.Lock()

    def started(self, run) -> None:
        pass

    def layer(self, run, k, n, op) -> None:
        pass

    def finished(self, run) -> None:
        with self._lock:
            if run.device.serial == self.serial and run.row.status == "done":
                self.done += 1
                if self.done == self.after:
                    self.arm()


def _check(result, out: Path, serial: str) -> tuple[int, int]:
    """Completed runs are intact on disk and in the index; the broken one is marked. (done, failed)."""
    rows = [r for r in result.runs if r.device.serial == serial]
    done = [r for r in rows if r.row.status == "done"]
    failed = [r for r in rows if r.row.status == "failed"]
    assert len(done) == FAULT_AFTER, [(r.row.status, r.row.reason) for r in rows]
    assert len(failed) == RUNS - FAULT_AFTER and all(serial in r.row.reason or "lost" in r.row.reason for r in failed)
    for run in done:
        for path in run.paths:
            with DumpFile(path) as dump:
                assert dump.complete and len(dump.layers) > 0
    index = read_index(out)
    on_file = sorted(r.status for r in index.values() if r.serial == serial)
    assert on_file == sorted(r.row.status for r in rows)  # index.csv says the same
    assert not [p for p in out.rglob("*") if p.name.endswith(".partial") or ".layerdiff-fetch-" in p.name]
    return len(done), len(failed)


@pytest.mark.parametrize("fault, match", [
    ({"die_after_push_bytes": 64}, "push"),
    ({"die_on_command": r"--out ", "die_after_s": 0.3}, "harness run"),
    ({"die_after_pull_bytes": 64}, "pull"),
])
def test_phone_killed_mid_push_run_or_pull(standins, tmp_path, fault, match, monkeypatch):
    if match == "harness run":  # runs last ~1 s, so the kill 0.3 s in lands mid-run however fast the machine
        monkeypatch.setenv("LAYERDIFF_FAKE_HARNESS_SLEEP", "0.3")
    phone = standins.start()
    out = tmp_path / "out"
    observer = ArmAfter(phone.serial, FAULT_AFTER, lambda: phone.set_faults(**fault))
    started = time.monotonic()
    result = run_sweep(_plan([AdbDevice(phone.serial)], out), observer=observer)
    done, failed = _check(result, out, phone.serial)
    broken = next(r for r in result.runs if r.row.status == "failed")
    assert match in broken.row.reason, broken.row.reason
    print(f"figure: killed mid-{match}: {done} completed runs kept (0 lost), {failed} marked failed, "
          f"{time.monotonic() - started:.1f}s")


@pytest.mark.parametrize("state", ["offline", "unauthorized"])
def test_phone_turning_offline_or_unauthorized_mid_run_then_resume(standins, adb_server, tmp_path, state, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_FAKE_HARNESS_SLEEP", "0.3")  # runs last ~1 s: the drop 0.3 s in lands mid-run
    phone = standins.start()
    out = tmp_path / "out"

    def turn() -> None:  # the phone drops its connection during the next run and comes back locked/offline
        phone.set_faults(die_on_command=r"--out ", die_after_s=0.3)

    result = run_sweep(_plan([AdbDevice(phone.serial)], out), observer=ArmAfter(phone.serial, FAULT_AFTER, turn))
    _check(result, out, phone.serial)
    phone.kill()
    phone.config.auth = "reject" if state == "unauthorized" else "accept"
    phone.config.mode = "offline" if state == "offline" else "device"
    (Path(phone.config.state) / "faults.json").unlink(missing_ok=True)
    phone.start()
    adb_server.run("connect", phone.serial)
    adb_server.wait_state(phone.serial, state)
    with pytest.raises(Exception, match=f"{state}"):
        AdbDevice(phone.serial)
    # the phone is back to normal: the same sweep resumes, completed runs untouched
    kept = {p: p.stat().st_ino for run in result.runs for p in run.paths if run.row.status == "done"}
    phone.kill()
    phone.config.auth, phone.config.mode = "accept", "device"
    phone.start()
    adb_server.disconnect(phone.serial)
    adb_server.connect(phone.serial)
    again = run_sweep(_plan([AdbDevice(phone.serial)], out, retry_failed=True))
    assert all(r.row.status == "done" for r in again.runs), [(r.row.status, r.row.reason) for r in again.runs]
    assert {p: p.stat().st_ino for p in kept} == kept
    print(f"figure: {state} mid-run: {len(kept)} completed runs kept, resume completed {RUNS - len(kept)}")


def test_eight_phones_one_dying(standins, tmp_path):
    phones = standins(8)
    doomed = phones[3]
    out = tmp_path / "out"
    observer = ArmAfter(doomed.serial, FAULT_AFTER, lambda: doomed.set_faults(die_on_command=r"--out ", die_after_s=0.2))
    started = time.monotonic()
    result = run_sweep(_plan([AdbDevice(p.serial) for p in phones], out), observer=observer)
    elapsed = time.monotonic() - started
    for phone in phones:
        rows = [r for r in result.runs if r.device.serial == phone.serial]
        if phone is doomed:
            _check(result, out, phone.serial)
        else:
            assert [r.row.status for r in rows] == ["done"] * RUNS, [(r.row.status, r.row.reason) for r in rows]
    done = sum(r.row.status == "done" for r in result.runs)
    assert done == 7 * RUNS + FAULT_AFTER
    print(f"figure: 8 phones, one dying after {FAULT_AFTER} runs: {done}/{8 * RUNS} done, 0 completed lost, {elapsed:.1f}s")
