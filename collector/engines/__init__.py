"""The engine registry: every engine layerdiff runs is one folder here, listed once in `ENGINE_FOLDERS`.

Each folder declares its `ENGINE` (collector/engines/base.py: name, model suffixes, backends, where it
runs, model files, declared inputs) in its `__init__.py` and implements the host engine in its
`engine.py`. Everything that needs an engine (model resolution, `random` inputs, the `local` and
`arm64` devices, `--engine`/`--backend` checks and help, the phone harness builds) reads this table,
so adding an engine is its folder plus one name below (docs/DESIGN.md, "How to add an engine").
"""
from __future__ import annotations

import importlib
from dataclasses import replace

from layerdiff.collector.engines.base import Engine
from layerdiff.vocabulary import BACKENDS

ENGINE_FOLDERS = ("mnn", "ncnn", "ort", "paddle", "paddle_lite", "litert", "ggml")  # the registry: one folder name per engine


def _declared(folder: str) -> Engine:
    package = f"{__name__}.{folder}"
    engine = importlib.import_module(package).ENGINE
    unknown = [b for b in engine.backends if b not in BACKENDS]
    if unknown:  # a new backend name belongs in layerdiff/vocabulary.py first (help texts, reports)
        raise RuntimeError(f"{package}: backend(s) {unknown} are not in layerdiff.vocabulary.BACKENDS")
    return replace(engine, package=package)


ENGINES: dict[str, Engine] = {engine.name: engine for engine in map(_declared, ENGINE_FOLDERS)}
PHONE_ENGINES = tuple(name for name, engine in ENGINES.items() if engine.on_phones)
PREPARED_BY_DEFAULT = tuple(name for name, engine in ENGINES.items() if engine.prepared_by_default)
ARM64_ENGINES = tuple(name for name, engine in ENGINES.items() if engine.on_arm64)
# `--backend` accepts every backend some engine knows, in the vocabulary's order.
ENGINE_BACKENDS = tuple(b for b in BACKENDS if any(b in engine.backends for engine in ENGINES.values()))
# `--backend` help's word on a backend, from the engine that declares it: {backend: "<engine>: <note>"}.
ENGINE_BACKEND_NOTES = {b: f"{engine.name}: {note}" for engine in ENGINES.values() for b, note in engine.backend_notes}


def engine_for_suffix(suffix: str) -> str | None:
    """The engine a model file's suffix selects, or None when the suffix says nothing."""
    return next((e.name for e in ENGINES.values() if suffix.lower() in e.suffixes), None)

