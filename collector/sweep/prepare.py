"""Get harnesses ready before runs need them: built into the cache and staged on the phones.

Why up front: building the harness for a phone's ABI takes minutes the first time. Done inside a
sweep, that time hides behind the sweep's live display; done here, it gets its own progress
(layerdiff.collector.harness.buildprogress) and a fleet can be warmed ahead of time with `collect prepare`.
"""
from __future__ import annotations

from dataclasses import dataclass

from layerdiff.errors import LayerdiffError
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.transport.devices import Device


@dataclass
class Prepared:
    """The outcome for one device, engine and backend."""

    serial: str
    engine: str
    backend: str
    ok: bool
    detail: str


def prepare_devices(devices: list[Device], engines: list[str], backends: list[str]) -> list[Prepared]:
    """Build (once per ABI, engine and backend) and stage the harness on every device."""
    results = []
    for device in devices:
        for engine in engines:
            for backend in backends:
                try:
                    invocation = device.prepare_harness(engine, backend)
                    results.append(Prepared(device.serial, engine, backend, True, invocation.description))
                except LayerdiffError as err:
                    results.append(Prepared(device.serial, engine, backend, False, str(err)))
    return results


def build_phone_harnesses(devices: list[Device], engine: str, backends: list[str]) -> None:
    """Build the harness binaries a sweep's phones will need, before the sweep's display starts.

    Only builds (no device I/O beyond the ABI the device already reported); anything that cannot
    be built is left for the run itself to report, one line per run, as before.
    """
    from layerdiff.collector.harness.build import HarnessError
    from layerdiff.collector.engines.phoneharness import harness_for

    prebuild = ENGINES[engine].prebuild if engine in ENGINES else None
    if prebuild is not None:  # the engine's own native harness (e.g. ggml), built by its folder
        prebuild(devices)
        return
    for device in devices:
        try:
            info = device.info()
        except LayerdiffError:
            continue  # an unreachable phone is reported by its runs
        if info.kind != "adb" or not info.abi:
            continue
        for backend in backends:
            try:
                harness_for(info.abi, engine, backend)
            except HarnessError:
                continue

