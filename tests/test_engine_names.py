"""An engine is its folder: product code outside collector/engines/ does not name engines.

What counts: in every Python file of analyzer/ (outside analyzer/importers/, the readers of foreign formats: see
FOREIGN_FORMATS), collector/ (outside collector/engines/) and layerdiff/, each
identifier (a name, attribute, function, class, argument, keyword or imported module) and each string
literal that is not a docstring, whose words (split at anything not a letter or digit, and at camelCase)
include an engine's word: a registered engine's name or folder, the Python module it runs (`MNN`,
`onnxruntime`), and the names its models and users know it by (`tflite`, `llama`). Docstrings and comments
are documentation and do not count; neither do docs/ and tests/. Each node counts once.

What the analyzer must know about an engine travels as data in the dump (analyzer/formats/enginefacts.py);
what the collector must know is read from the registry (collector/engines/__init__.py). No file outside the
engine folders holds an engine's name (`ALLOWED` would list one, with its reason).
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from layerdiff.collector.engines import ENGINE_FOLDERS, ENGINES

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("analyzer", "collector", "layerdiff")
ENGINE_FOLDER = REPO / "collector" / "engines"
# The readers of foreign formats: files other tools write (MNN's dump folders and console logs, Paddle-Lite's debug
# tool and profiler, Polygraphy's JSON of ONNX Runtime outputs). A foreign format is named after the tool that
# writes it, and the analyzer-only install reads them without the collector (tests/test_layering.py), so they are a
# room of the analyzer, not engine folders: the room is documentation of those formats, as docs/ is. Outside it,
# product code reaches a reader by the format it detects (an import of `importers.mnn_text` elsewhere counts).
FOREIGN_FORMATS = REPO / "analyzer" / "importers"
ALIASES = {"tflite", "llama"}  # what a model file or a user calls an engine besides its registered name
GENERIC = {"lite", "ai", "edge"}  # words of engine names that are ordinary words on their own (sqlite, edge)

# file -> (most engine words it may hold, why it holds them): none holds any.
ALLOWED: dict[str, tuple[int, str]] = {}


def engine_words() -> set[str]:
    words = set(ALIASES)
    for folder, engine in zip(ENGINE_FOLDERS, ENGINES.values()):
        for text in (folder, engine.name, engine.library):
            words |= {w for w in split_words(text)}
    return words - GENERIC


def split_words(text: str) -> list[str]:
    """`paddle_lite` -> paddle, lite; `MNNForward` -> mnn, forward; `read_ncnn_param` -> read, ncnn, param."""
    return [part.lower() for token in re.findall(r"[A-Za-z0-9]+", text)
            for part in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", token)]


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _texts(node: ast.AST, docstrings: set[int]) -> list[str]:
    """The identifier(s) or string a node holds, as the module docstring defines what counts."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword) and node.arg:
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.name, node.asname or ""]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        return [node.value]
    return []


def engine_names_in(path: Path, words: set[str]) -> list[str]:
    """`line: text` for every node of `path` that names an engine."""
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    return [f"{getattr(node, 'lineno', 0)}: {text[:60]!r}" for node in ast.walk(tree)
            for text in _texts(node, docstrings) if words & set(split_words(text))][:10_000]


def product_files() -> list[Path]:
    return [path for root in PRODUCT for path in sorted((REPO / root).rglob("*.py"))
            if ENGINE_FOLDER not in path.parents and FOREIGN_FORMATS not in path.parents]


@functools.lru_cache(maxsize=1)
def counts() -> dict[str, list[str]]:
    words = engine_words()
    found = {str(path.relative_to(REPO)): engine_names_in(path, words) for path in product_files()}
    return {name: hits for name, hits in found.items() if hits}


def test_product_code_outside_the_engine_folders_names_no_engine_beyond_its_allowance():
    over = []
    for name, hits in sorted(counts().items()):
        allowed = ALLOWED.get(name, (0, ""))[0]
        if len(hits) > allowed:
            over.append(f"{name}: {len(hits)} engine names (allowed {allowed}):\n    " + "\n    ".join(hits))
    assert not over, ("an engine's knowledge belongs in its folder (collector/engines/<engine>/) and reaches the "
                      "analyzer through the dump's engine_facts:\n" + "\n".join(over))


def test_the_allowances_are_tight():
    """An allowance larger than today's count would let a name back in: lower it as names leave."""
    found = counts()
    loose = [f"{name}: allowed {allowed}, holds {len(found.get(name, []))}"
             for name, (allowed, _) in ALLOWED.items() if len(found.get(name, [])) != allowed]
    assert not loose, "\n".join(loose)


def test_the_counter_sees_names_and_skips_documentation(tmp_path):
    """The rules above on a file of each kind: identifiers and strings count, docstrings and comments do not."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""About ncnn."""\n'
                      '# mnn in a comment\n'
                      'def read_ncnn_param(path):\n'
                      '    """ncnn again."""\n'
                      '    return engine == "ggml" or path.endswith(".tflite") or sorting or MNNForward\n')
    hits = engine_names_in(sample, engine_words())
    assert [h.split(":")[0] for h in hits] == ["3", "5", "5", "5"], hits


def test_a_registered_engine_is_known_only_to_its_folder_and_the_registry():
    """Adding a local engine touches its folder and its name in ENGINE_FOLDERS: every registered engine's
    folder exists with its ENGINE and host engine, and no product file outside the folders lists the engines."""
    for folder, engine in zip(ENGINE_FOLDERS, ENGINES.values()):
        assert (ENGINE_FOLDER / folder / "__init__.py").is_file() and (ENGINE_FOLDER / folder / "engine.py").is_file()
        assert engine.package == f"layerdiff.collector.engines.{folder}"
    words = engine_words()
    listing = [name for name, hits in counts().items()
               if len({w for h in hits for w in split_words(h) if w in words}) >= len(ENGINES)]
    assert not listing, f"these files list every engine (the registry is the one list): {listing}"
