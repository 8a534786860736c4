"""A Paddle-Lite `.nb` model read without Paddle-Lite: its inputs and the targets its kernels were picked for.

Layout (Paddle-Lite model_parser, meta_version 1/2): uint16 meta_version, char[16] opt_version,
uint64 topo_size, then a flatbuffers ProgramDesc (framework.fbs field ids: ProgramDesc.blocks 0;
BlockDesc vars 2, ops 3; OpDesc type 0, inputs 1, outputs 2, attrs 3; OpDesc.Var parameter 0,
arguments 1; Attr name 0, s 4; VarDesc name 0, type 1, persistable 2; VarType lod_tensor 2;
LoDTensorDesc tensor 0; TensorDesc data_type 0, dims 1). The C++ harness reads the same fields
(device_scripts/harness/src/paddle_lite_model.cpp) before it runs anything.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.errors import ModelFormatError

HEADER = struct.Struct("<H16sQ")
KERNEL_TYPE_ATTR = "__@kernel_type_attr@__"  # "op/alias/target/precision/layout"
TARGETS = {1: "host", 2: "x86", 4: "arm", 5: "opencl"}
DTYPES = {0: "bool", 2: "int32", 3: "int64", 4: "float16", 5: "float32", 6: "float64", 20: "uint8", 21: "int8"}


@dataclass
class NbModel:
    opt_version: str
    feeds: list[str] = field(default_factory=list)
    var_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)
    var_dtypes: dict[str, str] = field(default_factory=dict)
    targets: set[str] = field(default_factory=set)  # kernel targets other than host


class _Reader:
    """Bounds-checked access to flatbuffers tables (offsets from the file are untrusted)."""

    def __init__(self, buf: bytes, path: Path) -> None:
        self.buf, self.path = buf, path

    def _u(self, fmt: str, at: int) -> int:
        size = struct.calcsize(fmt)
        if at < 0 or at + size > len(self.buf):
            raise ModelFormatError(f"{self.path}: not a Paddle-Lite .nb model (offset out of bounds); optimise it with opt")
        return struct.unpack_from(fmt, self.buf, at)[0]

    def root(self) -> int:
        return self._u("<I", 0)

    def field(self, table: int, slot: int) -> int:
        vtable = table - self._u("<i", table)
        size = self._u("<H", vtable)
        at = 4 + 2 * slot
        offset = self._u("<H", vtable + at) if at + 2 <= size else 0
        return table + offset if offset else 0

    def tables(self, table: int, slot: int) -> list[int]:
        f = self.field(table, slot)
        if not f:
            return []
        vec = f + self._u("<I", f)
        count = self._u("<I", vec)
        self._u("B", vec + 4 * count) if count else None
        return [vec + 4 + 4 * i + self._u("<I", vec + 4 + 4 * i) for i in range(count)]

    def string(self, table: int, slot: int) -> str:
        f = self.field(table, slot)
        return self.string_at(f + self._u("<I", f)) if f else ""

    def string_at(self, at: int) -> str:
        n = self._u("<I", at)
        if at + 4 + n > len(self.buf):
            raise ModelFormatError(f"{self.path}: not a Paddle-Lite .nb model (string out of bounds)")
        return self.buf[at + 4 : at + 4 + n].decode("utf-8", errors="replace")

    def ints(self, table: int, slot: int, fmt: str) -> list[int]:
        f = self.field(table, slot)
        if not f:
            return []
        vec = f + self._u("<I", f)
        width = struct.calcsize(fmt)
        return [self._u(fmt, vec + 4 + width * i) for i in range(self._u("<I", vec))]

    def scalar(self, table: int, slot: int, fmt: str, default: int = 0) -> int:
        f = self.field(table, slot)
        return self._u(fmt, f) if f else default


def read_nb(path: Path) -> NbModel:
    """The model's feeds, variable shapes and kernel targets, or one ModelFormatError line naming the file."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ModelFormatError(f"{path}: cannot read ({err.strerror or err})") from None
    if len(data) < HEADER.size:
        raise ModelFormatError(f"{path}: too short for a Paddle-Lite .nb model")
    meta, version, topo = HEADER.unpack_from(data)
    if meta not in (1, 2) or topo > len(data) - HEADER.size or topo < 8:
        raise ModelFormatError(f"{path}: not a Paddle-Lite .nb model of v2.7 or later (meta version {meta}); optimise it with opt")
    r = _Reader(data[HEADER.size : HEADER.size + topo], path)
    blocks = r.tables(r.root(), 0)
    if not blocks:
        raise ModelFormatError(f"{path}: the .nb program has no block")
    model = NbModel(version.split(b"\0", 1)[0].decode("ascii", errors="replace"))
    for var in r.tables(blocks[0], 2):
        name, vtype = r.string(var, 0), r.field(var, 1)
        lod = r.field(vtype + r._u("<I", vtype), 2) if vtype else 0
        if lod:
            lod_table = lod + r._u("<I", lod)
            tensor = r.field(lod_table, 0)
            if tensor:
                tensor_table = tensor + r._u("<I", tensor)
                model.var_dims[name] = tuple(r.ints(tensor_table, 1, "<q"))
                model.var_dtypes[name] = DTYPES.get(r.scalar(tensor_table, 0, "<i"), "float32")
    for op in r.tables(blocks[0], 3):
        op_type = r.string(op, 0)
        if op_type == "feed":
            model.feeds += [r.string_at(a) for v in r.tables(op, 2) for a in _string_list(r, v)]
            continue
        for attr in r.tables(op, 3):
            if r.string(attr, 0) == KERNEL_TYPE_ATTR:
                parts = r.string(attr, 4).split("/")
                target = int(parts[-3]) if len(parts) >= 5 and parts[-3].isdigit() else 0
                if target > 1 and op_type != "fetch":
                    model.targets.add(TARGETS.get(target, f"target {target}"))
    return model


def _string_list(r: _Reader, var_table: int) -> list[int]:
    f = r.field(var_table, 1)
    if not f:
        return []
    vec = f + r._u("<I", f)
    return [vec + 4 + 4 * i + r._u("<I", vec + 4 + 4 * i) for i in range(r._u("<I", vec))]
