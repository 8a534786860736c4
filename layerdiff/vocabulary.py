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
BACKEND_NOTES = {"gpu": "litert: WebGPU"}  # gpu: LiteRT's GPU accelerator (WebGPU over Vulkan on the host)


def backends_help(backends: tuple[str, ...] = BACKENDS) -> str:
    """`cpu, opencl, vulkan, gpu (litert: WebGPU)`: the backends as `--backend` help lists them."""
    return ", ".join(f"{b} ({BACKEND_NOTES[b]})" if b in BACKEND_NOTES else b for b in backends)


# Engines whose cpu/high run is a golden (an fp32 framework reference, not a mobile engine): with no
# --ref the analyzer takes such a run as the reference before any mobile engine's cpu/high run.
GOLDEN_ENGINES = ("onnxruntime", "paddle")

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


# MNN's MNNForwardType (include/MNN/MNNForwardType.h, MNN 3.x) -> our backend name. 13 is
# MNN_FORWARD_CPU_EXTENSION: MNN's own CPU extension backend (Arm82 fp16 on ARMv8.2 cores, AVX2/AVX512
# on x86), chosen internally when the user asks for MNN_FORWARD_CPU; the work still runs on the CPU.
# 8-11 (MNN_FORWARD_USER_*) and 12 (MNN_FORWARD_ALL) name no backend: shown as their number.
MNN_FORWARD_CODES = {"MNN_FORWARD_CPU": 0, "MNN_FORWARD_METAL": 1, "MNN_FORWARD_CUDA": 2, "MNN_FORWARD_OPENCL": 3,
                     "MNN_FORWARD_AUTO": 4, "MNN_FORWARD_NN": 5, "MNN_FORWARD_OPENGL": 6, "MNN_FORWARD_VULKAN": 7,
                     "MNN_FORWARD_CPU_EXTENSION": 13}
MNN_FORWARD_TYPES = {0: "cpu", 1: "metal", 2: "cuda", 3: "opencl", 4: "auto", 5: "nn", 6: "opengl", 7: "vulkan",
                     13: "cpu"}
MNN_FORWARD_CPU_EXTENSION = MNN_FORWARD_CODES["MNN_FORWARD_CPU_EXTENSION"]
# MNN's BackendConfig::PrecisionMode as MNN's tools print it (`precision:<p>`).
MNN_PRECISION_MODES = {0: "normal", 1: "high", 2: "low", 3: "low_bf16"}

# ncnn's Option flags per precision, as every ncnn runner sets them (the host engine, the C++ harness
# in device_scripts/harness/src/ncnn_engine.cpp, samples/runners.py; tests/test_vocabulary.py reads
# the C++ against this). Facts from ncnn 1.0.20261020 (src/option.h, src/net.cpp): `normal` leaves
# ncnn's defaults (fp16 packed/storage/arithmetic on, bf16 off); the CPU uses fp16 storage only where
# the core has it (asimdhp, or vfpv4 storage on 32-bit ARM) and bf16 storage otherwise, so `low` asks
# for exactly one of the two; `use_fp16_uniform` and `use_bf16_packed` are read by Vulkan only, and
# ncnn itself clears `use_fp16_uniform` when fp16 arithmetic is off.
NCNN_FP16_FLAGS = ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic", "use_fp16_uniform")
NCNN_BF16_FLAGS = ("use_bf16_storage", "use_bf16_packed")


def ncnn_precision_flags(precision: str, *, fp16: bool) -> dict[str, bool]:
    """The ncnn Option flags for `precision`; `fp16`: the backend has fp16 (Vulkan, or a CPU with fp16 storage)."""
    if precision == "high":
        return {flag: False for flag in NCNN_FP16_FLAGS + NCNN_BF16_FLAGS}
    if precision == "low":
        return {**{flag: fp16 for flag in NCNN_FP16_FLAGS}, **{flag: not fp16 for flag in NCNN_BF16_FLAGS}}
    return {}


def ncnn_cpu_has_fp16(ncnn) -> bool:
    """Whether ncnn's CPU kernels use fp16 storage on this core (the rule of ncnn's src/net.cpp)."""
    vfpv4 = getattr(ncnn, "cpu_support_arm_vfpv4", None)
    return bool(ncnn.cpu_support_arm_asimdhp()) or bool(vfpv4 and vfpv4() and _is_arm32())


def _is_arm32() -> bool:
    import platform

    machine = platform.machine().lower()
    return machine.startswith("armv") or machine == "arm"  # armv7l, armv8l (32-bit); aarch64/arm64 are not


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
