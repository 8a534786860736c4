"""Gather runs from several people into one directory with an index of what each run is.

Runs of different models cannot be compared layer by layer, so a set mixing model sha256s is
refused unless the caller says it is intended. Foreign dumps are imported on the way in; a file
that cannot be read is reported and the rest are still gathered. Nothing is moved or deleted:
runs are copied (temporary name, then rename) and the index is rewritten atomically.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerdiff.errors import DumpFormatError, InputError, NothingToCompareError
from layerdiff.analyzer.importers import import_many_results
from layerdiff.analyzer.formats.index import INDEX_NAME, MERGE_COLUMNS, is_sweep_row, read_rows, write_rows
from layerdiff.analyzer.importers.hdf5dump import check_readable

INDEX_COLUMNS = MERGE_COLUMNS  # the schema is analyzer/formats/index.py's, shared with a sweep's index


@dataclass
class MergeResult:
    index: Path
    added: list[Path] = field(default_factory=list)
    skipped_duplicates: list[Path] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def merge(paths: list[Path | str], out_dir: Path | str, allow_model_mismatch: bool = False,
          attrs: dict[str, Any] | None = None) -> MergeResult:
    """Copy every readable run among `paths` into `out_dir` and (re)write `out_dir/index.csv`."""
    out_dir = Path(out_dir)
    imported, errors = import_many_results(list(paths), attrs)
    existing = read_index(out_dir)
    incoming = []
    for result in imported:
        try:
            incoming.append(_row(result.path, result.source or result.path))
        except DumpFormatError as err:  # a damaged run is reported like an unreadable one; the rest are gathered
            errors.append(str(err))
    if not incoming and not existing:
        raise NothingToCompareError(f"{out_dir}: nothing to merge ({'; '.join(errors) or 'no inputs'})")
    check_same_model(existing + [row for row, _ in incoming], allow_model_mismatch)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = MergeResult(index=out_dir / INDEX_NAME, errors=errors)
    rows = list(existing)
    known = {r["file_sha256"] for r in existing if r["file_sha256"]} | _sweep_file_sha256s(out_dir, existing)
    for row, path in incoming:
        if row["file_sha256"] in known:
            result.skipped_duplicates.append(path)
            continue
        target = _unique_target(out_dir, row)
        _copy_atomic(path, target)
        row["file"] = target.name
        rows.append(row)
        known.add(row["file_sha256"])
        result.added.append(target)
    write_index(out_dir, rows)
    return result


def _row(path: Path, source: Path) -> tuple[dict[str, str], Path]:
    attrs = check_readable(path)
    _check_tensors(path)
    row = {column: _text(attrs.get(column, "")) for column in INDEX_COLUMNS}
    row["source"] = str(source)
    row["file_sha256"] = _file_sha256(path)
    return row, path


def _check_tensors(path: Path) -> None:
    """Every tensor of a run read once before it is copied: a merged set is what others analyze, and
    a damaged chunk found then would be found far from where it came in."""
    from layerdiff.analyzer.formats.dumpfile import DumpFile, TensorBuffer

    with DumpFile(path) as dump:
        buffer = TensorBuffer()
        for order in dump.layers["order"].tolist():
            dump.tensor(int(order), buffer)


def check_same_model(rows: list[dict[str, str]], allow_model_mismatch: bool) -> None:
    """Refuse rows of different (known) model sha256s; unknown ("") sha256s never conflict."""
    by_model: dict[str, list[str]] = {}
    for row in rows:
        if row.get("model_sha256"):
            by_model.setdefault(row["model_sha256"], []).append(row.get("source") or row.get("file") or row.get("files") or "?")
    if len(by_model) > 1 and not allow_model_mismatch:
        groups = "; ".join(f"{sha[:12]}: {', '.join(files[:3])}{' ...' if len(files) > 3 else ''}" for sha, files in by_model.items())
        raise InputError(f"runs are of {len(by_model)} different models ({groups}); "
                             "pass --allow-model-mismatch to merge them anyway")


def read_index(out_dir: Path) -> list[dict[str, str]]:
    """Every row of the directory's index, a sweep's planned runs included (they stay as they are)."""
    rows = read_rows(out_dir)
    if rows is None:
        raise InputError(f"{out_dir / INDEX_NAME}: not a layerdiff index (neither a sweep's nor a merge's columns); "
                         "merge into an empty directory")
    return rows


def write_index(out_dir: Path, rows: list[dict[str, str]]) -> Path:
    return write_rows(out_dir, rows)


def _sweep_file_sha256s(out_dir: Path, rows: list[dict[str, str]]) -> set[str]:
    """The sha256 of every dump a sweep's rows name, so merging a run the sweep holds adds no copy."""
    names = {name for row in rows if is_sweep_row(row) for name in row["files"].split(";") if name}
    return {_file_sha256(out_dir / name) for name in names if (out_dir / name).is_file()}


def _unique_target(out_dir: Path, row: dict[str, str]) -> Path:
    parts = [row["device_serial"] or row["device_model"] or "unknown", row["engine"], row["backend_actual"] or row["backend_requested"],
             row["precision_requested"], row["input_label"]]
    stem = re.sub(r"[^A-Za-z0-9._+-]+", "-", "_".join(p for p in parts if p)).strip("-.") or "run"
    target = out_dir / f"{stem}.h5"
    counter = 2
    while target.exists():
        target = out_dir / f"{stem}-{counter}.h5"
        counter += 1
    return target


def _copy_atomic(source: Path, target: Path) -> None:
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _text(value: Any) -> str:
    if isinstance(value, float) and value != value:
        return ""
    return str(value)
