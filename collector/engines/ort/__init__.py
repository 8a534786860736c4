"""collector/engines/ort: ONNX Runtime on the host's CPU (the usual fp32 golden for `.onnx` models)."""
from __future__ import annotations

from pathlib import Path

from layerdiff.analyzer.formats.enginefacts import EngineFacts
from layerdiff.collector.engines.base import Engine, InputSpecs


def _input_specs(path: Path) -> InputSpecs:
    ENGINE.require_installed()  # reading the model's inputs takes the engine's own library
    from layerdiff.collector.engines.ort.modelfile import input_specs

    return input_specs(path)


# Every node output is fetched as a graph output: ONNX Runtime hands back each fetched output from the buffer the
# node wrote in this run, and keeps a node whose output is fetched out of its fusions (nothing fetched is fused away).
WRITES = (("*", "every node output is fetched as a graph output, which the node writes in this run; ONNX Runtime "
                "keeps a node whose output is fetched out of its fusions, so no fetched tensor is fused away"),)

def _repro():
    from layerdiff.collector.engines.ort.repro import RECIPE

    return RECIPE


ENGINE = Engine("onnxruntime", (".onnx",), _input_specs, repro=_repro, writes=WRITES, distribution="onnxruntime", library="onnxruntime", extra="onnx", model_help=".onnx (local golden)",
                facts=EngineFacts(golden=True))
