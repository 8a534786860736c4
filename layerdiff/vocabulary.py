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


class Observability(StrEnum):
    """Whether a tensor of a run holds a value this run computed (a dump's `observability` record and its
    `not_observable` entries' `state`: analyzer/FORMATS.md §1, docs/fidelity.md). Only `WRITTEN` tensors
    are dumped; the others are listed, and told from facts (a sentinel fill, the engine's own record),
    never from the values."""

    WRITTEN = "written"  # the engine wrote it in this run (the record says how that is known)
    NEVER_WRITTEN = "never_written"  # its buffer still held the sentinel the engine filled it with
    FUSED_AWAY = "fused_away"  # the engine's own record: fused into another op, no buffer of its own
    STALE = "stale"  # the engine's own record: its buffer held another tensor's bytes when read
    NOT_READABLE = "not_readable"  # held where the engine's API cannot read it (device memory)


# How a run knows the state of its tensors (`observability.checked_by`).
OBSERVABILITY_EVIDENCE = ("sentinel", "engine_record", "direct_read")

# What the report says of a tensor in each state (the reason of an unmatched or `not_observable` layer).
OBSERVABILITY_WORDS = {
    Observability.NEVER_WRITTEN: "not observable on this backend: never written in this run (its buffer still held "
                                 "the sentinel filled in before the run)",
    Observability.FUSED_AWAY: "not observable on this backend: fused into another op (the engine's own record), "
                              "no value of its own",
    Observability.STALE: "not observable on this backend: its buffer held another tensor's bytes when read "
                         "(a stale buffer, the engine's own record)",
    Observability.NOT_READABLE: "not observable on this backend: held in device memory the engine's API cannot read",
}
