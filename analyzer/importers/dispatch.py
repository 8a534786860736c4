"""Format detection and the entry points: which importer reads a path, where its conversion is cached,
and `import_any` / `import_many` (the package's public names, re-exported lazily by `__init__`)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from layerdiff.analyzer.importers import convcache
from layerdiff.errors import DumpFormatError, InputError, LayerdiffError, UsageError
from layerdiff.analyzer.formats.limits import check_plain_file
from layerdiff.analyzer.importers import archive, hdf5dump, mnn_text, npyfiles, paddle_debug, paddle_profiler, polygraphy_json, rawdir
from layerdiff.analyzer.importers.common import ForeignDump, parse_set_options, write_dump

__all__ = ["ImportResult", "detect_format", "find_dumps", "import_any", "import_many", "import_one", "import_many_results",
           "parse_set_options", "SUPPORTED_FORMATS"]

ZIP_FORMAT = "zip"
_DETECTORS: list[tuple[str, Callable[[Path], bool]]] = [
    (rawdir.RAW_FORMAT, rawdir.detect_raw),
    (ZIP_FORMAT, archive.is_zip),
    (npyfiles.NPZ_FORMAT, npyfiles.detect_npz),
    (hdf5dump.H5_FORMAT, hdf5dump.detect_h5),
    (polygraphy_json.POLYGRAPHY_FORMAT, polygraphy_json.detect_polygraphy),
    (paddle_profiler.PROFILER_FORMAT, paddle_profiler.detect_paddle_profiler),
    (paddle_debug.DEBUG_FORMAT, paddle_debug.detect_paddle_debug),
    (mnn_text.MNN_FORMAT, mnn_text.detect_mnn_text),
    (npyfiles.NPY_FORMAT, npyfiles.detect_npy_dir),
]
SUPPORTED_FORMATS = tuple(name for name, _ in _DETECTORS)
MAX_SCAN_DEPTH = 3
# Part of every cache key: bump it when an importer's output changes (e.g. op types inferred), so a
# conversion cached by an older version is made again instead of reused.
IMPORT_VERSION = 2


@dataclass
class ImportResult:
    """Where the HDF5 went and what could not be used (one line each, naming file and layer)."""

    path: Path
    format: str
    problems: list[str] = field(default_factory=list)
    source: Path | None = None


def detect_format(path: Path | str) -> str | None:
    """The format name of a dump file or directory, or None if it is none we read."""
    path = Path(path)
    for name, detect in _DETECTORS:
        try:
            if detect(path):
                return name
        except OSError:
            return None
    return None


def import_any(path: Path | str, attrs: dict[str, Any] | None = None, out: Path | str | None = None, **options: Any) -> Path:
    """Convert any supported dump to a layerdiff HDF5 and return its path.

    `attrs` (e.g. from `--set`) override what the format carries. Without `out` the file goes to
    a cache directory keyed by the source's content stamp, so repeated analyses convert once.
    A layerdiff HDF5 given without `attrs` and `out` is validated and used in place.
    Options: format, order_file, shapes_file, include_inputs (MNN), runner, iteration (Polygraphy),
    topo_file (Paddle-Lite model_debug_tool).
    """
    return import_one(path, attrs, out, **options).path


def import_one(path: Path | str, attrs: dict[str, Any] | None = None, out: Path | str | None = None, **options: Any) -> ImportResult:
    """`import_any` that also returns the format and the layers it could not use (for warnings)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if not path.is_dir():
        check_plain_file(path, follow=True)  # a FIFO would block the format detection forever
    fmt = options.pop("format", None) or detect_format(path)
    if fmt is None:
        raise DumpFormatError(f"{path}: not a dump layerdiff can read (supported: {', '.join(SUPPORTED_FORMATS)})")
    if fmt not in SUPPORTED_FORMATS:
        raise UsageError(f"--format {fmt}: unknown format (supported: {', '.join(SUPPORTED_FORMATS)})")
    try:
        result = _import(path, fmt, attrs or {}, None if out is None else Path(out), options)
        result.source = result.source or path
        return result
    except RecursionError:
        raise DumpFormatError(f"{path}: structure nested too deeply to be a {fmt} dump") from None
    except OSError as err:
        where = f" {err.filename}" if getattr(err, "filename", None) else ""
        raise DumpFormatError(f"{path}: {fmt} import failed ({err.strerror or err}{where})") from None


def _import(path: Path, fmt: str, attrs: dict[str, Any], out: Path | None, options: dict[str, Any]) -> ImportResult:
    if fmt == ZIP_FORMAT:
        return _import_zip(path, attrs, out, options)
    if fmt == hdf5dump.H5_FORMAT and not attrs and out is None:
        hdf5dump.check_readable(path)
        return ImportResult(path, fmt)
    target = out if out is not None else cache_path(path, fmt, attrs, options)
    if out is None and target.is_file():
        convcache.touch(target)
        return ImportResult(target, fmt)
    if fmt == rawdir.RAW_FORMAT:
        result = ImportResult(target, fmt, rawdir.import_raw(path, target, attrs))
    else:
        result = ImportResult(target, fmt, write_dump(_read_foreign(path, fmt, options), target, attrs))
    if out is None:
        _bound_cache(target)
    return result


def _bound_cache(added: Path) -> None:
    """Keep the cache within its limit after an addition; a trim that cannot run (a full disk, a cache folder
    gone) leaves the cache as it is for the next one, never failing the conversion just made."""
    try:
        convcache.trim(keep=added)
    except OSError:
        pass


def _read_foreign(path: Path, fmt: str, options: dict[str, Any]) -> ForeignDump:
    order_file = options.get("order_file")
    if fmt == npyfiles.NPZ_FORMAT:
        return npyfiles.read_npz(path, order_file)
    if fmt == npyfiles.NPY_FORMAT:
        return npyfiles.read_npy_dir(path, order_file)
    if fmt == mnn_text.MNN_FORMAT:
        return mnn_text.read_mnn_text(path, order_file, options.get("shapes_file"), bool(options.get("include_inputs")))
    if fmt == polygraphy_json.POLYGRAPHY_FORMAT:
        return polygraphy_json.read_polygraphy(path, options.get("runner"), int(options.get("iteration") or 0))
    if fmt == hdf5dump.H5_FORMAT:
        return hdf5dump.read_h5(path)
    if fmt == paddle_profiler.PROFILER_FORMAT:
        return paddle_profiler.read_paddle_profiler(path)
    if fmt == paddle_debug.DEBUG_FORMAT:
        return paddle_debug.read_paddle_debug(path, options.get("topo_file"))
    raise InputError(f"{path}: format {fmt} cannot be converted")


def _import_zip(path: Path, attrs: dict[str, Any], out: Path | None, options: dict[str, Any]) -> ImportResult:
    dumps = find_dumps(extracted(path))
    if len(dumps) != 1:
        raise DumpFormatError(f"{path}: holds {len(dumps)} dumps, not one; give it to `analyze` or `analyze merge`, which take sets")
    return import_one(dumps[0], attrs, out, **options)


def extracted(path: Path) -> Path:
    """The zip extracted once into the cache (under a temporary name, renamed when complete)."""
    dest = convcache.cache_dir() / f"zip-{_stamp(path)}"
    if dest.is_dir():
        convcache.touch(dest)
        return dest
    partial = dest.with_name(dest.name + f".partial-{os.getpid()}")
    archive.extract_zip(path, partial)  # removes what it wrote when the archive is refused
    try:
        os.replace(partial, dest)
    except OSError:  # another process finished the same extraction first
        shutil.rmtree(partial, ignore_errors=True)
    _bound_cache(dest)
    return dest


def find_dumps(root: Path, depth: int = 0) -> list[Path]:
    """Dumps in a directory tree (a dump directory is not searched inside), in name order."""
    fmt = detect_format(root)
    if fmt is not None and (fmt != ZIP_FORMAT or depth == 0):
        return [root]
    if not root.is_dir() or root.is_symlink() or depth >= MAX_SCAN_DEPTH:
        return []
    found: list[Path] = []
    for child in sorted(root.iterdir()):
        if child.name.startswith(".") or child.is_symlink():
            continue
        if child.is_dir() or detect_format(child) not in (None, ZIP_FORMAT):
            found.extend(find_dumps(child, depth + 1))
    return found


def import_many(paths: list[Path | str], attrs: dict[str, Any] | None = None, **options: Any) -> tuple[list[Path], list[str]]:
    """Import a set of dumps; a bad one adds an error line and the rest still import.

    Directories that are not themselves dumps, and zips, are searched for dumps. The error list
    holds one line per refused file and one per skipped layer, each naming the file.
    """
    results, errors = import_many_results(paths, attrs, **options)
    return [r.path for r in results], errors


def import_many_results(paths: list[Path | str], attrs: dict[str, Any] | None = None, **options: Any) -> tuple[list[ImportResult], list[str]]:
    """`import_many` keeping each result's source and format (for indexes and reports)."""
    results: list[ImportResult] = []
    errors: list[str] = []
    for source in _expand(paths, errors):
        try:
            result = import_one(source, attrs, None, **dict(options))
        except LayerdiffError as err:
            errors.append(str(err))
            continue
        results.append(result)
        errors.extend(result.problems)
    return results, errors


def _expand(paths: list[Path | str], errors: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        try:
            fmt = detect_format(path)
            if fmt == ZIP_FORMAT:
                found = find_dumps(extracted(path))
            elif fmt is None and path.is_dir():
                found = find_dumps(path)
            else:
                found = [path]
        except LayerdiffError as err:
            errors.append(str(err))
            continue
        if not found:
            errors.append(f"{path}: no dump found here (supported: {', '.join(SUPPORTED_FORMATS)})")
        out.extend(found)
    return out


def cache_path(path: Path, fmt: str, attrs: dict[str, Any], options: dict[str, Any]) -> Path:
    key = json.dumps([IMPORT_VERSION, str(path.resolve()), fmt, _stamp(path), attrs,
                      {k: str(v) for k, v in options.items()}],
                     sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return convcache.cache_dir() / f"{path.stem or 'dump'}-{digest}.h5"


def _stamp(path: Path, limit: int = 100_000) -> str:
    """A cheap content stamp: names, sizes and modification times of the file or tree."""
    digest = hashlib.sha256(str(path.resolve()).encode())
    entries = [path] if path.is_file() else sorted(p for p in path.rglob("*"))[:limit]
    for entry in entries:
        try:
            st = entry.stat()
        except OSError:
            continue
        digest.update(f"{entry.relative_to(path) if entry != path else ''}|{st.st_size}|{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]
