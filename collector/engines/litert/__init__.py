"""collector/engines/litert: LiteRT (TensorFlow Lite) `.tflite` models on the host (CPU interpreter, WebGPU accelerator)."""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.base import Engine, InputSpecs


def _input_specs(path: Path) -> InputSpecs:
    ENGINE.require_installed()  # reading the model's inputs takes the engine's own library
    from layerdiff.collector.engines.litert.graph import input_specs

    return input_specs(path)



def _bisect():
    from layerdiff.collector.engines.litert.pieces import recipe

    return recipe()


def _repro():
    from layerdiff.collector.engines.litert.repro import RECIPE

    return RECIPE


ENGINE = Engine("litert", (".tflite",), _input_specs, repro=_repro, backends=("cpu", "gpu"), distribution="ai-edge-litert", library="ai_edge_litert", extra="litert", model_help=".tflite (local LiteRT)",
                backend_notes=(("gpu", "WebGPU"),),  # LiteRT's GPU accelerator (WebGPU over Vulkan on the host)
                bisect=_bisect)
