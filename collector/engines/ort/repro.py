"""ONNX Runtime's part of `collect repro` (collector/engines/reprorecipe.py): nodes cut out of the `.onnx`, run in an
InferenceSession with the run's providers and optimisation level (`reprorun.py`)."""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.reprorecipe import CutPiece, ReproRecipe, recorded_keys

MODEL_PATH = "model/repro.onnx"


def cut_piece(files: list[Path], first: str, last: str, shapes: dict, scratch: Path) -> CutPiece:
    from layerdiff.collector.engines.ort.cut import cut

    cut_model = cut(files[0], first, last, shapes)
    return CutPiece({MODEL_PATH: cut_model.model}, {"onnx": MODEL_PATH}, cut_model.inputs, cut_model.outputs,
                    cut_model.layers)


RECIPE = ReproRecipe("ONNX Runtime", cut_piece, Path(__file__).with_name("reprorun.py"),
                     options=recorded_keys(("providers", "graph_optimization_level")))
