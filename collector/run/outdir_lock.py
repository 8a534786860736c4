"""One writer per OUTDIR: an advisory `fcntl` lock held for as long as a collect writes there.

Two collects of different models into one OUTDIR would overwrite each other's files and index rows.
The second one fails at once, naming the pid that holds the directory, rather than waiting: a sweep
can take hours, and a command that silently waits that long looks hung. The lock is released by the
kernel when the holder exits, however it exits (kill -9 included), so a stale lock cannot exist.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from layerdiff.errors import OutdirBusyError, StorageError

LOCK_NAME = ".layerdiff.lock"
FETCH_PREFIX = ".layerdiff-fetch-"  # a run's scratch in OUTDIR; hidden, so never taken for a dump


class OutdirLock:
    """`with OutdirLock(out_dir):` — exclusive use of `out_dir` (created) by this process."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self._fd: int | None = None

    def __enter__(self) -> "OutdirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.out_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise StorageError(f"{self.out_dir}: cannot write here ({err.strerror}); choose another -o") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutdirBusyError(
                f"{self.out_dir} is being written by pid {holder}; wait for it to finish or choose another -o"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # a full disk: the lock holds all the same, only the pid in messages is missing
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock; the file stays (removing it would race a new holder)
            self._fd = None


def remove_leftovers(out_dir: Path) -> list[Path]:
    """Delete what an interrupted writer left in `out_dir` (half-written `.partial` files, fetch
    scratch directories). Only safe while holding the lock: then no other writer owns them."""
    removed: list[Path] = []
    for path in Path(out_dir).glob(".*"):
        if path.is_file() and path.name.endswith(".partial"):
            path.unlink(missing_ok=True)
            removed.append(path)
        elif path.is_dir() and path.name.startswith(FETCH_PREFIX):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "?"
