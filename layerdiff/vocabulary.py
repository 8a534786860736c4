"""The words layerdiff's files and commands share, each written once.

Every module, the CLI help and the docs read these tables instead of keeping copies (copies drift).
Values are exactly what the files carry, so reading and writing are unchanged.
"""
from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """A planned run's state in a sweep's `index.csv` (`status` column) and in a run's outcome."""

    PLANNED = "planned"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"
