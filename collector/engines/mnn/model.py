"""What a `.mnn` file says about its ops: each op's name and the tensors it writes, and the outputs.

MNN's public API names ops, not the tensors they write, and its converter fuses: a Conv+BN+ReLU
chain becomes one op named after the first node (`conv2d_450.tmp_0`) that writes the tensor of the
last (`batch_norm_67.tmp_2`). Keying dumps by the written tensor is what makes them align with an
ONNX golden. The names come from the model file itself, a FlatBuffer (MNN's schema/default/MNN.fbs),
read with `struct`: only the few fields needed, by their slot in the schema.
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
    """Parse op and tensor names from a .mnn file; an unreadable file gives an empty table.

    Read with `struct` alone (bounds-checked), not the `flatbuffers` package: the engine runs in
    the arm64 runtime too, which holds the engines' wheels only, and keys must not depend on where
    it runs (without them MNN's op names would key the dump: `Identity_3` for the convolution
    writing `Identity_3__before_tr`)."""
    try:
        data = Path(path).read_bytes()
        net = _u32(data, 0)
        names = _strings(data, net, NET_TENSOR_NAME)
        writes: dict[str, list[str]] = {}
        for op in _tables(data, net, NET_OPLISTS):
            name = _string(data, op, OP_NAME)
            if name is not None:
                writes[name] = [names[i] for i in _ints(data, op, OP_OUTPUT_INDEXES) if 0 <= i < len(names)]
        return MnnOps(writes, _strings(data, net, NET_OUTPUT_NAME))
    except (IndexError, ValueError, UnicodeDecodeError, OSError, struct.error):
        return MnnOps({}, [])


def _u32(data: bytes, at: int) -> int:
    if at < 0:
        raise ValueError("negative offset")
    return struct.unpack_from("<I", data, at)[0]


def _field(data: bytes, table: int, slot: int) -> int:
    """Where field `slot` of the table at `table` lies, 0 when absent (FlatBuffers vtable lookup)."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    size = struct.unpack_from("<H", data, vtable)[0]
    at = 4 + 2 * slot
    offset = struct.unpack_from("<H", data, vtable + at)[0] if at + 2 <= size else 0
    return table + offset if offset else 0


def _vector(data: bytes, table: int, slot: int) -> tuple[int, int]:
    """(first element, count) of a vector field; (0, 0) when absent."""
    where = _field(data, table, slot)
    if not where:
        return 0, 0
    vector = where + _u32(data, where)
    count = _u32(data, vector)
    if vector + 4 + 4 * count > len(data):
        raise ValueError("vector out of bounds")
    return vector + 4, count


def _string_at(data: bytes, at: int) -> str:
    length = _u32(data, at)
    if at + 4 + length > len(data):
        raise ValueError("string out of bounds")
    return data[at + 4 : at + 4 + length].decode("utf-8")


def _strings(data: bytes, table: int, slot: int) -> list[str]:
    start, count = _vector(data, table, slot)
    return [_string_at(data, start + 4 * i + _u32(data, start + 4 * i)) for i in range(count)]


def _ints(data: bytes, table: int, slot: int) -> list[int]:
    start, count = _vector(data, table, slot)
    return list(struct.unpack_from(f"<{count}i", data, start)) if count else []


def _tables(data: bytes, table: int, slot: int) -> list[int]:
    start, count = _vector(data, table, slot)
    return [start + 4 * i + _u32(data, start + 4 * i) for i in range(count)]


def _string(data: bytes, table: int, slot: int) -> str | None:
    where = _field(data, table, slot)
    return _string_at(data, where + _u32(data, where)) if where else None
