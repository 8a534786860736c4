"""A hash of the analyzer's own sources and of the engine declarations it reads: what produced a stored
measurement or report (a dump that does not record its engine's facts is read with its engine folder's
declaration, so editing one changes what such a dump's analysis gives).

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
    """A hash of every analyzer source file and of the engine declarations a dump without recorded facts is read
    with (formats/declared.py) (~1 ms)."""
    from layerdiff.analyzer.formats import declared

    package = Path(__file__).resolve().parents[1]  # the whole analyzer package, every room
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes())
    digest.update(b"\0declared\0" + (declared.sources() if declared.sources is not None else b""))
    return digest.hexdigest()[:16]
