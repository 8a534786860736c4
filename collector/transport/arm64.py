"""The `arm64` device: a phone CPU emulated on the host (qemu-user running aarch64 MNN and ncnn).

`--device arm64` is a cortex-a76 (ARMv8.2 with fp16 arithmetic and dotprod, the big core of most
phones since 2019); `--device arm64:CPU` is any qemu CPU model, e.g. `arm64:cortex-a53` for the
fp16-less little cores. The engines are the same host engine modules the `local` device runs, so
the harness command line, runs, sweeps, isolation, inputs and provenance are unchanged; only the
interpreter is the arm64 one from layerdiff.collector.transport.arm64runtime. Files stay on the host (qemu-user
sees the host file system), so staging and fetching are the local device's.
"""
from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from layerdiff.collector.transport.arm64runtime import (DOWNLOAD_MB, PYTHON_VERSION, QEMU, WHEELS, Arm64Runtime, StepSink, check_qemu,
                                   ensure_runtime, runtime, source_dir)
from layerdiff.collector.engines import ARM64_ENGINES, ENGINES
from layerdiff.collector.transport.devices import DeviceError, DeviceInfo, HarnessInvocation, LocalDevice
from layerdiff.collector.transport.probe import engine_code_hash

NAME = "arm64"
ARM_ENGINES = ARM64_ENGINES  # the engines that declare aarch64 wheels (Engine.arm64_wheels; in the runtime's WHEELS)
DEFAULT_CPU = "cortex-a76"
ARMV80_CPUS = ("cortex-a35", "cortex-a53", "cortex-a57", "cortex-a72")  # qemu models without fp16 arithmetic


def is_arm64_name(name: str) -> bool:
    return name == NAME or name.startswith(NAME + ":")


@functools.lru_cache(maxsize=1)
def qemu_cpu_models() -> tuple[str, ...]:
    """The CPU models this qemu-aarch64 emulates (`qemu-aarch64 -cpu help`)."""
    check_qemu()
    out = subprocess.run([QEMU, "-cpu", "help"], capture_output=True, text=True, timeout=30, check=False).stdout
    return tuple(line.split()[0] for line in out.splitlines()[1:] if line.strip())


@functools.lru_cache(maxsize=1)
def qemu_version() -> str:
    out = subprocess.run([QEMU, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    return (out.splitlines() or [""])[0]


class Arm64Device(LocalDevice):
    """The host engines' aarch64 builds on an emulated ARM core (see module docstring)."""

    def __init__(self, cpu: str = DEFAULT_CPU, *, step: StepSink | None = None) -> None:
        super().__init__()
        models = qemu_cpu_models()
        if cpu not in models:
            raise DeviceError(f"arm64:{cpu}: qemu-aarch64 has no such CPU model; use one of {', '.join(models)}")
        self.cpu = cpu
        self.serial = NAME if cpu == DEFAULT_CPU else f"{NAME}:{cpu}"
        self._step = step
        self._runtime: Arm64Runtime | None = None

    @classmethod
    def from_name(cls, name: str) -> "Arm64Device":
        """`arm64` or `arm64:CPU` as given to --device."""
        return cls(name.partition(":")[2] or DEFAULT_CPU)

    def runtime(self) -> Arm64Runtime:
        """The arm64 Python + wheels, built into the cache the first time (with progress via `step`)."""
        if self._runtime is None:
            self._runtime = ensure_runtime(self._step)
        return self._runtime

    def info(self) -> DeviceInfo:
        if self._info is None:
            self._info = DeviceInfo(
                serial=self.serial, kind="qemu", model=f"qemu {self.cpu}", soc=self.cpu,
                board="qemu-user (emulated)", abi="arm64-v8a", abis=["arm64-v8a"],
                extra={"qemu": qemu_version(), "runtime": str(runtime().root)},
            )
        return self._info

    def probe_cache(self, engine: str) -> Path:
        """Where this core's `--probe` answer for `engine` is kept. Under qemu a probe costs ~10 s, and
        its answer cannot change while the runtime (immutable once built) and the engine code stay
        the same, so both are in the file name."""
        return self.runtime().root / "probes" / f"{self.cpu}-{engine}-{engine_code_hash()}.json"

    def unavailable_reason(self, backend: str, reason: str) -> str:
        """Why `backend` cannot run here, true for an emulated phone: qemu-user emulates the CPU
        only, so no GPU driver of the host (lavapipe included) can serve the aarch64 engines."""
        if backend == "cpu":
            return reason
        return (f"the emulated arm64 device has no GPU (qemu-user emulates the CPU only, so the host's "
                f"drivers cannot serve it); use --backend cpu here, and a phone over adb for {backend}")

    @property
    def has_fp16_arithmetic(self) -> bool:
        """Whether the emulated core does ARMv8.2 fp16 arithmetic (an engine's native fp16 build needs it)."""
        return self.cpu not in ARMV80_CPUS

    def emulated(self, binary: Path, description: str) -> HarnessInvocation:
        """A native aarch64 program an engine built (its own harness), run on this core under qemu."""
        check_qemu()
        return HarnessInvocation(argv=[QEMU, "-cpu", self.cpu, str(binary)], env={},
                                 description=f"{description} under qemu -cpu {self.cpu}")

    def takes_each(self, engine: str, backend: str = "cpu") -> bool:
        """The aarch64 Python engines under qemu take `--each` as on the host (qemu and the engine's import
        paid once per configuration); an engine's own native aarch64 harness takes one input a process."""
        return engine in ARM_ENGINES and ENGINES[engine].arm64_harness is None

    def prepare_harness(self, engine: str, backend: str = "cpu") -> HarnessInvocation:
        own = ENGINES[engine].arm64_harness if engine in ENGINES else None
        if own is not None:  # the engine's own native harness (e.g. ggml's static aarch64 binary)
            return own(self)
        if engine not in ARM_ENGINES:
            raise DeviceError(f"{self.serial}: runs {' and '.join(ARM_ENGINES)} (their aarch64 wheels), not {engine}; "
                              "run the golden on --device local")
        module = ENGINES[engine].host_module
        runtime = self.runtime()
        return HarnessInvocation(argv=runtime.argv(self.cpu) + ["-m", module], env=runtime.env(source_dir()),
                                 description=f"aarch64 {engine} (Python) under qemu -cpu {self.cpu}")



def prepare_runtime(devices: list, step_display) -> None:
    """Build the arm64 runtime before a sweep when a device needs it, saying what is prepared.

    `step_display(title)` is a context manager yielding a StepSink (layerdiff.collector.sweep.progress.step_progress);
    the sweep's own live display cannot nest a second one, hence before it.
    """
    if not any(isinstance(d, Arm64Device) for d in devices) or runtime().ready():
        return
    print(f"arm64: preparing the emulated ARM runtime once (~{DOWNLOAD_MB} MB): Debian's arm64 Python "
          f"{PYTHON_VERSION} and the aarch64 wheels {', '.join(WHEELS)}, into {runtime().root}", file=sys.stderr)
    with step_display("arm64 runtime") as step:
        ensure_runtime(step)
