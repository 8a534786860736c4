"""Fault injection: what should go wrong, read from `<state>/faults.json` whenever it changes.

Tests change faults while the stand-in runs (`StandIn.set_faults`); the device process re-reads the
file on each push, pull and command, so no control channel besides the file system is needed.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class Faults:
    """Each field off when None. "die" means the phone vanishes: every connection drops at once."""

    die_after_push_bytes: int | None = None  # die once a push has received this many bytes
    die_after_pull_bytes: int | None = None  # die once a pull has sent this many bytes
    die_on_command: str | None = None  # regex; die `die_after_s` after a matching shell command starts
    die_after_s: float = 0.5
    quota_bytes: int | None = None  # the sandbox holds at most this much (push fails, df reports it)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Faults":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


def write_faults(path: Path, faults: Faults) -> None:
    """Atomic replace so the device never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(faults.to_json())
    os.replace(tmp, path)


class FaultFile:
    """The current faults, reloaded when the file's mtime changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._faults = Faults()

    def current(self) -> Faults:
        with self._lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._faults, self._stamp = Faults(), None
                return self._faults
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                self._faults = Faults.from_json(self.path.read_text())
                self._stamp = stamp
            return self._faults
