"""What a harness build is doing, shown while it runs (it can take ten minutes on a laptop).

The build scripts announce each step on stdout (`layerdiff-build-step: NAME LOG`, from
`ld_quiet` in device_scripts/build_common.sh) and ninja writes `[N/M]` lines into the step's log.
`BuildWatcher` reads both and reports to a sink: a rich progress bar on a terminal, plain lines
(at most one every `PLAIN_EVERY_S` seconds, and at each new step) in CI logs and pipes. Before the
first step it says what is built, why, and roughly how long it takes, so a first `collect` on a
phone never sits silent for minutes.
"""
from __future__ import annotations

import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

STEP_MARK = "layerdiff-build-step:"
PLAIN_EVERY_S = 30.0
_NINJA = re.compile(rb"\[(\d+)/(\d+)\]")
_STEP_VERBS = {"configure": "configuring", "build": "compiling", "install": "installing"}


def step_text(step: str) -> str:
    """A build script's step (`harness-build`, `<library>-configure`) as a user reads it (`compiling the harness`)."""
    subject, _, verb = step.rpartition("-")
    if not subject or verb not in _STEP_VERBS:
        return step
    return f"{_STEP_VERBS[verb]} {'the harness' if subject == 'harness' else subject}"


@dataclass
class BuildStatus:
    """One moment of a build: the step, and ninja's count within it when known."""

    step: str
    done: int = 0
    total: int = 0
    elapsed_s: float = 0.0

    def line(self) -> str:
        count = f" {self.done}/{self.total}" if self.total else ""
        return f"{step_text(self.step)}{count} ({self.elapsed_s:.0f} s)"


class BuildReporter(Protocol):
    def started(self, what: str) -> None: ...
    def update(self, status: BuildStatus) -> None: ...
    def finished(self, ok: bool, elapsed_s: float) -> None: ...


def estimate_minutes(target: str, *, vulkan: bool, library_cached: bool, test_build: bool) -> int:
    """Rough build time on a 2-core machine (measured: a library built from source with Vulkan ~11 min, for
    aarch64 ~7, the harness alone ~1)."""
    if library_cached:
        return 1
    base = 11 if vulkan else (7 if target == "aarch64" else 6)
    return max(2, round(base * (0.6 if test_build else 1.0)))


class PlainReporter:
    """Plain lines on a stream: what CI logs and pipes get."""

    def __init__(self, stream=None, every_s: float = PLAIN_EVERY_S) -> None:
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._last_step = ""
        self._last_time = 0.0

    def _say(self, text: str) -> None:
        print(f"harness: {text}", file=self.stream, flush=True)

    def started(self, what: str) -> None:
        self._say(what)

    def update(self, status: BuildStatus) -> None:
        now = time.monotonic()
        if status.step != self._last_step or now - self._last_time >= self.every_s:
            self._last_step, self._last_time = status.step, now
            self._say(status.line())

    def finished(self, ok: bool, elapsed_s: float) -> None:
        self._say(f"{'built' if ok else 'build failed'} after {elapsed_s:.0f} s")


class RichReporter:
    """A progress bar on a terminal (rich), one task per build."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
        self.task = None

    def started(self, what: str) -> None:
        self.console.print(f"harness: {what}", markup=False, highlight=False)
        self.progress.start()
        self.task = self.progress.add_task("starting", total=None)

    def update(self, status: BuildStatus) -> None:
        self.progress.update(self.task, description=step_text(status.step),
                             completed=status.done, total=status.total or None)

    def finished(self, ok: bool, elapsed_s: float) -> None:
        self.progress.stop()
        self.console.print(f"harness: {'built' if ok else 'build failed'} after {elapsed_s:.0f} s",
                           markup=False, highlight=False)


def default_reporter() -> BuildReporter:
    """A bar on an interactive terminal, plain lines anywhere else."""
    from rich.console import Console

    console = Console(stderr=True)
    return RichReporter(console) if console.is_terminal else PlainReporter()


class BuildWatcher:
    """Follows one build: feed it the script's stdout lines; it polls the current step's log."""

    def __init__(self, reporter: BuildReporter, poll_s: float = 1.0) -> None:
        self.reporter = reporter
        self.poll_s = poll_s
        self._status = BuildStatus("preparing")
        self._log: Path | None = None
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="harness-build-progress", daemon=True)

    def start(self, what: str) -> None:
        self.reporter.started(what)
        self._thread.start()

    def feed(self, line: str) -> None:
        """A line of the build script's stdout; step marks switch the log being followed."""
        if line.startswith(STEP_MARK):
            parts = line[len(STEP_MARK):].split(maxsplit=1)
            if parts:
                self._status = BuildStatus(parts[0])
                self._log = Path(parts[1].strip()) if len(parts) > 1 else None
                self._report()

    def stop(self, ok: bool) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.reporter.finished(ok, time.monotonic() - self._start)

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_s):
            done_total = _last_ninja_count(self._log) if self._log else None
            if done_total:
                self._status.done, self._status.total = done_total
            self._report()

    def _report(self) -> None:
        self._status.elapsed_s = time.monotonic() - self._start
        self.reporter.update(self._status)


def _last_ninja_count(log: Path) -> tuple[int, int] | None:
    """The last `[N/M]` in the tail of a ninja log."""
    try:
        with open(log, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 8192))
            tail = handle.read()
    except OSError:
        return None
    matches = _NINJA.findall(tail)
    return (int(matches[-1][0]), int(matches[-1][1])) if matches else None

