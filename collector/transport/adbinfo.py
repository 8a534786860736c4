"""`collect devices`: every device of one or more adb servers, with what a run would need to know.

One row per device in any state; devices that are not online say what to do about it. Facts come
from one `getprop`, one `ls` of the vendor/system lib dirs, `df` of /data/local/tmp and, when a
harness binary for the phone's ABI is already built, its `--probe` (never a build from here).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field

from rich.table import Table

from layerdiff.collector.transport.adb import AdbDevice
from layerdiff.collector.transport.adbserver import STATE_ADVICE, connect_server, list_devices
from layerdiff.collector.transport.devices import DeviceError, DeviceInfo
from layerdiff.collector.transport.endpoints import connect_endpoint
from layerdiff.collector.transport.probe import probe_document
from layerdiff.errors import LayerdiffError
from layerdiff.safetext import terminal_cell
from layerdiff.collector.engines import ARM64_ENGINES, PHONE_ENGINES

GPU_LIB_DIRS = ("/vendor/lib64", "/system/vendor/lib64", "/system/lib64", "/vendor/lib", "/system/lib")
GPU_LIBS = ("libOpenCL.so", "libvulkan.so")
TMP_DIR = "/data/local/tmp"


@dataclass
class AdbDeviceReport(DeviceInfo):
    """What `collect devices` shows for one device: its DeviceInfo plus what only a listing checks."""

    kind: str = "adb"
    server: str = ""
    advice: str = ""
    gpu_libs: dict[str, list[str]] = field(default_factory=dict)  # library name -> device paths found
    free_bytes: int | None = None
    probe: dict | None = None
    probe_note: str = ""
    error: str = ""

    def backends(self) -> dict[str, list[str]]:
        """engine -> backends the harness probe says work."""
        engines = (self.probe or {}).get("engines", {})
        return {name: [b for b, v in e.get("backends", {}).items() if v.get("ok")] for name, e in engines.items()}


def find_gpu_libs(device: AdbDevice) -> dict[str, list[str]]:
    """Which of libOpenCL.so / libvulkan.so exist in the usual vendor and system lib dirs."""
    paths = [f"{d}/{lib}" for d in GPU_LIB_DIRS for lib in GPU_LIBS]
    command = f"for f in {' '.join(shlex.quote(p) for p in paths)}; do [ -e \"$f\" ] && echo \"$f\"; done; true"
    _code, out, _err = device.shell(command, "looking for GPU libraries")
    found = {lib: [] for lib in GPU_LIBS}
    for line in out.split():
        found.setdefault(line.rsplit("/", 1)[-1], []).append(line)
    return found


def _cached_harness(abi: str, engine: str):
    """A harness binary for the ABI that exists already (prebuilt or cached build), else None."""
    from layerdiff.collector.engines import ENGINES
    from layerdiff.collector.harness.build import HarnessError, binary_dir, prebuilt_override
    from layerdiff.collector.engines.phoneharness import spec_for

    if ENGINES[engine].phone_harness is not None:  # its own program (ggml): the C++ harness's probe covers the phone
        return None
    try:
        override = prebuilt_override(abi)
        if override:
            return override
        binary = binary_dir(spec_for(abi, engine)) / "layerdiff-harness"
    except HarnessError:
        return None
    return binary if binary.is_file() else None


def probe_harness(device: AdbDevice, abi: str) -> tuple[dict | None, str]:
    """(probe JSON, note): stage an already-built harness and run `--probe` on the phone."""
    for engine in PHONE_ENGINES:
        if _cached_harness(abi, engine) is None:
            continue
        invocation = device.prepare_harness(engine)
        out: list[str] = []
        result = device.execute(invocation.argv + ["--probe"], env=invocation.env, deadline_s=60,
                                on_stdout_line=out.append)
        for line in out:
            if result.exit_status == 0 and line.strip().startswith("{"):
                try:
                    return json.loads(line), ""
                except (ValueError, RecursionError):  # a phone's answer: bad or absurdly nested JSON
                    break
        return None, f"harness --probe failed (status {result.exit_status}): {result.stderr.strip()[-200:]}"
    return None, f"no harness built for {abi} yet (`collect` builds it on first use)"


def describe_device(client, serial: str, state: str, server: str, *, probe: bool = True) -> AdbDeviceReport:
    """Everything we can learn about one device; errors end up in the row, not as exceptions."""
    report = AdbDeviceReport(serial=serial, server=server, state=state)
    if state != "device":
        report.advice = STATE_ADVICE.get(state, "check the phone and the cable")
        return report
    try:
        device = AdbDevice(serial, client=client)
        info = device.info()
        report = AdbDeviceReport(**{**asdict(info), "state": state, "server": server})
        report.abis = info.abis or [info.abi]
        report.gpu_libs = find_gpu_libs(device)
        report.free_bytes = device.free_bytes(TMP_DIR)
        if probe:
            report.probe, report.probe_note = probe_harness(device, info.abi)
    except DeviceError as err:
        report.error = str(err)
    return report


def list_adb_devices(servers: list[str] | None = None, *, probe: bool = True,
                     connect: list[str] | None = None) -> list[AdbDeviceReport]:
    """One report per device on each server (default: the host's server; none is ever started).

    `connect` endpoints (host:port) are `adb connect`ed through the first server first, so they are
    listed with the endpoint as their serial."""
    reports = []
    for position, spec in enumerate(servers or [None]):
        client = connect_server(spec)
        for endpoint in (connect or []) if position == 0 else []:
            connect_endpoint(client, endpoint)
        label = f"{client.host}:{client.port}"
        for entry in list_devices(client):
            reports.append(describe_device(client, entry.serial, entry.state, label, probe=probe))
    return reports


def machine_reports(*, probe: bool = True) -> list[AdbDeviceReport]:
    """The host's own devices, listed before the phones: `local` and the emulated `arm64` core.

    The arm64 probe runs only when its runtime is already prepared (listing never downloads).
    """
    import shutil
    import tempfile

    from layerdiff.collector.transport.arm64 import Arm64Device
    from layerdiff.collector.transport.arm64runtime import QEMU, runtime
    from layerdiff.collector.transport.devices import LocalDevice

    devices: list = [LocalDevice()] + ([Arm64Device()] if shutil.which(QEMU) else [])
    reports, probed = [], []
    for device in devices:
        report = AdbDeviceReport(**{**asdict(device.info()), "server": "the host"})
        report.free_bytes = shutil.disk_usage(tempfile.gettempdir()).free
        if isinstance(device, Arm64Device) and not runtime().ready():
            report.probe_note = "runtime not prepared yet (the first `collect --device arm64` prepares it)"
        elif probe:
            probed.append((device, report))
        reports.append(report)
    for (device, report), (document, note) in zip(probed, _probe_all([d for d, _r in probed])):
        report.probe, report.probe_note = document, note
    return reports


def _probe_all(devices: list) -> list[tuple[dict | None, str]]:
    """Every device's engines probed at once: each `--probe` is a process (2-3 s, the arm64 ones
    under qemu), and one after another they made `collect devices` take 12-23 s."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(device, engine) for device in devices for engine in ARM64_ENGINES]
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        answers = list(pool.map(lambda job: _probe_engine(*job), jobs))
    out = []
    for device in devices:
        engines: dict = {}
        mine = [answer for (d, _e), answer in zip(jobs, answers) if d is device]
        failed = next((note for _doc, note in mine if note), "")
        for document, _note in mine:
            engines.update(document or {})
        out.append((None, failed) if failed else ({"engines": engines}, ""))
    return out


def _probe_engine(device, engine: str) -> tuple[dict | None, str]:
    """One host engine's `--probe` on a machine device: (its engines section, "") or (None, why not).
    A device that keeps answers (the host, the emulated arm64 core) is asked once while they hold
    (layerdiff.collector.transport.probe)."""
    try:
        return probe_document(device, engine).get("engines", {}), ""
    except LayerdiffError as err:
        return None, str(err)


def devices_json(reports: list[AdbDeviceReport]) -> dict:
    """The `--json` document: {"devices": [...]} with every field of every report."""
    return {"devices": [{**asdict(r), "backends": r.backends()} for r in reports]}


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"


def devices_table(reports: list[AdbDeviceReport]) -> Table:
    """The rich table `collect devices` prints."""
    table = Table(title="devices")
    for column in ("serial", "state", "model", "SoC", "ABIs", "Android", "GPU", "OpenCL", "Vulkan",
                   "free space for dumps", "harness backends"):
        table.add_column(column)
    for r in reports:  # every cell a plain Text: what a phone answers is data, never markup
        if r.state != "device" or r.error:
            table.add_row(terminal_cell(r.serial), terminal_cell(r.state), terminal_cell(r.error or r.advice, "yellow"),
                          *[""] * 8)
            continue
        backends = "; ".join(f"{e}: {','.join(b) or '-'}" for e, b in r.backends().items()) or r.probe_note
        phone = r.kind == "adb"
        table.add_row(*map(terminal_cell, (
            r.serial, r.state, r.model, " / ".join(x for x in (r.soc, r.board) if x), ",".join(r.abis),
            f"{r.android_release} (SDK {r.sdk})" if phone else "-", r.gpu or ("?" if phone else "-"),
            *(("yes" if r.gpu_libs.get(lib) else "no") if phone else "-" for lib in GPU_LIBS),
            _gib(r.free_bytes), backends,
        )))
    return table
