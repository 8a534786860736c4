"""Paddle-Lite's `model_debug_tool` tensor file (lite/tools/debug, run by check_model.sh).

Layout, from lite/tools/debug/debug_utils.h (v2.13): the tool runs the model once and writes
- the tensor file (`--tensor_output_file`, check_model.sh: `tensor_cpp.txt`): one line per variable
  in runtime order, each instruction's inputs then its outputs, every name once:
  `<name>\\t{d0,d1,...}\\t<v0> <v1> ...` (values with the C++ stream default, 6 significant digits;
  fewer than the shape holds when `--tensor_output_length` cut them; weights included unless
  `--output_weights=false`);
- the topology file (`--topo_output_file`, `topo_file.txt`): one line per instruction,
  `<op_type>\\t(<Arg>:<var>#<var> <Arg>:<var>)\\t(<Out>:<var>)`.
With the topology file beside the tensor file, only op outputs are imported (weights and the model
input are not layers) and each gets its op type; without it every tensor is imported.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from layerdiff.analyzer.importers.common import MAX_TEXT_BYTES, ForeignDump, Layer
from layerdiff.errors import DumpFormatError

DEBUG_FORMAT = "paddle-lite-debug"
TOPO_NAMES = ("topo_file.txt", "topo.txt")
_LINE_HEAD = re.compile(rb"^([^\t\n]+)\t\{(-?\d+(?:,-?\d+)*)?\}\t")
MAX_LINES = 1_000_000


def detect_paddle_debug(path: Path) -> bool:
    """A text file whose first line is `<name>\\t{dims}\\t<numbers>`."""
    if not path.is_file() or path.is_symlink():
        return False
    with open(path, "rb") as fh:
        head = fh.read(4096)
    return _LINE_HEAD.match(head) is not None


def read_topology(path: Path) -> dict[str, str]:
    """Output variable -> op type, from the topology file (feed/fetch left out: they are not layers)."""
    if path.stat().st_size > (64 << 20):
        raise DumpFormatError(f"{path}: topology file too large")
    types: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        fields = line.split("\t")
        if len(fields) != 3 or not (fields[2].startswith("(") and fields[2].endswith(")")):
            raise DumpFormatError(f"{path}:{number}: not a topology line ('<op>\\t(<inputs>)\\t(<outputs>)')")
        if fields[0] in ("feed", "fetch"):
            continue
        for argument in fields[2][1:-1].split(" "):
            _, _, names = argument.partition(":")
            for name in filter(None, names.split("#")):
                types[name] = fields[0]
    return types


def _topology_beside(path: Path, topo_file: Path | None) -> Path | None:
    if topo_file is not None:
        if not Path(topo_file).is_file():
            raise DumpFormatError(f"{topo_file}: topology file not found")
        return Path(topo_file)
    return next((path.parent / n for n in TOPO_NAMES if (path.parent / n).is_file()), None)


def read_paddle_debug(path: Path, topo_file: Path | None = None) -> ForeignDump:
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise DumpFormatError(f"{path}: {size} bytes of text, over the {MAX_TEXT_BYTES} byte limit")
    dump = ForeignDump(source=path, format=DEBUG_FORMAT,
                       attrs={"engine": "paddle-lite", "backend_actual": "cpu", "precision_effective": "fp32",
                              "harness": "Paddle-Lite model_debug_tool"})
    topo = _topology_beside(path, topo_file)
    types = read_topology(topo) if topo else None
    dump.provenance.update({"topology": str(topo) if topo else "", "text_precision": "6 significant digits (C++ stream default)"})
    if types is None:
        dump.problems.append(f"{path}: no topology file (topo_file.txt) beside it; weights and inputs imported as layers")
    skipped = 0
    for name, dims, offset, number in _scan(path):
        if types is not None and name not in types:
            skipped += 1  # a weight or the model input: not an op output
            continue
        dump.layers.append(Layer(op=name, output_index=0, name=name, op_type=(types or {}).get(name, ""),
                                 layout="NCHW" if len(dims) == 4 else "", where=f"{path}:{number}",
                                 load=_loader(path, name, dims, offset, number)))
    dump.provenance["not_op_outputs"] = skipped
    if not dump.layers:
        raise DumpFormatError(f"{path}: no op output in this model_debug_tool tensor file")
    return dump


def _scan(path: Path):
    """(name, dims, byte offset of the line, line number) of every line, values left unread."""
    offset = 0
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            if number > MAX_LINES:
                raise DumpFormatError(f"{path}: more than {MAX_LINES} lines, more than any model has variables")
            if line.strip():
                head = _LINE_HEAD.match(line)
                if head is None:
                    raise DumpFormatError(f"{path}:{number}: not '<name>\\t{{dims}}\\t<values>' ({line[:60]!r})")
                dims = tuple(int(d) for d in head.group(2).split(b",")) if head.group(2) else ()
                if any(d < 0 for d in dims):
                    raise DumpFormatError(f"{path}:{number}: negative dimension in {list(dims)}")
                yield head.group(1).decode("utf-8", errors="replace"), dims, offset, number
            offset += len(line)


def _loader(path: Path, name: str, dims: tuple[int, ...], offset: int, number: int):
    def load() -> np.ndarray:
        with open(path, "rb") as fh:
            fh.seek(offset)
            line = fh.readline()
        values = line.split(b"\t", 2)[2].split()
        expected = math.prod(dims)
        if len(values) != expected:
            raise DumpFormatError(f"{path}:{number}: {name} holds {len(values)} values but its shape {list(dims)} needs "
                                  f"{expected} (cut by --tensor_output_length?)")
        try:
            return np.array(values).astype(np.float32).reshape(dims)
        except ValueError:
            raise DumpFormatError(f"{path}:{number}: {name} has a value that is not a number") from None

    return load
