"""Device-lab endpoints: a phone at `host:port` that layerdiff `adb connect`s through the real adb server.

The stand-in phone listens on 127.0.0.1:PORT and speaks the device side of the ADB protocol, which is
exactly what a lab's endpoint is to the adb server; nothing here is connected by the test itself.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.sweep.collect import build_plan, collect, prepare
from layerdiff.collector.sweep.execute import run_sweep
from layerdiff.collector.transport import endpoints
from layerdiff.collector.sweep.index import read_index
from layerdiff.collector.transport.adbinfo import list_adb_devices
from layerdiff.errors import DeviceError
from layerdiff.collector.transport.endpoints import is_endpoint
from tests.conftest import MODELS
from tests.standin.launcher import AdbServer, StandIn, free_port

INPUTS = [f"random:{k}" for k in range(4)]


@pytest.fixture(autouse=True)
def fake_phone_harness(fake_harness, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))


def _collect(out: Path, devices: list[str], **options):
    return collect(MODELS / "convnet.param", devices=devices, inputs=INPUTS, out=out, deadline=60, **options)


def _plan(devices: list[str], out: Path):
    plan, _errors = build_plan(devices=devices, model=MODELS / "convnet.param", engine="auto", backends=["cpu"],
                               precisions=["high"], inputs=INPUTS, out=out, threads=1, repeat=1, deadline=60,
                               layers=None, max_bytes=None, exclude=[], adb_servers=[], keep=False, force=False)
    prepare(plan)
    return plan


class ArmAfterTwo:
    """A sweep observer that makes the phone die 0.3 s into its harness run once two runs are done."""

    def __init__(self, phone: StandIn) -> None:
        self.phone, self.done = phone, 0

    def started(self, run) -> None:
        pass

    def layer(self, run, k, n, op) -> None:
        pass

    def finished(self, run) -> None:
        if run.row.status == "done":
            self.done += 1
            if self.done == 2:
                self.phone.set_faults(die_on_command=r"--out ", die_after_s=0.3)


def _statuses(result) -> dict[str, list[str]]:
    by_serial: dict[str, list[str]] = {}
    for run in result.sweep.runs:
        by_serial.setdefault(run.device.serial, []).append(f"{run.row.status} {run.row.reason}".strip())
    return by_serial


def test_endpoint_syntax():
    assert is_endpoint("127.0.0.1:5555") and is_endpoint("lab-7.example.com:7401") and is_endpoint("[::1]:5555")
    assert not any(map(is_endpoint, ["R58M1234", "arm64:cortex-a55", "local", "host:0", "host:99999", ":5555",
                                     "emulator-5554", "a b:5555"]))


def test_connect_needs_host_and_port(adb_server):
    from layerdiff.collector.sweep.plan import resolve_devices
    from layerdiff.errors import UsageError

    with pytest.raises(UsageError, match="--connect 'stf.example.com': expected the HOST:PORT"):
        resolve_devices(["local"], connect=["stf.example.com"])


def test_endpoint_and_a_second_adb_server_in_one_sweep(adb_server, standins, tmp_path):
    """`--device HOST:PORT` connects the endpoint through the first server; a phone of another server
    runs in the same sweep; `collect devices` then lists the endpoint with the endpoint as serial."""
    endpoint = standins.start(connect=False)
    assert endpoint.serial not in adb_server.devices()
    other = AdbServer(tmp_path / "other-home").start()
    remote = StandIn.create(tmp_path / "remote-phone").start()
    try:
        other.connect(remote.serial)
        servers = [f"127.0.0.1:{adb_server.port}", f"127.0.0.1:{other.port}"]
        result = _collect(tmp_path / "out", [endpoint.serial, remote.serial], adb_servers=servers)
        assert result.exit_code == 0, _statuses(result)
        assert adb_server.devices()[endpoint.serial] == "device"  # connected by layerdiff, through its server
        assert endpoint.serial not in other.devices()
        index = read_index(tmp_path / "out")
        for phone in (endpoint, remote):
            rows = [row for row in index.values() if row.serial == phone.serial]
            assert [row.status for row in rows] == ["done"] * len(INPUTS)
            for row in rows:
                with DumpFile(tmp_path / "out" / row.files[0]) as dump:
                    assert dump.complete and len(dump.layers) > 0
                    assert dump.attrs["device_serial"] == phone.serial
        listed = {r.serial: r for r in list_adb_devices(servers, probe=False)}
        assert listed[endpoint.serial].state == "device" and listed[endpoint.serial].server == servers[0]
        assert listed[endpoint.serial].model == "StandIn x86_64"
    finally:
        remote.kill()
        other.kill()


def test_connect_option_adds_the_endpoint_to_device_all_and_to_the_listing(adb_server, standins, tmp_path):
    endpoint = standins.start(connect=False)
    listed = {r.serial: r.state for r in list_adb_devices(probe=False, connect=[endpoint.serial])}
    assert listed[endpoint.serial] == "device"
    adb_server.disconnect(endpoint.serial)
    adb_server.wait_state(endpoint.serial, None)  # gone from the list again
    result = _collect(tmp_path / "out", ["all"], connect=[endpoint.serial], exclude=["local", "arm64"])
    assert result.exit_code == 0, _statuses(result)
    assert _statuses(result)[endpoint.serial] == ["done"] * len(INPUTS)
    assert [d.serial for d in result.plan.devices].count(endpoint.serial) == 1  # --connect and `all` both name it


def test_endpoint_dropped_mid_sweep_is_reconnected_and_the_run_retried(adb_server, standins, tmp_path, monkeypatch):
    """The endpoint's process dies in the middle of a harness run and comes back on the same address
    a moment later (a lab proxy restarting): every run ends done, none is marked failed."""
    monkeypatch.setenv("LAYERDIFF_FAKE_HARNESS_SLEEP", "0.3")  # runs last ~1 s: the drop 0.3 s in lands mid-run
    endpoint = standins.start(connect=False)
    restarts: list[float] = []

    def drop_once_then_come_back() -> None:
        while not (Path(endpoint.config.state) / "faults.json").exists():
            time.sleep(0.05)
        while endpoint.alive:
            time.sleep(0.05)
        (Path(endpoint.config.state) / "faults.json").unlink()
        time.sleep(1.0)
        endpoint.start()
        restarts.append(time.monotonic())

    watcher = threading.Thread(target=drop_once_then_come_back, daemon=True)
    watcher.start()
    plan = _plan([endpoint.serial], tmp_path / "out")
    started = time.monotonic()
    result = run_sweep(plan, observer=ArmAfterTwo(endpoint))
    watcher.join(timeout=30)
    assert len(restarts) == 1, "the endpoint never dropped"
    assert [run.row.status for run in result.runs] == ["done"] * len(INPUTS), \
        [(r.row.status, r.row.reason) for r in result.runs]
    assert adb_server.devices()[endpoint.serial] == "device"
    on_file = read_index(tmp_path / "out")
    assert sorted(row.status for row in on_file.values()) == ["done"] * len(INPUTS)
    for run in result.runs:
        with DumpFile(run.paths[0]) as dump:
            assert dump.complete and len(dump.layers) > 0
    print(f"figure: endpoint dropped mid-run, back after 1 s: {len(INPUTS)} of {len(INPUTS)} runs done, "
          f"sweep {time.monotonic() - started:.1f} s")


def test_endpoint_that_stays_away_fails_its_runs_after_the_reconnect_deadline(standins, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_FAKE_HARNESS_SLEEP", "0.3")
    monkeypatch.setattr(endpoints, "RECONNECT_DEADLINE_S", 3.0)
    endpoint = standins.start(connect=False)
    plan = _plan([endpoint.serial], tmp_path / "out")
    started = time.monotonic()
    result = run_sweep(plan, observer=ArmAfterTwo(endpoint))
    took = time.monotonic() - started
    statuses = [run.row.status for run in result.runs]
    assert statuses == ["done", "done", "failed", "failed"], [(r.row.status, r.row.reason) for r in result.runs]
    dropped = result.runs[2].row.reason
    assert endpoint.serial in dropped and "lab session" in dropped and "within 3 s of reconnecting" in dropped, dropped
    assert "device lost earlier in the sweep" in result.runs[3].row.reason
    for run in result.runs[:2]:
        with DumpFile(run.paths[0]) as dump:
            assert dump.complete
    print(f"figure: endpoint gone for good: 2 runs kept, 2 failed, sweep {took:.1f} s with a 3 s reconnect deadline")


def test_refused_endpoint_is_one_line_and_exit_1(adb_server, tmp_path):
    nobody = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(adb_server.port)}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.cli", "--device", nobody, "--model",
                           str(MODELS / "convnet.param"), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert nobody in lines[0] and f"adb -P {adb_server.port} connect {nobody}" in lines[0], lines[0]
    assert nobody not in adb_server.devices()


def test_unauthorized_endpoint_says_to_add_the_servers_key(adb_server, standins, tmp_path):
    locked = standins.start(connect=False, auth="reject")
    with pytest.raises(DeviceError) as caught:
        _collect(tmp_path / "out", [locked.serial])
    line = str(caught.value)
    assert "\n" not in line and locked.serial in line and "unauthorized" in line and "adbkey.pub" in line, line
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.h5"))
