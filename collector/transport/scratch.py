"""Run scratch directories on the host (a raw dump as big as the dump itself), owned by a lock.

A `collect` killed with SIGKILL (or one whose machine lost power) cannot remove its scratch, and
the temp folder is shared by every process, so a later `collect` must tell a dead process's scratch
from a live one's. Each directory holds `.owner`, on which its process keeps an `flock` for as long
as the directory lives; the kernel drops the lock when the process ends, however it ends. A later
start removes every scratch directory whose lock it can take and whose creator's pid (in its name)
is no longer alive: the lock covers a reused pid or another PID namespace sharing /tmp, the pid the
instant between creating a directory and locking it. A reused pid only delays the removal.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

SCRATCH_PREFIX = ".layerdiff-run-"
OWNER = ".owner"
KEEP = ".keep"  # `collect --keep`: the run's files stay for the user; no later start removes them

_held: dict[str, int] = {}  # scratch path -> the fd holding its lock
_lock = threading.Lock()


def make_scratch_dir(root: Path, tag: str) -> str:
    """A fresh directory under `root`, locked by this process until `remove_scratch_dir`."""
    root.mkdir(parents=True, exist_ok=True)
    path = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{tag}-", dir=root)
    fd = os.open(os.path.join(path, OWNER), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a brand-new file nobody else knows: never blocks
    with _lock:
        _held[path] = fd
    return path


def remove_scratch_dir(path: str) -> None:
    """Delete a scratch directory and drop its lock (the lock last: no one takes a half-deleted one)."""
    shutil.rmtree(path, ignore_errors=True)
    with _lock:
        fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def keep_scratch_dir(path: str) -> None:
    """Leave a scratch directory for the user (`--keep`): marked kept, its lock dropped."""
    try:
        (Path(path) / KEEP).touch()
    except OSError:
        pass
    with _lock:
        fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


@contextmanager
def scratch_dir(tag: str, root: Path | None = None) -> Iterator[Path]:
    """`with scratch_dir("inputs") as path:` a locked scratch directory, removed at the end."""
    path = make_scratch_dir(Path(root) if root is not None else Path(tempfile.gettempdir()), tag)
    try:
        yield Path(path)
    finally:
        remove_scratch_dir(path)


def remove_stale_scratch(root: Path | None = None) -> list[Path]:
    """Remove the scratch directories under `root` (default: the temp folder) whose owner has ended."""
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return removed
    for path in candidates:
        if _owner_gone(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _owner_gone(path: Path) -> bool:
    """True when no live process holds the directory's lock (a directory without `.owner` is one
    whose owner died between creating it and locking it, if that owner's pid is gone too)."""
    if path.is_symlink() or not path.is_dir() or (path / KEEP).exists():
        return False
    try:
        fd = os.open(path / OWNER, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return not _pid_alive(path.name[len(SCRATCH_PREFIX):].split("-", 1)[0])
    except OSError:
        return False  # not ours to judge (another user's, unreadable)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its owner lives
    finally:
        os.close(fd)
    # free, and its creator is gone too (a free lock alone could be one created an instant ago, not yet taken)
    return not _pid_alive(path.name[len(SCRATCH_PREFIX):].split("-", 1)[0])


def _pid_alive(text: str) -> bool:
    if not text.isdigit():
        return True  # not a name we made: leave it
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
