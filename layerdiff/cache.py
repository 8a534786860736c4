"""Where every layerdiff cache lives: one root for harness builds, the arm64 runtime, conversions and
stored results, shared by the collector and the analyzer (neither owns it)."""
from __future__ import annotations

import os
from pathlib import Path


def user_cache_root() -> Path:
    """Root of every layerdiff cache (harness builds, arm64 runtime, conversions, stored results):
    one place to find, size and delete, following the XDG convention unless $LAYERDIFF_CACHE says."""
    override = os.environ.get("LAYERDIFF_CACHE")
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "layerdiff"
