"""The engines layerdiff runs, in one table: name, model file suffixes, host module, where they run.

Everything that needs an engine name (model resolution, the `local` device, `--engine` checks, the
C++ harness builds) reads this table, so adding an engine is one row here plus its module.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    name: str
    suffixes: tuple[str, ...]  # model file suffixes that select this engine (`--engine auto`)
    host_module: str  # the Python host engine behind the `local` device (python -m ...)
    on_phones: bool  # the C++ harness runs it on ADB devices too


ENGINES: dict[str, Engine] = {
    engine.name: engine
    for engine in (
        Engine("mnn", (".mnn",), "layerdiff.collector.engines.mnn.engine", on_phones=True),
        Engine("ncnn", (".param", ".bin"), "layerdiff.collector.engines.ncnn.engine", on_phones=True),
        Engine("onnxruntime", (".onnx",), "layerdiff.collector.engines.ort.engine", on_phones=False),
        Engine("paddle", (".pdmodel", ".pdiparams"), "layerdiff.collector.engines.paddle.engine", on_phones=False),
        Engine("litert", (".tflite",), "layerdiff.collector.engines.litert.engine", on_phones=False),
    )
}
PHONE_ENGINES = tuple(name for name, engine in ENGINES.items() if engine.on_phones)


def engine_for_suffix(suffix: str) -> str | None:
    """The engine a model file's suffix selects, or None when the suffix says nothing."""
    return next((e.name for e in ENGINES.values() if suffix.lower() in e.suffixes), None)
