"""Which files the user's arguments name: files as given, directories searched for dumps.

Apart from opening the runs (`layerdiff.analyzer.runs.sources`) because a re-analysis answered from a
stored report (`layerdiff.analyzer.report.stored`) must know the very files an analysis would read
without importing the analyzer (pandas).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

H5_SUFFIXES = {".h5", ".hdf5"}
RAW_MANIFEST = "manifest.jsonl"


def discover(paths: Iterable[Path | str]) -> tuple[list[tuple[Path, Path]], list[str]]:
    """Expand the user's arguments into (candidate dump, argument it came from), in order, no duplicates.

    Directories are searched recursively for dumps of every format the importers know (layerdiff
    `.h5`, raw dump directories, `.npz`, MNN text dumps, Polygraphy JSON, zips); files given
    explicitly are taken whatever their suffix (the importers decide what they are).
    """
    found: list[tuple[Path, Path]] = []
    problems: list[str] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            problems.append(f"{path}: no such file or directory")
        elif path.is_dir():
            candidates = _scan_dir(path)
            links = [c for c in candidates if c.is_symlink()]
            problems.extend(f"{c}: a symbolic link inside a folder is not followed; name the file it points to" for c in links)
            candidates = [c for c in candidates if not c.is_symlink()]
            if not candidates and not links:
                problems.append(f"{path}: no dumps inside (layerdiff .h5, raw dump directories or other tools' dumps)")
            found.extend((c, path) for c in candidates)
        elif not path.is_file():
            problems.append(f"{path}: not a regular file (a FIFO, device or socket); give a dump file or folder")
        else:
            found.append((path, path))
    unique: dict[Path, Path] = {}
    for candidate, origin in found:
        unique.setdefault(candidate.resolve(), origin)
    return list(unique.items()), problems


def _scan_dir(root: Path) -> list[Path]:
    if (root / RAW_MANIFEST).is_file():
        return [root]
    # every .h5 is a candidate even when unreadable, so a damaged file is reported, not silently skipped
    entries = list(root.rglob("*"))
    hits = sorted(p for p in entries if p.suffix.lower() in H5_SUFFIXES and p.is_file() and not p.name.startswith("."))
    reports = {p.parent for p in entries if p.name == REPORT_RESULTS and (p.parent / REPORT_PAGE).is_file()}
    if all(p.suffix.lower() in H5_SUFFIXES or p.is_dir() or _layerdiff_output(p, reports) for p in entries):
        return hits  # nothing but HDF5 files and layerdiff's own outputs: no other tool's dump to look for (the
        # format readers, h5py among their imports, stay unimported: a sweep's folder holds its index and report)
    try:
        from layerdiff.analyzer.importers import find_dumps
    except ImportError:  # the importers are optional: plain layerdiff dumps still work
        return hits + sorted(p.parent for p in root.rglob(RAW_MANIFEST))
    return list(dict.fromkeys(hits + find_dumps(root)))


REPORT_RESULTS, REPORT_PAGE = "results.json", "index.html"  # a report directory (analyzer/REPORT_SCHEMA.md)


def _layerdiff_output(path: Path, reports: set[Path]) -> bool:
    """A file layerdiff itself wrote beside the dumps: anything inside a report directory, a sweep's lock or a
    file half written, or a sweep's or a merge's index.csv (told by its header line, so another tool's CSV is
    still looked at)."""
    if any(folder in path.parents for folder in reports) or path.name.startswith(".layerdiff") \
            or path.name.endswith(".partial"):  # a sweep's lock, a file being written
        return True
    if path.name != "index.csv":
        return False
    from layerdiff.analyzer.formats.index import MERGE_COLUMNS, SWEEP_COLUMNS

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            header = f.readline(4096).strip()
    except OSError:
        return False
    return header in (",".join(SWEEP_COLUMNS), ",".join(MERGE_COLUMNS), ",".join(SWEEP_COLUMNS + [
        c for c in MERGE_COLUMNS if c not in SWEEP_COLUMNS]))
