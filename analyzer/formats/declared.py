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


def install(found: Callable[[str], object] | None) -> None:
    """Use `found` to look up an engine's declared facts (None: no engine is known, every such dump gets none)."""
    global lookup
    lookup = found
