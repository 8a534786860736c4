"""What the run pipeline needs from a device, and the `local` device that runs on the host.

A run is the same five steps on every device (stage, execute, fetch, convert, clean up); only how
bytes move and how a process starts differs. `Device` names exactly those operations so the ADB
device (`layerdiff.collector.transport.adb.AdbDevice`) and the local device are interchangeable in `layerdiff.collector.run.pipeline`.
"""
from __future__ import annotations

import os
import platform
import shutil
import functools
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

from layerdiff.vocabulary import host_abi
from layerdiff.errors import DeviceError
from layerdiff.collector.harness import children
from layerdiff.collector.harness.invocation import HarnessInvocation  # noqa: F401 (the devices' API)
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.transport.scratch import keep_scratch_dir, make_scratch_dir, remove_scratch_dir

LineSink = Callable[[str], None]


@dataclass
class DeviceInfo:
    """Facts about a device that end up in every run's provenance."""

    serial: str
    kind: str  # "local" or "adb"
    state: str = "device"
    model: str = ""
    manufacturer: str = ""
    soc: str = ""
    board: str = ""
    abi: str = ""
    abis: list[str] = field(default_factory=list)
    android_release: str = ""
    sdk: str = ""
    gpu: str = ""
    extra: dict = field(default_factory=dict)

    def provenance(self) -> dict:
        """Flat fields for the HDF5 root attributes (see analyzer/FORMATS.md)."""
        return {
            "device_serial": self.serial,
            "device_model": self.model,
            "soc": self.soc,
            "board": self.board,
            "abi": self.abi,
            "android_release": self.android_release,
            "gpu": self.gpu,
        }

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ExecResult:
    """How a harness process ended. `exit_status` is -N when killed by signal N."""

    exit_status: int
    stderr: str
    duration_s: float
    timed_out: bool = False
    pid: int | None = None
    device_log: str = ""  # the device's own log lines for the harness (logcat on Android) after a crash


@runtime_checkable
class Device(Protocol):
    """The operations `layerdiff.collector.run.pipeline` performs on a device, whatever transport it uses."""

    serial: str

    def info(self) -> DeviceInfo:
        """Device facts; implementations cache them (read once per device per process)."""

    def prepare_harness(self, engine: str, backend: str = "cpu") -> HarnessInvocation:
        """Make the harness for `engine` (and `backend`) runnable on the device (build/push as needed)."""

    def takes_each(self, engine: str, backend: str = "cpu") -> bool:
        """Whether the harness this device runs for `engine` takes `--each` (HARNESS_CLI.md): one process,
        the model loaded once, every input of a configuration (collector/run/each.py)."""

    def new_run_dir(self, tag: str) -> str:
        """A fresh, empty directory on the device for one run's files."""

    def stage(self, local: Path, remote_dir: str) -> str:
        """Put a file on the device (skipped when the same bytes are there); returns its device path."""

    def put(self, local: Path, remote_path: str) -> None:
        """Copy a file to an exact path on the device (for files a harness finds by directory)."""

    def execute(
        self, argv: list[str], *, env: dict[str, str], deadline_s: float, on_stdout_line: LineSink | None = None
    ) -> ExecResult:
        """Run a command, enforcing the deadline on the device, streaming stdout lines."""

    def fetch_dir(self, remote_dir: str, local_dir: Path) -> Path:
        """Bring a raw dump directory to the host; returns where it is now readable."""

    def remove(self, remote_path: str) -> None:
        """Delete a run's files on the device."""

    def free_bytes(self, remote_dir: str) -> int:
        """Free space where dumps are written."""


def _host_cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


# glibc raises its mmap threshold to the size of each freed mmap'ed block, so an engine that allocates
# and frees one layer-sized buffer after another ends up keeping them on the heap, resident. A fixed
# threshold returns each to the system when freed: the host engines then hold about the live layers.
# The child uses numpy only to read inputs and write dumps, never BLAS, and the engines run their own
# threads (--threads); numpy's OpenBLAS would still start a worker per core that spins while numpy
# imports (0.31 -> 0.18 s CPU per child on this 2-core machine, more on a many-core host).
HOST_ENGINE_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "OPENBLAS_NUM_THREADS": "1"}


class LocalDevice:
    """The host, running the host engines (pip ncnn / pymnn) in a child process.

    The child writes the same raw dump a phone's harness writes, so everything after `execute` is
    shared with real phones. Files are used in place: staging is a no-op and fetching returns the
    directory the child wrote.
    """

    serial = "local"
    fetches_in_place = True  # fetch_dir returns the directory the child wrote: nothing is copied

    def __init__(self, workroot: Path | None = None) -> None:
        self._workroot = Path(workroot) if workroot else None
        self._info: DeviceInfo | None = None

    def info(self) -> DeviceInfo:
        """The host's facts, read once per process. The GPU name is not among them: finding it
        runs `vulkaninfo` (a process and a Vulkan instance), so only Vulkan runs ask (`vulkan_gpu`)."""
        if self._info is None:
            uname = platform.uname()
            self._info = DeviceInfo(
                serial="local",
                kind="local",
                model="local",  # what the user typed (--device local) labels its runs; the host name is provenance
                soc=_host_cpu_name(),
                board=f"{uname.system}-{uname.release}-{uname.machine}",  # platform.platform() runs `uname -p`
                abi=host_abi(),
                abis=[host_abi()],
                extra={"python": sys.version.split()[0], "hostname": uname.node},
            )
        return self._info

    def vulkan_gpu(self) -> str:
        return _local_gpu_name()

    def probe_cache(self, engine: str) -> Path | None:
        """Where the host's `--probe` answer for `engine` is kept (None: always ask); named by what
        the answer depends on (layerdiff.collector.transport.probe)."""
        from layerdiff.collector.transport.probe import local_probe_path

        return local_probe_path(engine)

    def prepare_harness(self, engine: str, backend: str = "cpu") -> HarnessInvocation:
        if engine not in ENGINES:
            raise DeviceError(f"local: no host engine named {engine!r}; use --engine {' or '.join(ENGINES)}")
        ENGINES[engine].require_installed()
        return HarnessInvocation(argv=[sys.executable, "-m", ENGINES[engine].host_module], env=dict(HOST_ENGINE_ENV),
                                 description=f"host {engine} (Python)")

    def takes_each(self, engine: str, backend: str = "cpu") -> bool:
        """The Python host engines take `--each`; an engine whose harness is a native program of its own
        (`Engine.prebuild`, such as ggml's) takes one input a process."""
        return engine in ENGINES and ENGINES[engine].prebuild is None

    def new_run_dir(self, tag: str) -> str:
        return make_scratch_dir(self.scratch_root(), _safe_tag(tag))

    def scratch_root(self) -> Path:
        """Where this device's run scratch lives (a later start removes what dead processes left there)."""
        return self._workroot or Path(tempfile.gettempdir())

    def keep_run_dir(self, run_dir: str) -> None:
        keep_scratch_dir(run_dir)

    def stage(self, local: Path, remote_dir: str) -> str:
        return str(Path(local).resolve())

    def put(self, local: Path, remote_path: str) -> None:
        Path(remote_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, remote_path)

    def execute(
        self, argv: list[str], *, env: dict[str, str], deadline_s: float, on_stdout_line: LineSink | None = None
    ) -> ExecResult:
        return run_with_deadline(argv, env=env, deadline_s=deadline_s, on_stdout_line=on_stdout_line)

    def fetch_dir(self, remote_dir: str, local_dir: Path) -> Path:
        return Path(remote_dir)

    def remove(self, remote_path: str) -> None:
        remove_scratch_dir(remote_path)

    def free_bytes(self, remote_dir: str) -> int:
        return shutil.disk_usage(remote_dir).free


def _safe_tag(tag: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in tag)[:60]


@functools.lru_cache(maxsize=1)
def _local_gpu_name() -> str:
    """The Vulkan device ncnn would use here (lavapipe on CI), without initialising Vulkan in-process."""
    try:
        out = subprocess.run(
            ["vulkaninfo", "--summary"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    for line in out.splitlines():
        if "deviceName" in line:
            return line.split("=", 1)[1].strip()
    return ""


def run_with_deadline(
    argv: list[str], *, env: dict[str, str], deadline_s: float, on_stdout_line: LineSink | None = None
) -> ExecResult:
    """Run a child, stream its stdout lines, collect stderr, and kill it at the deadline."""
    start = time.monotonic()
    child_env = {**os.environ, **env}
    # A session of its own: Ctrl-C on the terminal reaches the collector, which stops children itself
    # (see layerdiff.collector.harness.children) and records the runs as interrupted instead of crashed.
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env, text=True, errors="replace",
        start_new_session=True,
    )
    children.register(proc)
    stderr_chunks: list[str] = []
    reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)
    reader.start()
    timer = threading.Timer(deadline_s, children.kill_group, args=(proc,))
    timer.start()
    try:
        for line in proc.stdout:
            if on_stdout_line is not None:
                on_stdout_line(line.rstrip("\n"))
        status = proc.wait()
    finally:
        timer.cancel()
        children.unregister(proc)
    reader.join()
    proc.stdout.close()  # both pipes read to their end: closed now, not left to the garbage collector
    proc.stderr.close()
    elapsed = time.monotonic() - start
    return ExecResult(
        exit_status=status, stderr="".join(stderr_chunks), duration_s=elapsed, timed_out=elapsed >= deadline_s
    )
