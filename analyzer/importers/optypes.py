"""Op types for foreign dumps that only name their tensors (ONNX Runtime `.npz`, Polygraphy JSON).

A report row without an op type tells the user nothing about *what* diverged. Two sources, best first:
1. the ONNX model beside the dump (the only `.onnx` in its directory): the exact type of the node
   writing each tensor (read with the `onnx` package when it is installed);
2. the tensor name, when an exporter put the op in it: `/blk/conv/Conv_output_0` (PyTorch),
   `p2o.pd_op.conv2d.43.0`, `Add.25`, `conv2d_53.tmp_0` (Paddle2ONNX). A name that does not look like
   an op (`x`, `logits`) gives no type rather than a wrong one.
"""
from __future__ import annotations

import re
from pathlib import Path

_SEGMENT = re.compile(r"^(?:p2o\.pd_op\.)?(?P<op>[A-Za-z][A-Za-z0-9]*(?:_[a-z][a-z0-9]*)*?)"
                      r"(?:(?:_\d+)?_output_\d+|_\d+\.tmp_\d+|\.tmp_\d+|[._@]\d+(?:\.\d+)*|_\d+)$")
_NUMBERED = re.compile(r"^([A-Za-z]+?)\d+$")
MAX_ONNX_BYTES = 2 << 30


def op_type_from_name(name: str) -> str:
    """The op an exporter wrote into a tensor name, or '' when the name does not carry one."""
    segment = str(name).rsplit("/", 1)[-1]
    match = _SEGMENT.match(segment)
    if not match:
        numbered = _NUMBERED.match(segment)  # `relu1`, `conv2`: a known op word and a number
        return numbered.group(1) if numbered and _known(numbered.group(1)) else ""
    op = match.group("op")
    return op if op[0].isupper() or "_" in op or any(c.isdigit() for c in op) or _known(op) else ""


def _known(op: str) -> bool:
    from layerdiff.analyzer.formats.opkinds import op_class

    return bool(op_class(op))


def op_types_from_onnx(source: Path) -> dict[str, str]:
    """Tensor name -> ONNX op type of the node writing it, from the only `.onnx` beside `source` ({} if none)."""
    directory = source if source.is_dir() else source.parent
    try:
        models = [p for p in directory.glob("*.onnx") if p.is_file() and p.stat().st_size <= MAX_ONNX_BYTES]
    except OSError:
        return {}
    if len(models) != 1:
        return {}
    try:
        import onnx

        graph = onnx.load(str(models[0]), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - an unreadable side file only means no types from it
        return {}
    return {out: node.op_type for node in graph.node for out in node.output if out}
