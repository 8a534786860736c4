"""A hash of the analyzer's own sources: what produced a stored measurement or report.

A development install changes code without changing its version, so stored results are keyed by
this (`layerdiff.analyzer.measure.resultcache`, `layerdiff.analyzer.report.stored`). Imports nothing
heavy: a stored report is looked up before the analyzer is imported.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of every analyzer source file (~1 ms)."""
    package = Path(__file__).resolve().parents[1]  # the whole analyzer package, every room
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]
