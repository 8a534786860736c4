"""The finding record: one thing worth telling the user, as a sentence and as data.

Its own module because every module that produces findings (findings.py: per-layer questions,
trends.py: how the error develops over depth and inputs) and every writer (tables, report, JSON)
shares it, and none of them should import the others for it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

MAX_NAMED = 4  # layers named in one sentence before "..."


@dataclass
class Finding:
    """One thing worth telling the user, as a sentence and as data (`--json` prints `as_dict`)."""

    kind: str
    run: str
    layer: str
    op_type: str
    sentence: str
    severity: str = "fail"  # fail | warn | info
    numbers: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def named(keys: list[str]) -> str:
    """'a:0, b:0, c:0' for a sentence, cut after a few names."""
    return ", ".join(keys[:MAX_NAMED]) + (", ..." if len(keys) > MAX_NAMED else "")
