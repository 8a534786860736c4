"""The user's layerdiff cache: foreign dumps converted (and zips extracted) once, and measured
comparisons stored (`layerdiff.analyzer.measure.resultcache`), reused by later analyses.

It lives under layerdiff's one cache root (`user_cache_root`: $LAYERDIFF_CACHE, else
$XDG_CACHE_HOME/layerdiff, else ~/.cache/layerdiff; the harness builds and the arm64 runtime live
there too), in conversions/ ($LAYERDIFF_CACHE_DIR overrides that folder alone), never in a shared temp directory where another user could plant
files: it is created 0700 and refused when someone else owns it or others may write to it. It is
bounded: after each addition the least recently used entries go until it fits the limit
($LAYERDIFF_CACHE_MAX_BYTES, default 4 GiB). `analyze cache` reports its size, `analyze cache clean`
empties it.
"""
from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

from layerdiff.cache import user_cache_root
from layerdiff.errors import StorageError
from layerdiff.analyzer.formats.limits import env_bytes, human_bytes

DEFAULT_MAX_BYTES = 4 << 30
STALE_PARTIAL_S = 3600  # a half-written entry this old belongs to a process that died


def max_bytes() -> int:
    return env_bytes("LAYERDIFF_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES)


def cache_dir(create: bool = True) -> Path:
    """The user's conversion cache, created private and checked to be theirs alone."""
    override = os.environ.get("LAYERDIFF_CACHE_DIR")
    path = Path(override) if override else user_cache_root() / "conversions"
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise StorageError(f"{path}: cannot create the conversion cache ({err.strerror}); set LAYERDIFF_CACHE_DIR") from None
    if path.exists():
        _check_private(path)
    return path


def _check_private(path: Path) -> None:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StorageError(f"{path}: the conversion cache is not a plain directory; remove it or set LAYERDIFF_CACHE_DIR")
    if st.st_uid != os.getuid():
        raise StorageError(f"{path}: the conversion cache belongs to uid {st.st_uid}, not you; "
                             "remove it or set LAYERDIFF_CACHE_DIR to a directory of your own")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, but others could read or plant files: close it


def _entries(root: Path) -> list[tuple[Path, int, float]]:
    """(entry, bytes, last use) for every file or extracted directory in the cache."""
    out = []
    for entry in root.iterdir():
        try:
            if entry.is_dir() and not entry.is_symlink():
                size = sum(f.lstat().st_size for f in entry.rglob("*") if f.is_file())
            else:
                size = entry.lstat().st_size
            out.append((entry, size, entry.lstat().st_mtime))
        except OSError:
            continue
    return out


def usage() -> tuple[int, int]:
    """(entries, bytes) the cache holds now."""
    root = cache_dir(create=False)
    if not root.is_dir():
        return 0, 0
    entries = _entries(root)
    return len(entries), sum(size for _, size, _ in entries)


def touch(entry: Path) -> None:
    """Mark an entry as just used (least-recently-used order is by modification time)."""
    try:
        now = time.time_ns()  # precise: the kernel's own stamps are coarse, and ties would hide the order
        os.utime(entry, ns=(now, now))
    except OSError:
        pass


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def trim(keep: Path | None = None, limit: int | None = None) -> int:
    """Drop least-recently-used entries (never `keep`) until the cache fits `limit`; bytes freed."""
    limit = max_bytes() if limit is None else limit
    root = cache_dir()
    now = time.time()
    entries = sorted(_entries(root), key=lambda e: e[2])
    total = sum(size for _, size, _ in entries)
    freed = 0
    for entry, size, used in entries:
        stale = ".partial" in entry.name and now - used > STALE_PARTIAL_S
        if (total - freed <= limit and not stale) or (keep is not None and entry == keep):
            continue
        _remove(entry)
        freed += size
    return freed


def clean() -> tuple[int, int]:
    """Empty the cache; (entries, bytes) removed."""
    root = cache_dir(create=False)
    if not root.is_dir():
        return 0, 0
    _check_private(root)
    entries = _entries(root)
    for entry, _, _ in entries:
        _remove(entry)
    return len(entries), sum(size for _, size, _ in entries)


def describe() -> str:
    count, size = usage()
    return f"{cache_dir(create=False)}: {count} entries, {human_bytes(size)} (limit {human_bytes(max_bytes())})"
