"""Progress of a command's long steps, on stderr, so a minutes-long analysis is never silent.

On a terminal each step is a rich progress bar (transient: it leaves the screen as it was). Elsewhere
(a pipe, a log file, a test reading the output) nothing is written unless a step runs longer than
`PLAIN_AFTER` seconds; then one plain line every `PLAIN_EVERY` seconds and one when it ends, so a
slow step in CI still says where it is, and a quick command's output stays exactly what it was.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO

from layerdiff.safetext import terminal_text

PLAIN_AFTER = 10.0
PLAIN_EVERY = 15.0

Advance = Callable[[int, int], None]  # (done, total) of the running step


class Steps:
    """Reports the named steps of one command (`prog`: the command's name, the prefix of plain lines).

    `terminal`: draw bars (default: whether `stream` is a terminal). `Steps.quiet()` reports nothing
    (library calls, sweeps that draw their own display)."""

    def __init__(self, prog: str, stream: TextIO | None = None, terminal: bool | None = None,
                 enabled: bool = True) -> None:
        self.prog = prog
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = _is_terminal(self.stream) if terminal is None else terminal
        self.enabled = enabled

    @classmethod
    def quiet(cls) -> "Steps":
        return cls("", enabled=False)

    @contextmanager
    def step(self, title: str, total: int | None = None) -> Iterator[Advance]:
        """Run one step; the block calls the yielded `advance(done, total)` as it goes. The title may
        quote run labels: it is shown as plain text (layerdiff.safetext)."""
        if not self.enabled:
            yield _ignore
            return
        title = terminal_text(title)
        if self.terminal:
            with self._bar(title, total) as advance:
                yield advance
            return
        plain = _PlainStep(self, title, total)
        try:
            yield plain.advance
        finally:
            plain.finish()

    @contextmanager
    def _bar(self, title: str, total: int | None) -> Iterator[Advance]:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, stderr=self.stream is sys.stderr)
        with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as progress:
            task = progress.add_task(title, total=total)

            def advance(done: int, of: int) -> None:
                progress.update(task, completed=done, total=of)

            yield advance


class _PlainStep:
    """A step off the terminal: silent until it has run PLAIN_AFTER seconds, then a line now and then."""

    def __init__(self, steps: Steps, title: str, total: int | None) -> None:
        self.steps, self.title = steps, title
        self.start = self.last = time.monotonic()
        self.done, self.total = 0, total
        self.said = False

    def advance(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if now - self.start >= PLAIN_AFTER and (not self.said or now - self.last >= PLAIN_EVERY):
            self._say(f"{done}/{total}" if total else "running")

    def finish(self) -> None:
        if time.monotonic() - self.start >= PLAIN_AFTER:
            self._say("done")

    def _say(self, state: str) -> None:
        self.said, self.last = True, time.monotonic()
        elapsed = self.last - self.start
        print(f"{self.steps.prog}: {self.title}: {state} ({elapsed:.0f} s)", file=self.steps.stream, flush=True)


def _ignore(done: int, total: int) -> None:
    return None


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
