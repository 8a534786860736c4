"""A Paddle inference program (`.pdmodel`, a ProgramDesc protobuf) read without importing Paddle.

The collector needs a Paddle model's inputs (name, shape, dtype) before anything runs, and the
engine needs the list of variables to fetch; Paddle itself is an optional 700 MB install, so the
few ProgramDesc fields used here are decoded straight from the protobuf wire format (field numbers
from Paddle's framework.proto). Untrusted files: every length is checked against the bytes left.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.errors import ModelFormatError

MAX_PROGRAM_BYTES = 1 << 30
# VarType.Type values of tensor element types (framework.proto) -> numpy dtype names
DTYPES = {0: "bool", 1: "int16", 2: "int32", 3: "int64", 4: "float16", 5: "float32", 6: "float64",
          20: "uint8", 21: "int8", 22: "bfloat16"}
DENSE_TENSOR = 7
# Output slots that are not layer values: bookkeeping of inference ops (reshape2's XShape holds only a
# shape, batch_norm's running statistics are the weights themselves). Paddle-Lite drops them too.
AUX_SLOTS = frozenset({"XShape", "SavedMean", "SavedVariance", "MeanOut", "VarianceOut", "ReserveSpace"})
# Ops whose outputs are not layers: the feeding and fetching of the program itself.
IO_OPS = frozenset({"feed", "fetch"})


ProgramError = ModelFormatError  # the file is not a Paddle ProgramDesc layerdiff can read (layerdiff/errors.py)


@dataclass
class VarInfo:
    name: str
    kind: int = 0  # VarType.Type of the variable (7: dense tensor)
    dtype: str = ""
    dims: tuple[int, ...] = ()
    persistable: bool = False


@dataclass
class OpInfo:
    type: str
    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class Program:
    vars: dict[str, VarInfo]
    ops: list[OpInfo]
    blocks: int

    def feeds(self) -> list[str]:
        """The model's inputs, in feed-column order (the `feed` ops' outputs)."""
        return [name for op in self.ops if op.type == "feed" for name in op.outputs.get("Out", [])]

    def fetches(self) -> list[str]:
        return [name for op in self.ops if op.type == "fetch" for name in op.inputs.get("X", [])]


@dataclass
class Variable:
    """One dumped variable: the op that writes it, in program (runtime) order."""

    name: str
    op_type: str
    inputs: list[str]


def dumped_variables(program: Program) -> list[Variable]:
    """Every op output that is a layer value: not a weight, not a bookkeeping slot, not feed/fetch.

    A variable written twice (an in-place op) is dumped once, at its last writer, which is the value
    a later reader sees and the one Paddle-Lite's GetTensor returns after the run.
    """
    weights = {n for n, v in program.vars.items() if v.persistable}
    last: dict[str, Variable] = {}
    for op in program.ops:
        if op.type in IO_OPS:
            continue
        inputs = [n for names in op.inputs.values() for n in names if n not in weights]
        for slot, names in op.outputs.items():
            if slot in AUX_SLOTS:
                continue
            for name in names:
                info = program.vars.get(name)
                if info is None or info.persistable or info.kind != DENSE_TENSOR:
                    continue
                last.pop(name, None)
                last[name] = Variable(name, op.type, inputs)
    return list(last.values())


def read_program(path: Path) -> Program:
    """The main block of a `.pdmodel`, or a one-line ProgramError naming the file."""
    try:
        size = path.stat().st_size
        if size > MAX_PROGRAM_BYTES:
            raise ProgramError(f"{path}: {size} bytes, larger than any Paddle program ({MAX_PROGRAM_BYTES})")
        data = path.read_bytes()
    except OSError as err:
        raise ProgramError(f"{path}: cannot read ({err.strerror or err})") from None
    if data[:1] == b"{":
        raise ProgramError(f"{path}: a PIR .json program; layerdiff reads .pdmodel programs (export with "
                           f"FLAGS_enable_pir_api=0, which Paddle-Lite's opt needs too)")
    try:
        blocks = [_fields(b) for _, b in _fields(data) if _ == (1, 2)]
        if not blocks:
            raise ValueError("no block")
        main = blocks[0]
        variables = [_var(v) for key, v in main if key == (3, 2)]
        ops = [_op(o) for key, o in main if key == (4, 2)]
    except (ValueError, IndexError, UnicodeDecodeError) as err:
        raise ProgramError(f"{path}: not a Paddle inference program (.pdmodel): {err}") from None
    if not ops:
        raise ProgramError(f"{path}: not a Paddle inference program (.pdmodel): no ops in its main block")
    return Program({v.name: v for v in variables}, ops, len(blocks))


def _var(data: bytes) -> VarInfo:
    info = VarInfo("")
    for key, value in _fields(data):
        if key == (1, 2):
            info.name = value.decode()
        elif key == (3, 0):
            info.persistable = bool(value)
        elif key == (2, 2):
            _var_type(value, info)
    return info


def _var_type(data: bytes, info: VarInfo) -> None:
    for key, value in _fields(data):
        if key == (1, 0):
            info.kind = value
        elif key == (3, 2):  # DenseTensorDesc -> TensorDesc
            for k2, tensor in _fields(value):
                if k2 == (1, 2):
                    for k3, v3 in _fields(tensor):
                        if k3 == (1, 0):
                            info.dtype = DTYPES.get(v3, f"type{v3}")
                        elif k3 == (2, 0):
                            info.dims += (_signed(v3),)
                        elif k3 == (2, 2):  # packed dims
                            info.dims += tuple(_signed(d) for d in _packed(v3))


def _op(data: bytes) -> OpInfo:
    op = OpInfo("")
    for key, value in _fields(data):
        if key == (3, 2):
            op.type = value.decode()
        elif key in ((1, 2), (2, 2)):
            slot, names = "", []
            for k2, v2 in _fields(value):
                if k2 == (1, 2):
                    slot = v2.decode()
                elif k2 == (2, 2):
                    names.append(v2.decode())
            (op.inputs if key[0] == 1 else op.outputs)[slot] = names
    return op


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError(f"varint cut short at byte {pos}")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7


def _packed(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        value, pos = _varint(data, pos)
        out.append(value)
    return out


def _fields(data: bytes) -> list[tuple[tuple[int, int], object]]:
    """(field number, wire type) -> varint int or length-delimited bytes, in file order."""
    out: list[tuple[tuple[int, int], object]] = []
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError(f"field {number} runs past the end of the file")
            value, pos = data[pos : pos + length], pos + length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(data):
                raise ValueError(f"field {number} runs past the end of the file")
            value, pos = data[pos : pos + width], pos + width
        else:
            raise ValueError(f"unsupported wire type {wire} at byte {pos}")
        out.append(((number, wire), value))
    return out
