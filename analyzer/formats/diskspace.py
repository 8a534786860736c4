"""Writing where there is no room, or no permission: one line naming the path, never a traceback.

A full disk surfaces as OSError(ENOSPC) from Python, or as an OSError/RuntimeError whose text holds
"errno = 28" from HDF5. Both become `NoSpaceError`, which names the path, the free space and what
the write needed; a read-only or forbidden target becomes `NotWritableError`. Callers remove their
half-written file (they write under a temporary name) and keep everything already complete.
"""
from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from layerdiff.errors import LayerdiffError, NoSpaceError, NotWritableError
from layerdiff.analyzer.formats.limits import human_bytes

NO_SPACE = "no space"
_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def free_bytes(path: Path) -> int:
    """Free space of the file system holding `path` (or its nearest existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return 0


def _errno_in(err: BaseException, numbers: set[int], text: tuple[str, ...]) -> bool:
    if isinstance(err, OSError) and err.errno in numbers:
        return True
    message = str(err)
    return any(t in message for t in text)


def is_no_space(err: BaseException) -> bool:
    return _errno_in(err, _NO_SPACE_ERRNOS, ("No space left", "errno = 28", "Disk quota exceeded", "errno = 122"))


def is_not_writable(err: BaseException) -> bool:
    return _errno_in(err, _READ_ONLY_ERRNOS, ("Read-only file system", "errno = 30", "Permission denied", "errno = 13"))


def as_write_error(err: BaseException, path: Path, need: int = 0) -> LayerdiffError | None:
    """The one-line error for a failed write of `path`, or None when it is neither full nor read-only."""
    if is_no_space(err):
        needed = f", about {human_bytes(need)} needed" if need else ""
        return NoSpaceError(f"{path}: {NO_SPACE} left on the device ({human_bytes(free_bytes(path))} free{needed}); "
                            "free some space and re-run the same command to resume")
    if is_not_writable(err):
        return NotWritableError(f"{path}: cannot write here (read-only or no permission); choose another output directory")
    return None


@contextmanager
def writing(path: Path, need: int = 0) -> Iterator[None]:
    """Turn a full disk or read-only target met inside the block into its one-line error."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        error = as_write_error(err, path, need)
        if error is None:
            raise
        raise error from None
