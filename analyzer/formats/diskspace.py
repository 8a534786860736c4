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


# Space an HDF5 file still owes at close beyond its raw data: object headers, attributes, the layer
# table and root attributes (measured: ~1.2 KiB per tensor with short names, ~22 KiB fixed).
META_FIXED = 64 << 10
META_PER_TENSOR = 1024
MARGIN = 64 << 10


class SpaceGuard:
    """Checks, before HDF5 writes anything, that the file system has room for it and for the
    metadata the file must still flush at close. A write HDF5 sees fail leaves the library in a
    state that crashes the process at exit (SIGSEGV), so the refusal must come first:
    `reserve` raises NoSpaceError while there is still room to close the file cleanly.

    `statvfs` is asked only when the bytes written since the last answer may have used up the
    room (a few calls per run, not one per tensor)."""

    def __init__(self, path: Path, expected_bytes: int = 0) -> None:
        self.path = Path(path)
        self.expected_bytes = expected_bytes
        self.owed = META_FIXED  # metadata HDF5 may still write (counted until the file is closed)
        self.written = 0
        self._room = -1  # free bytes at the last look, less what was written since

    def reserve(self, raw: int, strings: int = 0) -> None:
        """Room for `raw` data bytes and one object whose names and attributes total `strings` bytes."""
        self.owed += META_PER_TENSOR + 2 * strings
        need = raw + self.owed + MARGIN
        if self._room < need:
            self._room = free_bytes(self.path)
            if self._room < need:
                raise self.error(need)
        self._room -= raw
        self.written += raw

    def before_close(self) -> None:
        """The last look before HDF5 flushes what it still holds: with no room left for that (the disk
        filled under us since the last `reserve`), flushing would meet a failed write inside the
        library, which crashes it; refuse instead, and leave the file unclosed to the process's end."""
        need = self.owed + MARGIN
        if free_bytes(self.path) < need:
            note_hdf5_write_failure()
            raise self.error(need)

    def error(self, need: int) -> NoSpaceError:
        """The one-line error naming the file (not its temporary name), its free space and the dump's size."""
        total = max(self.expected_bytes, self.written + need + self.owed + MARGIN)
        return as_write_error(OSError(errno.ENOSPC, "No space left on device"), self.path, total)  # type: ignore[return-value]


_hdf5_write_failed = False


def note_hdf5_write_failure() -> None:
    """HDF5 itself met a failed write (the disk filled between our check and its write): its
    handles can no longer be released, and the library's own clean-up at exit would crash.
    The error is reported as usual; `exit_now_if_hdf5_failed` then ends the process without that
    clean-up."""
    global _hdf5_write_failed
    _hdf5_write_failed = True


_UNRELEASED: list = []  # HDF5 files left open after a failed write: never released, so never closed


def keep_unreleased(handle) -> None:
    """Hold `handle` (an h5py File HDF5 could not flush) until the process ends: releasing it would close
    it, and closing it crashes the library; `exit_now_if_hdf5_failed` ends the process without that."""
    _UNRELEASED.append(handle)


def hdf5_write_failed() -> bool:
    """Whether HDF5 met a failed write in this process (then no file of it may be closed: see above)."""
    return _hdf5_write_failed


def quiet_hdf5_release_failures() -> None:
    """From now on, h5py's "Can't decrement id ref count (file write failed ... errno = 28)" when it
    drops a handle on a full disk is noted (`note_hdf5_write_failure`) instead of printed as a
    traceback: the write's own error already says it in one line. h5py reports it twice (Cython
    prints it through sys.excepthook, then as unraisable); both hooks pass every other error on."""
    import sys

    if getattr(sys.unraisablehook, "_layerdiff_quiet", False):
        return
    unraisable_hook, except_hook = sys.unraisablehook, sys.excepthook

    def quiet_unraisable(unraisable) -> None:
        if not _release_failure(unraisable.exc_value):
            unraisable_hook(unraisable)

    def quiet_except(kind, value, tb) -> None:
        if not _release_failure(value):
            except_hook(kind, value, tb)

    quiet_unraisable._layerdiff_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook, sys.excepthook = quiet_unraisable, quiet_except


def _release_failure(err: BaseException | None) -> bool:
    if isinstance(err, RuntimeError) and "id ref count" in str(err) and is_no_space(err):
        note_hdf5_write_failure()
        return True
    return False


def exit_now_if_hdf5_failed(code: int) -> None:
    """End the process with `code` now (stdio flushed, no library clean-up) when HDF5 met a failed write."""
    if not _hdf5_write_failed:
        return
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
