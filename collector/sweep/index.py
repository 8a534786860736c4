"""`index.csv`: one row per planned run of a sweep, the sweep's memory across interruptions.

It is rewritten whole, under a temporary name, after every state change, so at any instant the file
on disk is a complete, consistent account of what is done, failed, skipped or still planned, and a
re-run of the same command can resume from it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.vocabulary import RunStatus
from layerdiff.analyzer.formats.diskspace import writing
from layerdiff.analyzer.formats.index import INDEX_NAME, SWEEP_COLUMNS, is_sweep_row, read_rows, write_rows
from layerdiff.errors import LayerdiffError, StorageError, os_error_line

COLUMNS = SWEEP_COLUMNS  # the schema is analyzer/formats/index.py's, shared with `analyze merge`
STATUSES = tuple(status.value for status in RunStatus)


@dataclass
class IndexRow:
    serial: str
    engine: str
    backend: str
    precision: str
    input: str
    repeat: int = 1
    status: RunStatus | str = RunStatus.PLANNED
    reason: str = ""
    duration_s: float = 0.0
    files: list[str] = field(default_factory=list)
    model_sha256: str = ""
    input_sha256: str = ""
    harness: str = ""
    settings: str = ""  # the options that change a dump (pipeline.settings_text); "" in indexes written before it

    @property
    def key(self) -> tuple:
        return (self.serial, self.engine, self.backend, self.precision, self.input, self.repeat)

    def as_csv(self) -> dict:
        return {
            **{c: getattr(self, c) for c in COLUMNS if c not in ("files", "duration_s")},
            "duration_s": f"{self.duration_s:.2f}",
            "files": ";".join(self.files),
        }

    @classmethod
    def from_csv(cls, row: dict) -> "IndexRow":
        def number(text: str, kind, default):
            try:
                return kind(text)
            except (TypeError, ValueError):
                return default

        return cls(
            serial=row.get("serial", ""), engine=row.get("engine", ""), backend=row.get("backend", ""),
            precision=row.get("precision", ""), input=row.get("input", ""),
            repeat=number(row.get("repeat"), int, 1), status=row.get("status", RunStatus.PLANNED),
            reason=row.get("reason", ""), duration_s=number(row.get("duration_s"), float, 0.0),
            files=[f for f in (row.get("files") or "").split(";") if f],
            model_sha256=row.get("model_sha256", ""), input_sha256=row.get("input_sha256", ""),
            harness=row.get("harness", ""), settings=row.get("settings", ""),
        )


def read_index(out_dir: Path) -> dict[tuple, IndexRow]:
    """The sweep rows of an existing index by run key; an unreadable index is treated as absent
    (rows `analyze merge` added are not runs of this sweep: `Index` carries them through)."""
    rows = [IndexRow.from_csv(r) for r in read_rows(out_dir) or [] if is_sweep_row(r)]
    return {row.key: row for row in rows}


WRITE_EVERY_S = 1.0  # update_soon: the longest a finished data-set input waits for its index row


class Index:
    """The live index of a running sweep; thread-safe, persisted on every update (`update_soon`: within a second)."""

    def __init__(self, out_dir: Path, rows: list[IndexRow]) -> None:
        self.path = Path(out_dir) / INDEX_NAME
        self.rows = rows
        self.merged = [r for r in read_rows(out_dir) or [] if not is_sweep_row(r)]  # kept as they are
        self._lock = threading.Lock()  # the rows
        self._file_lock = threading.Lock()  # one writer of the file at a time, each with the rows as they are then
        self._writing = False  # an update_soon's write under way in the background
        self.write_error: LayerdiffError | None = None
        self._written = 0.0
        self.save()

    def update(self, row: IndexRow, **changes) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(row, name, value)
        self._write()

    def update_soon(self, row: IndexRow, **changes) -> None:
        """`update`, the file written at most every WRITE_EVERY_S and beside the caller: a data set's inputs finish
        faster than the whole file can be rewritten after each, and replacing a file can wait on the disk for
        a large part of a second, which the conversion that calls here would wait too (what a crash loses
        here, resume finds: the files)."""
        with self._lock:
            for name, value in changes.items():
                setattr(row, name, value)
            if self._writing or time.monotonic() - self._written < WRITE_EVERY_S:
                return
            self._writing = True
            self._written = time.monotonic()
        threading.Thread(target=self._write_behind, name="index-write", daemon=True).start()

    def save(self) -> None:
        """Write every row as it stands now (after a background write under way, if any)."""
        self._write()

    def _write_behind(self) -> None:
        try:
            self._write()
        except (OSError, RuntimeError) as err:  # said here as the writes in the caller's thread say it
            self.write_error = StorageError(f"{self.path}: {os_error_line(err) if isinstance(err, OSError) else err}")
        finally:
            with self._lock:
                self._writing = False

    def _write(self) -> None:
        """Replace the file whole; on a full disk the old file stays and the rows stay in memory
        (`write_error` says so, and the next write that fits catches up)."""
        with self._file_lock:
            with self._lock:
                self._written = time.monotonic()
                rows = [row.as_csv() for row in self.rows] + self.merged
            try:
                with writing(self.path):
                    write_rows(self.path.parent, rows)
                self.write_error = None
            except LayerdiffError as err:
                self.write_error = err

    def counts(self) -> dict[str, int]:
        with self._lock:
            out = {s: 0 for s in STATUSES}
            for row in self.rows:
                out[row.status] = out.get(row.status, 0) + 1
            return out
