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
