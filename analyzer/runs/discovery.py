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
    if all(p.suffix.lower() in H5_SUFFIXES or p.is_dir() for p in entries):
        return hits  # nothing but HDF5 files: no other tool's dump to look for (the format readers stay unimported)
    try:
        from layerdiff.analyzer.importers import find_dumps
    except ImportError:  # the importers are optional: plain layerdiff dumps still work
        return hits + sorted(p.parent for p in root.rglob(RAW_MANIFEST))
    return list(dict.fromkeys(hits + find_dumps(root)))
