"""What a person watching `collect` sees: a live bar per run on a terminal, plain lines otherwise."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from collector.devices import Device
from collector.run import RunOutcome, RunSpec


class RunProgress:
    """Progress for a sequence of runs; on a non-terminal prints one line per finished run."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console, transient=True,
        ) if self.live else None

    def __enter__(self) -> "RunProgress":
        if self._progress:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress:
            self._progress.stop()

    def for_run(self, device: Device, spec: RunSpec) -> Callable[[int, int, str], None] | None:
        if not self._progress:
            return None
        task = self._progress.add_task(f"{device.serial} {spec.stem}", total=None)

        def update(k: int, n: int, op: str) -> None:
            self._progress.update(task, completed=k, total=n or None, description=f"{device.serial} {spec.stem} {op[:30]}")

        return update

    def finished(self, outcome: RunOutcome) -> None:
        if self._progress:
            for task in list(self._progress.tasks):
                self._progress.remove_task(task.id)
        files = ", ".join(str(p) for p in outcome.paths)
        what = f"{outcome.serial} {outcome.spec.stem}"
        if outcome.status == "failed":
            line = f"failed  {what}: {outcome.message}" + (f" (partial dump kept: {files})" if files else "")
        else:
            line = f"{outcome.status:7s} {what} -> {files}" + (f" ({outcome.message})" if outcome.message else "")
        print(line, file=sys.stderr, flush=True)

    def summary(self, outcomes: list[RunOutcome], out_dir: Path) -> None:
        if len(outcomes) < 2:
            return
        table = Table(title=f"collected into {out_dir}")
        for column in ("device", "run", "status", "seconds", "note"):
            table.add_column(column)
        for o in outcomes:
            table.add_row(o.serial, o.spec.stem, o.status, f"{o.duration_s:.1f}", o.message[:80])
        self.console.print(table)
