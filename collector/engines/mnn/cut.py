"""One MNN op cut out of a `.mnn` model as a model of its own, with MNN's own expression API.

`MNN.expr.load_as_dict` gives the graph's variables by name; each tensor the op reads (other than a
constant) is replaced by a placeholder of the same shape and data format (an op that reads NC4HW4
keeps reading NC4HW4), and `MNN.expr.save` writes what the op's output depends on: the op, its own
weights and the placeholders.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerdiff.errors import InputError


@dataclass(frozen=True)
class MnnCut:
    """The cut model's bytes, and the tensors it reads and writes."""

    model: bytes
    inputs: list[str]
    outputs: list[str]
    layers: list[str]


def cut(model: Path, op: str, shapes: dict[str, tuple[int, ...]], scratch: Path) -> MnnCut:
    """The op producing tensor `op` as a model; `shapes` gives each tensor's recorded shape."""
    import MNN.expr as F  # imported here: only a bundle of an MNN model needs it

    try:
        graph = F.load_as_dict(str(model))
    except Exception as err:  # noqa: BLE001 - pymnn raises bare exceptions for unreadable models
        raise InputError(f"{model}: MNN could not read the model's graph ({err})") from None
    target = graph.get(op)
    if target is None:
        raise InputError(f"{model}: no tensor {op!r} in the model's graph; MNN's run-time ops (`*_raster_*`) cannot "
                         "be cut out, name the op they belong to")
    path = scratch / "cut.mnn"
    try:
        inputs = [_placeholder_for(F, var, shapes) for var in target.inputs if var.op_type not in CONSTANTS]
        F.save([target], str(path))
        data = path.read_bytes()
    except Exception as err:  # noqa: BLE001 - pymnn raises bare exceptions
        raise InputError(f"{model}: MNN could not cut out {op!r} ({err}); name another op") from None
    return MnnCut(data, inputs, [op], [op])


CONSTANTS = ("Const", "TrainableParam")  # an op's weights: kept in the cut model


def _placeholder_for(F, var, shapes: dict[str, tuple[int, ...]]) -> str:
    """Replace `var` in the graph by a placeholder of its recorded shape and its data format; returns its name."""
    name = var.name
    placeholder = F.placeholder(list(shapes.get(name) or var.shape), var.data_format, F.float)
    placeholder.name = name
    var.replace(placeholder)
    return name
