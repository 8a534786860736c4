"""`collect devices`: every device of the server, in any state, with facts and advice."""
from __future__ import annotations

import json

from rich.console import Console

from layerdiff.collector.transport.adb import adb_devices
from layerdiff.collector.transport.adbinfo import devices_json, devices_table, list_adb_devices


def test_listing_shows_states_facts_and_gpu_libraries(adb_server, standins, fake_harness, monkeypatch):
    monkeypatch.setenv("LAYERDIFF_HARNESS_X86_64", str(fake_harness))
    full = standins.start(props={"ro.soc.model": "SM8550"}, gles="Adreno (TM) 740")
    no_gpu = standins.start(gpu_libs=[])
    locked = standins.start(state="unauthorized")
    reports = {r.serial: r for r in list_adb_devices([f"127.0.0.1:{adb_server.port}"])}
    assert reports[locked.serial].state == "unauthorized" and "RSA prompt" in reports[locked.serial].advice
    r = reports[full.serial]
    assert (r.soc, r.abis, r.android_release, r.sdk, r.gpu) == ("SM8550", ["x86_64", "x86"], "14", "34", "Adreno (TM) 740")
    assert r.gpu_libs["libOpenCL.so"] == ["/vendor/lib64/libOpenCL.so"] and r.free_bytes > 0
    assert r.backends() == {"ncnn": ["cpu", "opencl", "vulkan"], "mnn": ["cpu", "opencl", "vulkan"]}
    assert reports[no_gpu.serial].gpu_libs == {"libOpenCL.so": [], "libvulkan.so": []}
    assert reports[no_gpu.serial].backends() == {"ncnn": ["cpu"], "mnn": ["cpu"]}  # its probe found no GPU library
    doc = json.loads(json.dumps(devices_json(list(reports.values()))))
    assert {d["serial"] for d in doc["devices"]} >= {full.serial, no_gpu.serial, locked.serial}
    console = Console(width=250, record=True)
    console.print(devices_table(list(reports.values())))
    text = console.export_text()
    assert full.serial in text and "accept the RSA prompt" in text


def test_adb_devices_all_returns_online_devices_only(standins):
    online = standins.start()
    standins.start(state="unauthorized")
    serials = [d.serial for d in adb_devices(["all"])]
    assert online.serial in serials and len(serials) == 1


def test_several_adb_servers_are_listed_and_searched(adb_server, standins, tmp_path):
    """A second, independent adb server (as on another machine) with its own phone."""
    from tests.standin.launcher import AdbServer, StandIn

    local_phone = standins.start()
    other = AdbServer(tmp_path / "other-home").start()
    remote_phone = StandIn.create(tmp_path / "remote-phone").start()
    try:
        other.connect(remote_phone.serial)
        servers = [f"127.0.0.1:{adb_server.port}", f"127.0.0.1:{other.port}"]
        reports = {r.serial: r for r in list_adb_devices(servers, probe=False)}
        assert reports[local_phone.serial].server == servers[0] and reports[remote_phone.serial].server == servers[1]
        [found] = adb_devices([remote_phone.serial], servers)
        assert found.client.port == other.port and found.info().model == "StandIn x86_64"
    finally:
        remote_phone.kill()
        other.kill()
