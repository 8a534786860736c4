"""`index.csv`: the one schema of a directory's index, whoever writes it.

Two writers share the file: a sweep (`collect`, collector/sweep/index.py) keeps one row per planned
run with its status, so a re-run resumes; `analyze merge` (analyzer/runs/merge.py) keeps one row per
gathered file with its provenance. A row of either kind is a dict of text by column; a directory may
hold both (runs merged into a sweep's output), and each writer keeps the other's rows as they are.
The header is exactly the columns of the kinds present, in this order: a sweep-only or merge-only
index is byte for byte what it always was, a mixed one has the sweep's columns then the merge's.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

from layerdiff.errors import StorageError

INDEX_NAME = "index.csv"
SWEEP_COLUMNS = ["serial", "engine", "backend", "precision", "input", "repeat", "status", "reason", "duration_s",
                 "files", "model_sha256", "input_sha256", "harness", "settings"]
MERGE_COLUMNS = [
    "file", "device_serial", "device_model", "backend_requested", "backend_actual", "precision_requested",
    "precision_effective", "input_label", "input_sha256", "engine", "engine_version", "model_name",
    "model_sha256", "complete", "source", "file_sha256",
]
ALL_COLUMNS = SWEEP_COLUMNS + [c for c in MERGE_COLUMNS if c not in SWEEP_COLUMNS]


def is_sweep_row(row: dict[str, str]) -> bool:
    """A planned run of a sweep (it has a status); otherwise a merged file (it has a `file`)."""
    return bool(row.get("status")) and not row.get("file")


def read_rows(out_dir: Path) -> list[dict[str, str]] | None:
    """Every row of `out_dir/index.csv` (missing columns as ""); [] without a file, None when the
    file is not an index of either kind (no `file` and no `status` column) or cannot be read."""
    path = Path(out_dir) / INDEX_NAME
    if not path.is_file():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or not {"file", "status"} & set(reader.fieldnames):
                return None
            return [{column: row.get(column) or "" for column in ALL_COLUMNS} for row in reader]
    except (OSError, csv.Error, UnicodeDecodeError):
        return None


def header_for(rows: list[dict[str, str]]) -> list[str]:
    """The columns of the kinds of row present (see the module docstring)."""
    sweep = any(is_sweep_row(r) for r in rows)
    merged = any(not is_sweep_row(r) for r in rows)
    if sweep and merged:
        return ALL_COLUMNS
    return MERGE_COLUMNS if merged else SWEEP_COLUMNS


def write_rows(out_dir: Path, rows: list[dict[str, str]]) -> Path:
    """Replace `out_dir/index.csv` whole (temporary name, then rename); the caller guards the disk."""
    path = Path(out_dir) / INDEX_NAME
    if os.path.lexists(path) and not path.is_file():
        raise StorageError(f"{path}: not a file (a folder or link where the index goes); move it away and re-run")
    partial = path.with_name(f".{INDEX_NAME}.partial")
    try:
        with open(partial, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=header_for(rows), restval="", extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
