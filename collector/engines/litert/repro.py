"""LiteRT's part of `collect repro` (collector/engines/reprorecipe.py): operators cut out of the `.tflite`, run by the
LiteRT wheel with the kernels or GPU accelerator settings the run recorded (`reprorun.py`)."""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.reprorecipe import CutPiece, ReproRecipe, recorded_keys

MODEL_PATH = "model/repro.tflite"


def cut_piece(files: list[Path], first: str, last: str, shapes: dict, scratch: Path) -> CutPiece:
    from layerdiff.collector.engines.litert.cut import cut

    cut_model = cut(files[0], first, last, shapes)
    return CutPiece({MODEL_PATH: cut_model.model}, {"tflite": MODEL_PATH}, cut_model.inputs, cut_model.outputs,
                    cut_model.layers)


RECIPE = ReproRecipe("LiteRT", cut_piece, Path(__file__).with_name("reprorun.py"),
                     options=recorded_keys(("kernels", "accelerator", "vulkan_icd", "enforce_f32", "precision_why")))
