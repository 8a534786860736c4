"""What a person watching `collect` sees: one live line per device plus a total bar on a terminal,
plain log lines (one per finished run) when stdout is not a terminal."""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from layerdiff.safetext import terminal_cell, terminal_lines, terminal_text
from layerdiff.vocabulary import RunStatus
from layerdiff.collector.sweep.plan import PlannedRun


class SweepProgress:
    """A `SweepObserver` (layerdiff.collector.sweep.execute) that draws progress and reports each finished run."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self._lock = threading.Lock()
        self._progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=False,
        ) if self.live else None
        self._device_tasks: dict[str, TaskID] = {}
        self._done: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._total_task: TaskID | None = None

    def __enter__(self) -> "SweepProgress":
        if self._progress:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress:
            self._progress.stop()

    def planned(self, runs: list[PlannedRun]) -> None:
        todo = [r for r in runs if r.todo]
        for run in runs:
            if not run.todo:
                hint = " (use --force to re-run)" if run.row.status == RunStatus.DONE else ""
                self._line(f"{run.row.status:8s}{run.device.serial} {run.spec.stem}: {run.row.reason}{hint}")
        if not self._progress:
            return
        for serial in dict.fromkeys(r.device.serial for r in todo):
            count = sum(1 for r in todo if r.device.serial == serial)
            self._device_tasks[serial] = self._progress.add_task(terminal_text(serial), total=count)
        if len(self._device_tasks) > 1 or len(todo) > 1:
            self._total_task = self._progress.add_task("total", total=len(todo))

    def started(self, run: PlannedRun) -> None:
        self._describe(run, "")

    def layer(self, run: PlannedRun, k: int, n: int, op: str) -> None:
        self._describe(run, f"layer {k}{'/' + str(n) if n else ''} {op[:28]}")

    def finished(self, run: PlannedRun) -> None:
        serial = run.device.serial
        with self._lock:
            self._done[serial] = self._done.get(serial, 0) + 1
            if run.row.status == RunStatus.FAILED:
                self._errors[serial] = self._errors.get(serial, 0) + 1
        if self._progress and serial in self._device_tasks:
            self._progress.advance(self._device_tasks[serial])
            if self._total_task is not None:
                self._progress.advance(self._total_task)
        self._describe(run, "idle")
        files = ", ".join(run.row.files)
        what = f"{serial} {run.spec.stem}"
        if run.row.status == RunStatus.FAILED:
            self._line(f"failed  {what}: {run.row.reason}" + (f" (partial dump kept: {files})" if files else ""))
        else:
            self._line(f"{run.row.status:8s}{what} -> {files}")

    def _describe(self, run: PlannedRun, doing: str) -> None:
        serial = run.device.serial
        if not self._progress or serial not in self._device_tasks:
            return
        errors = self._errors.get(serial, 0)
        note = f" [{errors} failed]" if errors else ""
        self._progress.update(self._device_tasks[serial],
                              description=terminal_text(f"{serial}{note} {run.spec.stem} {doing}".rstrip()))

    def _line(self, text: str) -> None:
        """One line that may quote names, reasons and labels: plain text, controls shown escaped."""
        text = terminal_lines(text)
        if self._progress:
            self._progress.console.print(Text(text), soft_wrap=True)
        else:
            print(text, file=sys.stderr, flush=True)

    def summary(self, runs: list[PlannedRun], out_dir: Path, interrupted: bool) -> None:
        if interrupted:
            self._line(f"interrupted: {out_dir / 'index.csv'} says what is done; re-run the same command to resume")
        if len(runs) < 2:
            return
        table = Table(title=terminal_cell(f"collected into {out_dir}"))
        for column in ("device", "run", "status", "seconds", "note"):
            table.add_column(column, overflow="fold")
        collapse = len(runs) > SUMMARY_ROWS
        shown = [run for run in runs if not (collapse and run.row.status == RunStatus.DONE)]
        for run in shown:
            row = run.row
            table.add_row(*map(terminal_cell, (row.serial, run.spec.stem, row.status, f"{row.duration_s:.1f}",
                                               row.reason[:100])))
        done = [run for run in runs if collapse and run.row.status == RunStatus.DONE]
        if done:  # a data set's runs: each was announced as it ended, a table of hundreds of rows only scrolls
            table.add_row("", f"{len(done)} runs", RunStatus.DONE, f"{sum(r.row.duration_s for r in done):.1f}",
                          "each named above and in index.csv")
        self.console.print(table)


SUMMARY_ROWS = 30  # a sweep of more runs lists only those that did not end done in its closing table


@contextmanager
def step_progress(console: Console, title: str) -> Iterator[Callable[[str, int, int], None]]:
    """A one-off set-up (the arm64 runtime) as a bar on a terminal, as numbered lines elsewhere."""
    if not console.is_terminal:
        yield lambda text, done, total: print(terminal_lines(f"{title} [{done}/{total}] {text}"), file=sys.stderr, flush=True)
        return
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task(title, total=None)

        def step(text: str, done: int, total: int) -> None:
            progress.update(task, description=terminal_text(f"{title}: {text}"), completed=done, total=total)

        yield step
