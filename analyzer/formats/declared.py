"""Where the analyzer finds what an engine declares when a dump does not record it: a hook, empty by default.

The facts of a run travel in its header (`engine_facts`, formats/enginefacts.py). A dump written before the
header carried them, or imported from an engine's own tools, names only its engine; the facts that engine's
folder declares then come from `lookup`, which the program that composes analyzer and collector installs
(`layerdiff/__init__.py`). The analyzer never imports the collector, and this module imports nothing, so
installing the hook costs nothing at start-up; the registry is imported only when a dump needs it.
"""
from __future__ import annotations

from typing import Callable

# engine name -> that engine's declared EngineFacts, or None when no engine of that name is known
lookup: Callable[[str], object] | None = None
# () -> the bytes the declarations are made of: a stored result of a dump that does not record its facts
# depends on them, so the analyzer's code fingerprint (formats/fingerprint.py) takes them in
sources: Callable[[], bytes] | None = None


def install(found: Callable[[str], object] | None, made_of: Callable[[], bytes] | None = None) -> None:
    """Use `found` to look up an engine's declared facts (None: no engine is known, every such dump gets none),
    and `made_of` for the bytes of those declarations."""
    global lookup, sources
    lookup, sources = found, made_of
