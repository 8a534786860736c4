"""The words layerdiff's files and commands share, each written once.

Every module, the CLI help and the docs read these tables instead of keeping copies (copies drift).
Values are exactly what the files carry, so reading and writing are unchanged.
"""
from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """A planned run's state in a sweep's `index.csv` (`status` column) and in a run's outcome."""

    PLANNED = "planned"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"


# Backends in the order help texts and reports list them. An engine names the ones it knows
# (collector/engines/<engine>/__init__.py); `collect --backend` accepts every one some engine knows.
BACKENDS = ("cpu", "opencl", "vulkan", "gpu")
HARNESS_BACKENDS = BACKENDS[:3]  # what the harness command line (C++ and the Python host engines) accepts by default


def backends_help(backends: tuple[str, ...] = BACKENDS, notes: dict[str, str] | None = None) -> str:
    """`cpu, opencl, vulkan, gpu (<engine>: WebGPU)`: the backends as `--backend` help lists them, with the
    note an engine declares for a backend only it has (collector/engines: `ENGINE_BACKEND_NOTES`)."""
    notes = notes or {}
    return ", ".join(f"{b} ({notes[b]})" if b in notes else b for b in backends)


# Requested precisions from loosest to strictest: `high` is every engine's fp32 reference.
PRECISIONS = ("low", "normal", "high")

# Android ABI names layerdiff builds for; a host build runs as the host's own ABI.
PHONE_ABIS = ("arm64-v8a", "armeabi-v7a")
MACHINE_ABI = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64-v8a", "arm64": "arm64-v8a"}


def host_abi(machine: str | None = None) -> str:
    """The Android-style ABI name of the host (`platform.machine()` mapped; unknown names unchanged)."""
    import platform

    machine = (machine if machine is not None else platform.machine()).lower()
    return MACHINE_ABI.get(machine, machine)
