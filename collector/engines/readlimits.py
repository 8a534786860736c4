"""How much memory and time reading a model's declared inputs may take (the reader runs in a child).

Why here: an engine's own reader checks a file against the memory limit before its library reads it (pymnn
reads the whole file first), and the collector's child that runs every reader enforces both; the engines
sit below the collector's input stage, so the limits live with them.
"""
from __future__ import annotations

import os

from layerdiff.analyzer.formats.limits import env_bytes, total_ram
from layerdiff.errors import UsageError

DEFAULT_READ_SECONDS = 120.0


def read_memory_limit() -> int:
    """Address space the child may use: enough for an engine library and a multi-GB model."""
    return env_bytes("LAYERDIFF_MODEL_READ_MEMORY", max(4 << 30, total_ram() // 2))


def read_seconds_limit() -> float:
    raw = os.environ.get("LAYERDIFF_MODEL_READ_SECONDS", "").strip()
    if not raw:
        return DEFAULT_READ_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UsageError(f"LAYERDIFF_MODEL_READ_SECONDS={raw!r}: expected a positive number of seconds")
    return value
