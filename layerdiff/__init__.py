"""layerdiff: run a model with every layer dumped on several engines, backends and precisions, then
find where the outputs part and why.

In a notebook (each name loads its part of layerdiff when first used; `import layerdiff` is cheap):

    import layerdiff
    done = layerdiff.collect("model.onnx", precisions=["high", "low"], inputs=["random:1"], out="runs")
    with layerdiff.analyze(done.out_dir) as result:     # or paths of dumps, or a sweep directory
        result.runs        # one row per run: provenance and verdict
        result.layers      # one row per aligned layer and run: every metric
        result.findings    # one row per finding: kind, run, layer, sentence, severity
        result.write_report("report")

Errors are `layerdiff.errors.LayerdiffError` subclasses (layerdiff/errors.py).
"""
from __future__ import annotations

_LAZY = {
    "analyze": ("layerdiff.api", "analyze"),
    "Results": ("layerdiff.api", "Results"),
    "collect": ("layerdiff.collector.sweep.collect", "collect"),
    "Collected": ("layerdiff.collector.sweep.collect", "Collected"),
}
__all__ = sorted(_LAZY)


def _declared_engine_facts(engine: str):
    """The facts the engine folder of this name declares (collector/engines/<engine>/), for a dump whose header
    does not record them; None for an unknown engine. The registry is imported on the first such dump."""
    try:
        from layerdiff.collector.engines import ENGINES
    except ImportError:  # an install without the collector reads such dumps as an engine that declares nothing
        return None
    found = ENGINES.get(engine)
    return found.facts if found is not None else None


def _engine_declarations() -> bytes:
    """The text of every engine folder's declaration (collector/engines/<folder>/__init__.py), read without
    importing the registry (the analyzer's stored results take it in: see analyzer/formats/declared.py)."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("layerdiff.collector.engines")
    except ImportError:
        return b""
    if spec is None or not spec.submodule_search_locations:
        return b""
    folder = Path(next(iter(spec.submodule_search_locations)))
    declarations = sorted(folder.glob("*/__init__.py"))
    return b"".join(path.parent.name.encode() + b"\0" + path.read_bytes() for path in declarations)


def _install_engine_lookup() -> None:
    """The analyzer knows no engine; the package that holds both halves tells it where engines are declared,
    so the notebook API, both commands and any program importing the analyzer read such dumps alike."""
    from layerdiff.analyzer.formats import declared

    declared.install(_declared_engine_facts, _engine_declarations)


_install_engine_lookup()


def __getattr__(name: str):
    """`layerdiff.analyze` & co. import their module on first use (the CLIs never pay for them)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'layerdiff' has no attribute {name!r}")
    import importlib

    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The lazy names too, so a notebook's tab completion offers `layerdiff.analyze` before its first use."""
    return sorted(set(globals()) | set(_LAZY))
