"""collector/engines/ort: ONNX Runtime on the host's CPU (the usual fp32 golden for `.onnx` models)."""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.base import Engine, InputSpecs


def _input_specs(path: Path) -> InputSpecs:
    ENGINE.require_installed()  # reading the model's inputs takes the engine's own library
    from layerdiff.collector.engines.ort.modelfile import input_specs

    return input_specs(path)


ENGINE = Engine("onnxruntime", (".onnx",), _input_specs, library="onnxruntime", extra="onnx",
                distribution="onnxruntime")
