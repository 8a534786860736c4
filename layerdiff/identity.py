"""Files and installed libraries identified by their stat: what a kept answer (a stored report, a
probe's answer) was made from. Any rewrite, reinstall or upgrade changes the stat, and reading a stat
costs microseconds where hashing contents or asking importlib.metadata for versions cost milliseconds
(40 ms of every analysis). Imports nothing heavy: both users look their answer up before the work."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def file_stat(path: Path) -> list[int]:
    """size, mtime, inode and ctime of a file (raises OSError when it cannot be read)."""
    st = Path(path).stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def library_stat(name: str) -> list[int] | None:
    """The stat of an installed module's file, found without importing it; None when it is not
    installed or cannot be read."""
    try:
        spec = importlib.util.find_spec(name)
        return file_stat(Path(spec.origin)) if spec is not None and spec.origin else None
    except (ImportError, ValueError, OSError):
        return None
