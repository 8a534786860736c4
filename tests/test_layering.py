"""Data flows one way, and the docs name only what exists.

The collector may import from the analyzer only the dump contract (analyzer/formats/), the
importers, and the analyzer's public entry (analyzer/analysis.py), besides layerdiff's root (errors,
vocabulary, cache, api); the analyzer never imports the collector or the samples. Every collector/ or
analyzer/ path README.md, docs/DESIGN.md and analyzer/FORMATS.md name is a file or folder that exists.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ALLOWED_ANALYZER_ROOMS = {"formats", "importers", "analysis"}
DOCS = ("README.md", "docs/DESIGN.md", "analyzer/FORMATS.md")
NAMED_PATH = re.compile(r"(?<![\w/.-])((?:collector|analyzer)/[A-Za-z0-9_./<>{}*-]*)")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports (top level or inside functions), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def offenders(folder: str, forbidden) -> list[str]:
    return [f"{path.relative_to(REPO)}:{line}: {module}"
            for path in sorted((REPO / folder).rglob("*.py"))
            for line, module in imported_modules(path) if forbidden(module)]


def test_the_collector_uses_only_the_analyzers_contract_importers_and_public_entry():
    def forbidden(module: str) -> bool:
        parts = module.split(".")
        return parts[:2] == ["layerdiff", "analyzer"] and (len(parts) < 3 or parts[2] not in ALLOWED_ANALYZER_ROOMS)

    bad = offenders("collector", forbidden)
    assert not bad, "the collector reaches into the analyzer's rooms:\n" + "\n".join(bad)


def test_the_analyzer_never_imports_the_collector():
    bad = offenders("analyzer", lambda m: m.startswith(("layerdiff.collector", "layerdiff.samples")))
    assert not bad, "\n".join(bad)


def test_the_docs_name_only_paths_that_exist():
    missing = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for match in NAMED_PATH.finditer(text):
            named = match.group(1).rstrip(".,:;)")
            if any(c in named for c in "<>{}*"):  # a pattern (collector/engines/<engine>/), not a path
                continue
            if not (REPO / named).exists():
                missing.append(f"{doc}:{text[:match.start()].count(chr(10)) + 1}: {named}")
    assert not missing, "named but not there:\n" + "\n".join(missing)


# The analyzer's rooms in the order data flows through them (docs/DESIGN.md); rooms of one stage share a rank:
# outputs/ and findings/ are the judge. `analysis` is analyzer/analysis.py.
ANALYZER_ROOMS = {"formats": 0, "importers": 1, "runs": 2, "align": 3, "measure": 4, "outputs": 5, "findings": 5,
                  "analysis": 6, "report": 7, "cli": 8}
# The collector's rooms in the order they build on each other: the native build machinery and the harness's
# processes, the engines (the registry, host engines, an engine's own native build), the devices that run
# them, then the stages a sweep uses.
COLLECTOR_ROOMS = {"harness": 0, "engines": 1, "transport": 2, "inputs": 3, "run": 4, "sweep": 5, "fix": 6,
                   "repro": 6, "cli": 7}


def later_room_imports(package: str, rooms: dict[str, int]) -> list[str]:
    """Every import (top level or inside a function) of a room ranked after the importing file's room."""
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        parts = path.relative_to(REPO / package).parts
        room = parts[0] if len(parts) > 1 else path.stem
        if room not in rooms:
            continue
        for line, module in imported_modules(path):
            target = module.split(".")
            if target[:2] == ["layerdiff", package] and len(target) > 2 and rooms.get(target[2], -1) > rooms[room]:
                bad.append(f"{path.relative_to(REPO)}:{line}: {room} imports {module}")
    return bad


def test_no_analyzer_room_imports_a_later_one():
    bad = later_room_imports("analyzer", ANALYZER_ROOMS)
    assert not bad, "data flows formats -> importers -> runs -> align -> measure -> judge -> report:\n" + "\n".join(bad)


def test_no_collector_room_imports_a_later_one():
    bad = later_room_imports("collector", COLLECTOR_ROOMS)
    assert not bad, "harness -> engines -> transport -> inputs -> run -> sweep -> fix -> cli:\n" + "\n".join(bad)


def test_measuring_knows_no_threshold():
    """The measure room never sees a judge's threshold: moving one re-judges, it never re-measures."""
    bad = [f"{path.relative_to(REPO)}: {word}" for path in sorted((REPO / "analyzer" / "measure").glob("*.py"))
           for word in ("Thresholds", "warn_rel_l2", "fail_rel_l2", "classify(") if word in path.read_text()]
    assert not bad, "\n".join(bad)
