"""Start and stop stand-in phones and a private adb server (used by fixtures.py and benchmarks)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .config import StandInConfig
from .faults import Faults, write_faults

_PACKAGE_PARENT = Path(__file__).resolve().parent.parent  # so `python -m standin` finds this package
ADB_SCANNED_PORTS = range(5555, 5586)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 outside the range adb servers scan for emulators."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in ADB_SCANNED_PORTS:
            return port


class AdbServer:
    """A real `adb` server on its own port with its own HOME (keys, logs), killed at the end."""

    def __init__(self, home: Path, port: int | None = None, adb: str | None = None) -> None:
        self.adb = adb or shutil.which("adb") or ""
        if not self.adb:
            raise RuntimeError("the `adb` binary is not installed (Debian package `adb`)")
        self.port = port or free_port()
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        """Environment for any `adb` command aimed at this server."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANDROID_", "ADB_"))}
        env.update(HOME=str(self.home), TMPDIR=str(self.home), ANDROID_ADB_SERVER_PORT=str(self.port))
        return env

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run([self.adb, "-P", str(self.port), *args], env=self.env(), capture_output=True,
                              text=True, timeout=timeout, check=False)

    def start(self) -> "AdbServer":
        result = self.run("start-server", timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"adb start-server on port {self.port} failed: {result.stderr.strip()}")
        return self

    def kill(self) -> None:
        self.run("kill-server", timeout=20)

    def devices(self) -> dict[str, str]:
        """serial -> state, as `adb devices` reports them."""
        out = self.run("devices").stdout
        return dict(line.split("\t", 1) for line in out.splitlines()[1:] if "\t" in line)

    def connect(self, serial: str, state: str = "device", timeout: float = 20) -> None:
        """`adb connect` and wait until the server lists the serial in `state`."""
        result = self.run("connect", serial)
        if "connected" not in result.stdout and "authenticate" not in result.stdout:
            raise RuntimeError(f"adb connect {serial}: {result.stdout.strip()} {result.stderr.strip()}")
        self.wait_state(serial, state, timeout)

    def wait_state(self, serial: str, state: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while self.devices().get(serial) != state:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{serial} did not reach state {state!r}: {self.devices()}")
            time.sleep(0.05)

    def disconnect(self, serial: str) -> None:
        self.run("disconnect", serial)


class StandIn:
    """One stand-in phone process; `serial` is what adb calls it once connected."""

    def __init__(self, workdir: Path, config: StandInConfig, port: int = 0) -> None:
        self.workdir = Path(workdir)
        self.config = config
        self._requested_port = port
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @classmethod
    def create(cls, workdir: Path, **options) -> "StandIn":
        """A stand-in whose sandbox and state live under `workdir` (options: StandInConfig fields)."""
        workdir = Path(workdir)
        config = StandInConfig(sandbox=str(workdir / "device"), state=str(workdir / "state"), **options)
        return cls(workdir, config)

    @property
    def serial(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sandbox(self) -> Path:
        """Host directory holding the device's file system (`/data/local/tmp` is `sandbox/data/local/tmp`)."""
        return Path(self.config.sandbox)

    def host_path(self, device_path: str) -> Path:
        return self.sandbox / device_path.lstrip("/")

    def start(self, timeout: float = 20) -> "StandIn":
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "config.json"
        config_file.write_text(self.config.to_json())
        env = {**os.environ, "PYTHONPATH": str(_PACKAGE_PARENT)}
        with open(self.workdir / "standin.stderr", "ab") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "standin", "--config", str(config_file), "--port", str(self._requested_port)],
                stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True, text=True,
            )
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()
        if not line.startswith("READY ") or time.monotonic() > deadline:
            self.kill()
            raise RuntimeError(f"stand-in did not start: {(self.workdir / 'standin.stderr').read_text()[-2000:]}")
        self.port = int(line.split()[1])
        self._requested_port = self.port  # a restart comes back on the same address
        return self

    def set_faults(self, **faults) -> None:
        """Arm faults (fields of `faults.Faults`); replaces the previous set."""
        state = Path(self.config.state)
        state.mkdir(parents=True, exist_ok=True)
        write_faults(state / "faults.json", Faults(**faults))

    def faults(self) -> dict:
        path = Path(self.config.state) / "faults.json"
        return asdict(Faults.from_json(path.read_text())) if path.exists() else asdict(Faults())

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Unplug: the device process and every command it runs end at once."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the device kills its commands' groups, then itself
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc.wait()

    def logcat_lines(self) -> list[str]:
        path = Path(self.config.state) / "logcat.txt"
        return path.read_text().splitlines() if path.exists() else []
