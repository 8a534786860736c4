"""Option checks shared by the `collect` and `analyze` command lines.

A value outside a fixed set is a usage mistake, so it is reported the way click/typer report
every other one ("Usage: ... Error: Invalid value for '--backend': ...", exit 2), not as a content
error. Comma lists (`--backend cpu,vulkan`) are checked item by item.
"""
from __future__ import annotations

from typing import Callable, Iterable


def comma_items(values: Iterable[str] | str | None) -> list[str]:
    """`["cpu,vulkan", "opencl"]` → ["cpu", "vulkan", "opencl"], order kept, no repeats."""
    out: list[str] = []
    for value in [values] if isinstance(values, str) else values or []:
        for item in value.split(","):
            item = item.strip()
            if item and item not in out:
                out.append(item)
    return out


def choices(allowed: Iterable[str], what: str) -> Callable:
    """An option callback accepting only values (or comma items) from `allowed`."""
    allowed = tuple(allowed)

    def check(values):
        import typer  # here, not at the top: library modules use comma_items without the CLI stack

        for value in comma_items(values):
            if value not in allowed:
                raise typer.BadParameter(f"unknown {what} {value!r}; use one of {', '.join(allowed)}")
        return values

    return check


def check_number(flag: str, value: float, minimum: float, maximum: float | None = None, *,
                 above_minimum: bool = False, hint: str = "") -> None:
    """Refuse a numeric option that is NaN, infinite or out of range, naming the flag (UsageError,
    exit 1): `collect` and `analyze` check their numbers with this one rule."""
    import math
    import numbers

    from layerdiff.errors import UsageError

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"{flag} {value!r}: give a number, not {type(value).__name__}")
    low_ok = value > minimum if above_minimum else value >= minimum
    if not (math.isfinite(value) and low_ok and (maximum is None or value <= maximum)):
        bound = f"> {minimum:g}" if above_minimum else f">= {minimum:g}"
        span = f"from {minimum:g} to {maximum:g}" if maximum is not None else bound
        raise UsageError(f"{flag} {value}: give a finite number {span}{hint}")
