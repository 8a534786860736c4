"""Safe extraction of a `.zip` a colleague sent: no path escapes, no links, bounded size.

Member names that are absolute, contain `..`, drive letters or backslash tricks, and members that
are symbolic links, are refused before anything is written. Sizes are counted while extracting
(a member's declared size can lie), so a zip bomb stops at the limit instead of filling the disk.
"""
from __future__ import annotations

import shutil
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.formats.limits import MAX_EXTRACT_BYTES, MAX_EXTRACT_RATIO, extract_limit, human_bytes

MAX_MEMBERS = 200_000
_BLOCK = 1 << 20


def is_zip(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".zip" and zipfile.is_zipfile(path)


def safe_member_path(name: str, archive: Path) -> PurePosixPath:
    """The relative path a member may be written to; refuses anything that escapes."""
    if "\x00" in name or "\\" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise DumpFormatError(f"{archive}: member {name!r} has an absolute or unsafe path; archive refused")
    parts = PurePosixPath(name).parts
    if any(part == ".." for part in parts) or not parts:
        raise DumpFormatError(f"{archive}: member {name!r} escapes the archive directory; archive refused")
    return PurePosixPath(*parts)


def extract_zip(archive: Path, dest: Path, max_bytes: int | None = None) -> Path:
    """Extract every member under `dest` (created); returns `dest`. All-or-nothing on refusal.

    `max_bytes` defaults to limits.extract_limit of the archive's size (a 23 MB zip of zeros could
    otherwise write 23 GB before an absolute cap alone stopped it)."""
    if max_bytes is None:
        max_bytes = extract_limit(archive.stat().st_size)
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            _check_members(infos, archive)
            dest.mkdir(parents=True, exist_ok=True)
            try:
                _extract_all(zf, infos, archive, dest, max_bytes)
            except BaseException:
                shutil.rmtree(dest, ignore_errors=True)
                raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as err:
        raise DumpFormatError(f"{archive}: corrupt or unsupported zip archive ({err})") from None
    except OSError as err:
        raise DumpFormatError(f"{archive}: cannot extract ({err.strerror or err})") from None
    return dest


def _check_members(infos: list[zipfile.ZipInfo], archive: Path) -> None:
    if len(infos) > MAX_MEMBERS:
        raise DumpFormatError(f"{archive}: {len(infos)} members, more than any set of dumps")
    for info in infos:
        safe_member_path(info.filename, archive)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise DumpFormatError(f"{archive}: member {info.filename!r} is a symbolic link; archive refused")


def _extract_all(zf: zipfile.ZipFile, infos: list[zipfile.ZipInfo], archive: Path, dest: Path, max_bytes: int) -> None:
    total = 0
    for info in infos:
        target = dest.joinpath(*safe_member_path(info.filename, archive).parts)
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as out:
            while block := src.read(_BLOCK):
                total += len(block)
                if total > max_bytes:
                    raise DumpFormatError(
                        f"{archive}: extracts to more than {human_bytes(max_bytes)} ({MAX_EXTRACT_RATIO}x its size, at most "
                        f"{human_bytes(MAX_EXTRACT_BYTES)}); archive refused (set LAYERDIFF_MAX_EXTRACT_RATIO or "
                        "LAYERDIFF_MAX_EXTRACT_BYTES to allow it)"
                    )
                out.write(block)
