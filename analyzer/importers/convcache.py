"""The user's layerdiff cache: foreign dumps converted (and zips extracted) once, and measured
comparisons stored (`layerdiff.analyzer.measure.resultcache`), reused by later analyses.

It lives under layerdiff's one cache root (`user_cache_root`: $LAYERDIFF_CACHE, else
$XDG_CACHE_HOME/layerdiff, else ~/.cache/layerdiff; the harness builds and the arm64 runtime live
there too), in conversions/ ($LAYERDIFF_CACHE_DIR overrides that folder alone), never in a shared temp directory where another user could plant
files: it is created 0700 and refused when someone else owns it or others may write to it. It is
bounded ($LAYERDIFF_CACHE_MAX_BYTES, default 4 GiB): when an addition takes it over the limit, the least
recently used entries go until it is under 90% of it. `analyze cache` reports its size, `analyze cache clean`
empties it.

Trimming runs after every addition (an analysis adds its measurement, its dumps' headers and its
report), so it must not look at the whole cache each time: a cache at its limit holds thousands of
entries (9,500 in a 4 GiB one: a listing and a stat of each is about 0.06-0.08 s, as much as a
third of what a re-judged analysis does beyond reading its stored measurement). The cache's byte count is kept in a ledger, `.usage` (the bytes of the last full count plus
those added since, and when that count was made), updated under a lock: an addition that keeps
the cache within its limit reads and rewrites that one small file. A full count (one listing; a
directory entry, never changed once renamed into place, has its size counted once and kept in the name
of an empty hidden file beside it, `.NAME.BYTES.INODE.bytes`) is made when an addition would go over
the limit, when the ledger is missing or unreadable, and when the last count is over an hour old (entries
that appeared by other means, a deletion by hand). An entry written but not yet accounted when another
process counts in full is counted twice until the next count: the ledger errs toward too many bytes
(an earlier trim), never too few. When a count finds the cache over its limit, the
least recently used entries go until it is under 90% of it, so that a full cache is not counted again
at every addition. A size record is not an entry: it goes when its directory goes.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

from layerdiff.cache import user_cache_root
from layerdiff.errors import StorageError
from layerdiff.analyzer.formats.limits import env_bytes, human_bytes

DEFAULT_MAX_BYTES = 4 << 30
STALE_PARTIAL_S = 3600  # a half-written entry this old belongs to a process that died
SIZE_SUFFIX = ".bytes"  # `.NAME.BYTES.INODE.bytes`: an empty file, the recorded size of directory entry NAME
LEDGER = ".usage"  # "BYTES COUNTED_AT": the cache's bytes, and when they were last counted in full
RECOUNT_AFTER_S = 3600  # a ledger older than this is counted again (entries added or removed by other means)
CLOCK_SLACK_S = 1.0  # a count this far in the future is a clock set back a little, not a ledger to distrust
LOW_WATER = 0.9  # a count over the limit removes the least recently used entries down to this share of it


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
        if item.name == LEDGER:
            continue
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


def trim(keep: Path | None = None, limit: int | None = None, added: Iterable[Path] | None = None) -> int:
    """Account for the entries just `added` (default: `keep`) and keep the cache within `limit`; bytes freed.

    Within the limit by the ledger, nothing else is read. Otherwise (or with nothing added, or a ledger
    missing, unreadable or over an hour old) the cache is counted in full and, when over the limit, the
    least recently used entries (never `keep` nor what was just added) go until it is under LOW_WATER of it."""
    limit = max_bytes() if limit is None else limit
    root = cache_dir()
    new = list(added) if added is not None else ([keep] if keep is not None else [])
    with _ledger(root) as ledger:
        counted = _read_ledger(ledger)
        if counted is not None and new:
            total, counted_at = counted
            total += sum(_added_bytes(root, path) for path in new)
            if total <= limit:
                _write_ledger(ledger, total, counted_at)
                return 0
        freed, total = _trim_counted(root, {p.name for p in (*new, keep) if p is not None and p.parent == root}, limit)
        _write_ledger(ledger, total, time.time())
        return freed


def _trim_counted(root: Path, keep: set[str], limit: int) -> tuple[int, int]:
    """Count the cache in full, then drop what must go: stale half-written entries, and when the cache is over
    `limit`, the least recently used entries but those named in `keep` until it is under LOW_WATER of it.
    (bytes freed, bytes left)"""
    now = time.time()
    entries = sorted(_entries(root), key=lambda e: e.used)
    total = sum(entry.size for entry in entries)
    target = limit if total <= limit else int(limit * LOW_WATER)
    freed = 0
    for name, size, used, record in entries:
        stale = ".partial" in name and now - used > STALE_PARTIAL_S
        if (total - freed <= target and not stale) or name in keep:
            continue
        _remove(root, name, record)
        freed += size
    return freed, total - freed


def _added_bytes(root: Path, path: Path) -> int:
    """The bytes of an entry just added (a directory counted now and its size recorded beside it); 0 when it
    is gone already, or is no entry of this cache."""
    if path.parent != root:
        return 0
    try:
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode):
            return st.st_size
        return _dir_bytes(root, path.name, st, [])[0]
    except OSError:
        return 0


@contextmanager
def _ledger(root: Path) -> Iterator[int]:
    """The ledger's file descriptor, locked: one process at a time reads, counts and rewrites it, so no
    addition is lost and no two processes remove entries at once. On a file system without locks (some
    network mounts) it is used unlocked: an addition made at the same moment as another may go uncounted
    until the next full count, at most an hour later."""
    fd = os.open(root / LEDGER, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _read_ledger(fd: int) -> tuple[int, float] | None:
    """(bytes, when they were counted in full), or None when the ledger is empty, unreadable or too old."""
    try:
        bytes_text, counted_text = os.pread(fd, 64, 0).decode("ascii").split()
        total, counted_at = int(bytes_text), float(counted_text)
    except (OSError, ValueError):
        return None
    if total < 0 or not -CLOCK_SLACK_S <= time.time() - counted_at <= RECOUNT_AFTER_S:
        return None
    return total, counted_at


def _write_ledger(fd: int, total: int, counted_at: float) -> None:
    text = f"{total} {counted_at!r}\n".encode("ascii")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
    except OSError:
        pass  # a ledger that could not be written reads as missing: the next trim counts in full


def clean() -> tuple[int, int]:
    """Empty the cache; (entries, bytes) removed."""
    root = cache_dir(create=False)
    if not root.is_dir():
        return 0, 0
    _check_private(root)
    with _ledger(root) as ledger:
        entries = _entries(root)
        for name, _, _, record in entries:
            _remove(root, name, record)
        _write_ledger(ledger, 0, time.time())
    return len(entries), sum(entry.size for entry in entries)


def describe() -> str:
    count, size = usage()
    return f"{cache_dir(create=False)}: {count} entries, {human_bytes(size)} (limit {human_bytes(max_bytes())})"
