"""How a harness is started on a device: what a device's `prepare_harness` and an engine's own native
harness hand to the run (kept below both, so an engine can say how its program runs without importing a device)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HarnessInvocation:
    """How to start the harness on a device: the argv prefix and extra environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
