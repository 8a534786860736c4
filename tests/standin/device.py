"""The stand-in phone: its identity, its services, and the ways it can fail."""
from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from .config import StandInConfig
from .execshim import build_exec_shim
from .faults import FaultFile, Faults
from .sandbox import Sandbox
from .streams import Stream
from .tools import install_tools, used_bytes

Service = Callable[[Stream], None]


class StandInDevice:
    """State shared by every connection to one stand-in."""

    def __init__(self, config: StandInConfig, port: int) -> None:
        self.config = config
        self.port = port
        self.state = Path(config.state)
        self.state.mkdir(parents=True, exist_ok=True)
        self.sandbox = Sandbox(Path(config.sandbox))
        self.sandbox.create_layout({path: b"" for path in config.gpu_libs})
        self.props = config.full_props(port)
        self._write_props()
        self.faults = FaultFile(self.state / "faults.json")
        self.bin_dir = install_tools(self.state)
        self.exec_shim = build_exec_shim(self.state) if config.abi == "arm64-v8a" else None
        self._log_lock = threading.Lock()
        self._children: set[int] = set()  # process groups of running commands
        self._connections = 0

    def first_connection(self) -> bool:
        """True the first time it is asked (the "offline" mode completes only one handshake)."""
        self._connections += 1
        return self._connections == 1

    def track(self, pgid: int) -> None:
        self._children.add(pgid)

    def untrack(self, pgid: int) -> None:
        self._children.discard(pgid)

    # -- identity ---------------------------------------------------------------------------------
    def banner(self) -> str:
        p = self.props
        return (
            f"device::ro.product.name={p['ro.product.name']};ro.product.model={p['ro.product.model']};"
            f"ro.product.device={p['ro.product.device']};features=shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir"
        )

    def _write_props(self) -> None:
        lines = [f"{k}={v}" for k, v in sorted(self.props.items())]
        (self.state / "props").write_text("\n".join(lines) + "\n")
        (self.state / "gles").write_text(self.config.gles)

    # -- services ---------------------------------------------------------------------------------
    def service_for(self, destination: str) -> Service | None:
        from .shellsvc import exec_service, shell_service
        from .syncsvc import sync_service

        if destination == "sync:":
            return lambda stream: sync_service(self, stream)
        if destination.startswith("shell") and ":" in destination:
            options, command = destination.split(":", 1)
            v2 = "v2" in options.split(",")[1:]
            return lambda stream: shell_service(self, stream, command, v2=v2)
        if destination.startswith("exec:"):
            return lambda stream: exec_service(self, stream, destination[len("exec:"):])
        return None

    def shell_env(self) -> dict[str, str]:
        """The environment commands run in: our tools first on PATH, the exec shim for aarch64."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "PYTHON"))}
        env.update(
            PATH=f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            HOME=str(self.sandbox.host_path("/data/local/tmp")),
            TMPDIR=str(self.sandbox.host_path("/data/local/tmp")),
            LAYERDIFF_STANDIN_ROOT=str(self.sandbox.root),
            LAYERDIFF_STANDIN_STATE=str(self.state),
        )
        if self.exec_shim is not None:
            env.update(
                LD_PRELOAD=str(self.exec_shim),
                LAYERDIFF_STANDIN_QEMU=self.config.qemu,
                LAYERDIFF_STANDIN_QEMU_CPU=self.config.qemu_cpu,
                LAYERDIFF_STANDIN_QEMU_LD_PREFIX=self.config.qemu_ld_prefix,
            )
        return env

    # -- faults -----------------------------------------------------------------------------------
    def current_faults(self) -> Faults:
        return self.faults.current()

    def free_bytes(self) -> int | None:
        """Space left under the quota, or None when there is no quota."""
        quota = self.current_faults().quota_bytes
        if quota is None:
            return None
        return max(0, quota - self.used_bytes())

    def used_bytes(self) -> int:
        return used_bytes(str(self.sandbox.root))

    def watch_command(self, command: str) -> None:
        """Arm the die-mid-run fault when a command matching it starts."""
        faults = self.current_faults()
        if faults.die_on_command and re.search(faults.die_on_command, command):
            timer = threading.Timer(faults.die_after_s, self.die, args=(f"command {command[:60]!r}",))
            timer.daemon = True
            timer.start()

    def die(self, why: str) -> None:
        """Vanish like an unplugged phone: every connection and every process of ours ends now."""
        self.log(f"dying: {why}")
        sys.stdout.flush()
        for pgid in list(self._children):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        try:
            if os.getpgid(0) == os.getpid():  # launched as its own group: take the children along
                os.killpg(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(137)

    def log(self, text: str) -> None:
        with self._log_lock:
            with open(self.state / "standin.log", "a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} {text}\n")
