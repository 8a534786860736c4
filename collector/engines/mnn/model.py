"""What a `.mnn` file says about its ops: each op's name and the tensors it writes, and the outputs.

MNN's public API names ops, not the tensors they write, and its converter fuses: a Conv+BN+ReLU
chain becomes one op named after the first node (`conv2d_450.tmp_0`) that writes the tensor of the
last (`batch_norm_67.tmp_2`). Keying dumps by the written tensor is what makes them align with an
ONNX golden. The names come from the model file itself, a FlatBuffer (MNN's schema/default/MNN.fbs),
read with the `flatbuffers` runtime: only the few fields needed, by their slot in the schema.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

# Field slots in MNN.fbs (table Net / table Op), in declaration order; a union takes two slots.
NET_OPLISTS, NET_OUTPUT_NAME, NET_TENSOR_NAME = 3, 4, 7
OP_NAME, OP_OUTPUT_INDEXES = 3, 4


@dataclass
class MnnOps:
    """Op name -> names of the tensors it writes (in output order), and the model's output tensors."""

    writes: dict[str, list[str]]
    outputs: list[str]

    def key(self, op: str, index: int) -> tuple[str, str] | None:
        """(dump op, tensor name) for output `index` of a model op; None for runtime-only ops (rasters).

        The op is keyed by the tensor it writes, except when that tensor is in the op's own name
        scope (`head/conv` writing `head/conv/relu`: a fused activation), which keeps the op's name
        as ncnn's fused layers and the project's samples do.
        """
        tensors = self.writes.get(op)
        if not tensors or index >= len(tensors):
            return None
        first = tensors[0]
        dump_op = op if first.startswith(op + "/") else first
        return dump_op, tensors[index] if index else dump_op


def read_mnn_ops(path: Path | str) -> MnnOps:
    """Parse op and tensor names from a .mnn file; an unreadable file gives an empty table."""
    try:
        from flatbuffers import encode, number_types, packer
        from flatbuffers.table import Table

        data = Path(path).read_bytes()
        net = Table(bytearray(data), encode.Get(packer.uoffset, data, 0))
        names = _strings(net, NET_TENSOR_NAME)
        writes: dict[str, list[str]] = {}
        for op in _tables(net, NET_OPLISTS, Table):
            name = _string(op, OP_NAME)
            if name is not None:
                writes[name] = [names[i] for i in _ints(op, OP_OUTPUT_INDEXES, number_types) if 0 <= i < len(names)]
        return MnnOps(writes, _strings(net, NET_OUTPUT_NAME))
    except (ImportError, IndexError, ValueError, UnicodeDecodeError, OSError, struct.error):
        return MnnOps({}, [])


def _vector(table, slot: int) -> tuple[int, int]:
    offset = table.Offset(4 + 2 * slot)
    if not offset:
        return 0, 0
    return table.Vector(offset), table.VectorLen(offset)


def _strings(table, slot: int) -> list[str]:
    start, count = _vector(table, slot)
    return [table.String(start + 4 * i).decode("utf-8") for i in range(count)]


def _ints(table, slot: int, number_types) -> list[int]:
    start, count = _vector(table, slot)
    return [table.Get(number_types.Int32Flags, start + 4 * i) for i in range(count)]


def _tables(table, slot: int, Table) -> list:
    start, count = _vector(table, slot)
    return [Table(table.Bytes, table.Indirect(start + 4 * i)) for i in range(count)]


def _string(table, slot: int) -> str | None:
    offset = table.Offset(4 + 2 * slot)
    return table.String(offset + table.Pos).decode("utf-8") if offset else None
