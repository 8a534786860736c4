"""The user's layerdiff cache: foreign dumps converted (and zips extracted) once, and measured
comparisons stored (`layerdiff.analyzer.measure.resultcache`), reused by later analyses.

It lives under layerdiff's one cache root (`user_cache_root`: $LAYERDIFF_CACHE, else
$XDG_CACHE_HOME/layerdiff, else ~/.cache/layerdiff; the harness builds and the arm64 runtime live
there too), in conversions/ ($LAYERDIFF_CACHE_DIR overrides that folder alone), never in a shared temp directory where another user could plant
files: it is created 0700 and refused when someone else owns it or others may write to it. It is
bounded: after each addition the least recently used entries go until it fits the limit
($LAYERDIFF_CACHE_MAX_BYTES, default 4 GiB). `analyze cache` reports its size, `analyze cache clean`
empties it.

Trimming runs after every addition (an analysis adds its measurement and its report), so it must
not walk the whole cache: a directory entry (a stored report, an extracted zip) is never changed once
renamed into place, so its size is counted once and kept beside it in the name of an empty hidden file,
`.NAME.BYTES.INODE.bytes` (one directory listing reads them all).
A size record is not an entry: it goes when its directory goes.
Before, every trim walked every file of every stored report: 0.2 s at 2,785 entries, twice an analysis.
"""
from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from typing import NamedTuple

from layerdiff.cache import user_cache_root
from layerdiff.errors import StorageError
from layerdiff.analyzer.formats.limits import env_bytes, human_bytes

DEFAULT_MAX_BYTES = 4 << 30
STALE_PARTIAL_S = 3600  # a half-written entry this old belongs to a process that died
SIZE_SUFFIX = ".bytes"  # `.NAME.BYTES.INODE.bytes`: an empty file, the recorded size of directory entry NAME


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


class _Entry(NamedTuple):
    """One file or extracted directory of the cache."""

    name: str
    size: int  # bytes
    used: float  # last use (modification time, see `touch`)
    record: str  # a directory's size record, "" for files and uncounted directories


def _entries(root: Path) -> list[_Entry]:
    """Every file or extracted directory in the cache; size records
    whose directory is gone (or was replaced) are removed on the way. Names, not paths: a Path per
    entry was half the cost of a trim."""
    with os.scandir(root) as listing:
        items = list(listing)
    records: dict[str, list[tuple[str, int, int]]] = {}  # directory name -> its records (name, bytes, inode)
    entries = []
    for item in items:
        record = _parse_size_record(item.name)
        if record is None:
            entries.append(item)
        else:
            records.setdefault(record[0], []).append((item.name, record[1], record[2]))
    out = []
    for item in entries:
        try:
            st = item.stat(follow_symlinks=False)
            size, record = (_dir_bytes(root, item.name, st, records.pop(item.name, [])) if stat.S_ISDIR(st.st_mode)
                            else (st.st_size, ""))
            out.append(_Entry(item.name, size, st.st_mtime, record))
        except OSError:
            continue
    for orphans in records.values():
        for name, _, _ in orphans:
            (root / name).unlink(missing_ok=True)
    return out


def _parse_size_record(name: str) -> tuple[str, int, int] | None:
    """(directory name, bytes, inode) from a record's name `.NAME.BYTES.INODE.bytes`, else None."""
    if not (name.startswith(".") and name.endswith(SIZE_SUFFIX)):
        return None
    parts = name[1:-len(SIZE_SUFFIX)].rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], int(parts[1]), int(parts[2])


def _dir_bytes(root: Path, name: str, st: os.stat_result, records: list[tuple[str, int, int]]) -> tuple[int, str]:
    """(bytes, size record) of a directory entry: from its size record, else counted, and recorded once the entry
    is complete (not a `.partial` one still being written). A record names the directory's inode: an
    entry replaced under the same name is a new directory, and the old record no longer counts."""
    for record, size, inode in records:
        if inode == st.st_ino:
            return size, record
        (root / record).unlink(missing_ok=True)
    size = sum(f.lstat().st_size for f in (root / name).rglob("*") if f.is_file())
    if ".partial" in name:
        return size, ""
    record = f".{name}.{size}.{st.st_ino}{SIZE_SUFFIX}"
    try:
        (root / record).touch(mode=0o600)
    except OSError:
        return size, ""  # counted again next time
    return size, record


def usage() -> tuple[int, int]:
    """(entries, bytes) the cache holds now."""
    root = cache_dir(create=False)
    if not root.is_dir():
        return 0, 0
    entries = _entries(root)
    return len(entries), sum(entry.size for entry in entries)


def touch(entry: Path) -> None:
    """Mark an entry as just used (least-recently-used order is by modification time)."""
    try:
        now = time.time_ns()  # precise: the kernel's own stamps are coarse, and ties would hide the order
        os.utime(entry, ns=(now, now))
    except OSError:
        pass


def _remove(root: Path, name: str, record: str) -> None:
    """An entry and its size record (a record left by a failed removal goes at the next listing)."""
    entry = root / name
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
        if record:
            (root / record).unlink(missing_ok=True)
    else:
        entry.unlink(missing_ok=True)


def trim(keep: Path | None = None, limit: int | None = None) -> int:
    """Drop least-recently-used entries (never `keep`) until the cache fits `limit`; bytes freed."""
    limit = max_bytes() if limit is None else limit
    root = cache_dir()
    now = time.time()
    entries = sorted(_entries(root), key=lambda e: e.used)
    total = sum(entry.size for entry in entries)
    freed = 0
    for name, size, used, record in entries:
        stale = ".partial" in name and now - used > STALE_PARTIAL_S
        if (total - freed <= limit and not stale) or (keep is not None and root / name == keep):
            continue
        _remove(root, name, record)
        freed += size
    return freed


def clean() -> tuple[int, int]:
    """Empty the cache; (entries, bytes) removed."""
    root = cache_dir(create=False)
    if not root.is_dir():
        return 0, 0
    _check_private(root)
    entries = _entries(root)
    for name, _, _, record in entries:
        _remove(root, name, record)
    return len(entries), sum(entry.size for entry in entries)


def describe() -> str:
    count, size = usage()
    return f"{cache_dir(create=False)}: {count} entries, {human_bytes(size)} (limit {human_bytes(max_bytes())})"
