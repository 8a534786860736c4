"""The report directory: checked before any work, written file by file under temporary names.

A report is often regenerated in place; a crash half-way must not leave a truncated index.html
next to a fresh summary.csv, so each file appears only when complete. A directory that holds
something other than a previous report is never written into without `--force`.
"""
from __future__ import annotations

from pathlib import Path

from layerdiff.analyzer.formats.atomic import atomic_write_bytes, atomic_write_chunks, atomic_write_text  # noqa: F401
from layerdiff.errors import StorageError

REPORT_MARKERS = ("index.html", "results.json", "summary.csv")
WRITING_MARKER = ".layerdiff-report-writing"  # present while a report is being written; a process killed
# mid-write (kill -9 during its first file) leaves it, so the same analyze re-run recognises its own half-written output


def prepare_out_dir(path: Path | str, force: bool = False) -> Path:
    """Create the report directory, refusing a file or a non-empty directory that is not a report."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise StorageError(f"{out}: exists and is not a directory; choose another -o")
    if out.is_dir() and any(out.iterdir()) and not force:
        if not any((out / name).exists() for name in (*REPORT_MARKERS, WRITING_MARKER)):
            raise StorageError(f"{out}: directory is not empty and holds no layerdiff report; "
                                 "choose another -o or pass --force")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StorageError(f"{out}: cannot create the report directory ({err.strerror})") from None
    try:
        (out / WRITING_MARKER).touch()
    except OSError:
        pass  # the report files' own writes will say what is wrong with the directory
    return out


def finish_out_dir(out: Path | str) -> None:
    """The report is complete: its own files mark the directory from now on."""
    try:
        (Path(out) / WRITING_MARKER).unlink(missing_ok=True)
    except OSError:
        pass


def holds_nothing_written(out: Path) -> bool:
    """Only the writing marker is there: nothing of a report was written (the caller may remove it)."""
    return all(entry.name == WRITING_MARKER for entry in out.iterdir())
