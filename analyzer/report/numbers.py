"""How every number reads on screen, in tables and on the console: one rule, no heavy imports.

Kept apart from `tables` (which needs pandas) so `analyze --help`, `analyze inspect` and the
console summary format numbers without importing pandas (0.2 s CPU of a 0.4 s start-up).
"""
from __future__ import annotations

import math


def format_number(value) -> str:
    """Four significant digits, `inf`/`nan` spelled out, integers as integers, zero as `0`.

    Only a missing value (None, NaN: "not measured") is blank."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    return str(value)
