"""MNN's part of `collect repro` (collector/engines/reprorecipe.py): one op cut out of the `.mnn` (an MNN bundle holds
one op), run by the MNN wheel with the session config of each configuration (`reprorun.py`)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from layerdiff.collector.engines.reprorecipe import CutPiece, ReproRecipe

MODEL_PATH = "model/repro.mnn"


def cut_piece(files: list[Path], tensor: str, _last: str, shapes: dict, scratch: Path) -> CutPiece:
    from layerdiff.collector.engines.mnn.cut import cut

    with tempfile.TemporaryDirectory(prefix="layerdiff-repro-", dir=scratch) as work:
        cut_model = cut(files[0], str(tensor), shapes, Path(work))
    return CutPiece({MODEL_PATH: cut_model.model}, {"mnn": MODEL_PATH}, cut_model.inputs, cut_model.outputs,
                    cut_model.layers)


def options_text(config: dict) -> str:
    return (f"session config backend={config['backend'].upper()}, precision={config['precision']}, "
            f"numThread={config['threads']}")


RECIPE = ReproRecipe("MNN", cut_piece, Path(__file__).with_name("reprorun.py"),
                     one_op="an MNN bundle holds one op; name the ops one by one", options_text=options_text)
