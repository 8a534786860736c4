"""The stand-in's file system: device paths live under one host directory.

Two views of the same mapping:
- sync requests carry device paths, always mapped into the sandbox (the sandbox *is* the device);
- shell command lines are run by the host's `/bin/sh`, so only paths under Android's top-level
  directories (`/data`, `/system`, `/vendor`, ...) are rewritten; `/proc`, `/dev/null`, `/bin/sh` stay
  the host's. Output of shell commands is mapped back, so `sha256sum /data/x` prints `/data/x`.
"""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

DEVICE_TOP_DIRS = ("data", "system", "vendor", "sdcard", "storage", "product", "odm", "apex", "mnt", "oem")
LAYOUT = (
    "data/local/tmp",
    "system/bin",
    "system/lib",
    "system/lib64",
    "vendor/lib",
    "vendor/lib64",
    "sdcard",
)
_TOP = "|".join(DEVICE_TOP_DIRS)
# A device path starts a token: at the start, after whitespace, a quote, '=', ':' (PATH lists),
# or a shell operator. It ends at '/' or anything that cannot continue a directory name.
_COMMAND_PATH = re.compile(r"(?<![^\s'\"=:;&|()<>`])/(?:" + _TOP + r")(?=[/\s'\";:&|()<>`]|$)")
_SHELL_SAFE = re.compile(r"^[A-Za-z0-9_./+-]+$")


class Sandbox:
    """Maps device paths to host paths below `root` and back."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        if not _SHELL_SAFE.match(str(self.root)):
            raise ValueError(f"stand-in sandbox path must be shell-safe: {self.root}")
        self._root_text = str(self.root)
        self._unmap = re.compile(re.escape(self._root_text.encode()) + rb"(?=/(?:" + _TOP.encode() + rb")\b)")

    def create_layout(self, extra_files: dict[str, bytes] | None = None) -> None:
        """Create Android's usual directories and any files the device should already have."""
        for rel in LAYOUT:
            (self.root / rel).mkdir(parents=True, exist_ok=True)
        for device_path, content in (extra_files or {}).items():
            target = self.host_path(device_path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)

    def host_path(self, device_path: str) -> Path:
        """Where a device path lives on the host; `..` cannot climb out of the sandbox."""
        normal = posixpath.normpath("/" + device_path.lstrip("/"))
        return self.root / normal.lstrip("/") if normal != "/" else self.root

    def translate_command(self, command: str) -> str:
        """Rewrite device paths in a shell command line to their sandbox locations."""
        return _COMMAND_PATH.sub(lambda m: self._root_text + m.group(0), command)

    def unmap_output(self, data: bytes) -> bytes:
        """Turn sandbox paths in command output back into device paths."""
        return self._unmap.sub(b"", data)
