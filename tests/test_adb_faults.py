"""Each way a phone fails, injected through the stand-in: one clear error line, nothing collected lost."""
from __future__ import annotations

import os

import pytest

from layerdiff.collector.transport.adb import AdbDevice
from layerdiff.collector.transport.adbproto import SyncFailed, SyncSession
from layerdiff.collector.transport.adbserver import connect_server
from layerdiff.collector.transport.devices import DeviceError
from tests.standin.launcher import free_port


def test_no_such_serial_lists_the_ones_there_are(standin):
    with pytest.raises(DeviceError, match=rf"no device '127.0.0.1:1' on adb server .*devices there: {standin.serial} \(device\)"):
        AdbDevice("127.0.0.1:1")


def test_unauthorized_says_accept_the_prompt(standins):
    phone = standins.start(state="unauthorized")
    with pytest.raises(DeviceError, match=rf"^{phone.serial} is unauthorized: accept the RSA prompt on the phone"):
        AdbDevice(phone.serial)


def test_offline_says_reconnect(standins):
    phone = standins.start(state="offline")
    with pytest.raises(DeviceError, match=rf"^{phone.serial} is offline: reconnect"):
        AdbDevice(phone.serial)


def test_no_adb_server_and_no_stray_server_started(adb_server):
    port = free_port()
    with pytest.raises(DeviceError, match=rf"no adb server at 127.0.0.1:{port}: run `adb -P {port} start-server`"):
        AdbDevice("x", server=f"127.0.0.1:{port}")
    with pytest.raises(DeviceError, match="no adb server"):
        connect_server(f"127.0.0.1:{port}")
    import socket
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()  # nobody started one


def test_adb_not_installed(adb_server, monkeypatch):
    monkeypatch.setenv("ADBUTILS_ADB_PATH", "/nonexistent/adb")
    port = free_port()
    with pytest.raises(DeviceError, match="`adb` is not installed"):
        connect_server(f"127.0.0.1:{port}")


def test_not_enough_space_gives_numbers(standin, tmp_path):
    device = AdbDevice(standin.serial)
    standin.set_faults(quota_bytes=2 * 1024 * 1024)
    big = tmp_path / "model.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024))
    with pytest.raises(DeviceError, match=r"not enough space in /data/local/tmp/layerdiff/stage/\w+ for model.bin: "
                                          r"needs 3145728 bytes, \d+ free"):
        device.stage(big, "")


def test_device_refusing_a_push_reports_its_reason(standin, tmp_path):
    device = AdbDevice(standin.serial)
    standin.set_faults(quota_bytes=1024 * 1024)
    local = tmp_path / "f.bin"
    local.write_bytes(os.urandom(2 * 1024 * 1024))
    with SyncSession(device._dev) as sync, pytest.raises(SyncFailed, match="No space left on device"):
        sync.push(local, "/data/local/tmp/f.bin")
    assert not standin.host_path("/data/local/tmp/f.bin").exists()


def test_device_lost_mid_push(standin, tmp_path):
    device = AdbDevice(standin.serial)
    standin.set_faults(die_after_push_bytes=1024 * 1024)
    local = tmp_path / "model.bin"
    local.write_bytes(os.urandom(4 * 1024 * 1024))
    with pytest.raises(DeviceError, match=rf"^{standin.serial}: device lost during the push of model.bin \(now (offline|absent)"):
        device.stage(local, "")
    staged = standin.host_path(f"/data/local/tmp/layerdiff/stage/{device._local_sha256(local)[:16]}/model.bin")
    assert not staged.exists()  # only the temporary name was cut short: no file that looks complete


def test_device_lost_mid_run(standin, fake_harness):
    device = AdbDevice(standin.serial)
    harness = device.stage(fake_harness, "")
    standin.set_faults(die_on_command="fake_harness", die_after_s=0.5)
    with pytest.raises(DeviceError, match=rf"^{standin.serial}: device lost during the harness run \(now (offline|absent)"):
        device.execute([harness, "--out", "/data/local/tmp/layerdiff/runs/x/dump", "--hang"], env={}, deadline_s=60)


def test_device_lost_mid_pull_removes_the_partial_file(standin, fake_harness, tmp_path):
    device = AdbDevice(standin.serial)
    harness = device.stage(fake_harness, "")
    run_dir = device.new_run_dir("pull")
    result = device.execute([harness, "--out", f"{run_dir}/dump", "--tensors", "40", "--elems", "65536"], env={},
                            deadline_s=60)
    assert result.exit_status == 0
    standin.set_faults(die_after_pull_bytes=2 * 1024 * 1024)
    local = tmp_path / "dump"
    with pytest.raises(DeviceError, match=rf"device lost mid-pull of {run_dir}/dump/tensors.bin .*partial file removed"):
        device.fetch_dir(f"{run_dir}/dump", local)
    assert sorted(p.name for p in local.iterdir()) == ["manifest.jsonl"]  # complete file kept, partial gone
    assert (local / "manifest.jsonl").read_bytes() == standin.host_path(f"{run_dir}/dump/manifest.jsonl").read_bytes()


def test_harness_exit_code_and_stderr_line(standin, fake_harness):
    device = AdbDevice(standin.serial)
    harness = device.stage(fake_harness, "")
    result = device.execute([harness, "--exit", "4"], env={}, deadline_s=30)
    assert result.exit_status == 4 and result.stderr.strip().endswith("failing on request with status 4")


def test_push_refused_by_the_device_is_one_line(standin, tmp_path):
    device = AdbDevice(standin.serial)
    local = tmp_path / "model.bin"
    local.write_bytes(b"x" * 1000)
    digest = device._local_sha256(local)
    blocker = standin.host_path(f"/data/local/tmp/layerdiff/stage/{digest[:16]}/model.bin.partial")
    blocker.mkdir(parents=True)  # the device cannot write its temporary file
    with pytest.raises(DeviceError, match=rf"^{standin.serial}: push of model.bin to /data/local/tmp/layerdiff/stage/"
                                          rf"\w+/model.bin failed: .*Is a directory$"):
        device.stage(local, "")
