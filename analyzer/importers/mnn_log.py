"""What the captured console output of MNN's dump tools tells about a dump: shapes, names, backend.

MNNV2Basic.out and ModuleBasic.out (runMask & 1) print, for every dumped op output,
  `Dimensions: 4, W,H,C,B: <w> X <h> X <c> X <b>, OP name <op> : <i>`   (4-D tensors)
  `Dimensions: <n>, <d0> X <d1> X ..., OP name <op> : <i>`            (other ranks)
with the *original* op name (the file name has '/' replaced by '_'). MNNV2Basic also prints
`Use extra forward type: <t>`, `Session Info: ... backendType is <t>` and `precision:<p>, ...`.
A saved copy of that output is the only shape sidecar MNN itself produces.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.analyzer.importers.mnnnames import mnn_file_stem
from layerdiff.analyzer.importers.mnncodes import MNN_FORWARD_TYPES, MNN_PRECISION_MODES

FORWARD_TYPES = MNN_FORWARD_TYPES  # MNNForwardType code -> backend name (mnncodes.py)
PRECISIONS = MNN_PRECISION_MODES
MAX_LOG_BYTES = 256 << 20

_DIM4 = re.compile(r"Dimensions: 4, W,H,C,B: (\d+) X (\d+) X (\d+) X (\d+), OP name (.*) : (\d+)\s*$")
_DIMN = re.compile(r"Dimensions: (\d+), ([\d X]*), OP name (.*) : (\d+)\s*$")
_REQUESTED = re.compile(r"Use extra forward type: (\d+)")
_ACTUAL = re.compile(r"backendType is (\d+)")
_PRECISION = re.compile(r"^precision:\s*(\d+)")


@dataclass
class LoggedTensor:
    """One `Dimensions:` line: the original op name and the dims as printed."""

    op: str
    output_index: int
    whcb: tuple[int, int, int, int] | None = None  # 4-D tensors: width, height, channel, batch
    dims: tuple[int, ...] | None = None  # other ranks: lengths in storage order


@dataclass
class MnnLog:
    tensors: dict[str, LoggedTensor] = field(default_factory=dict)  # by dump file stem
    attrs: dict[str, object] = field(default_factory=dict)


def parse_mnn_log(path: Path) -> MnnLog:
    """Parse a saved console log; unknown lines are ignored, a log too large is ignored."""
    log = MnnLog()
    if path.stat().st_size > MAX_LOG_BYTES:
        return log
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            _parse_line(line.rstrip("\n"), log)
    return log


def _parse_line(line: str, log: MnnLog) -> None:
    if m := _DIM4.search(line):
        w, h, c, b = (int(m.group(i)) for i in range(1, 5))
        entry = LoggedTensor(op=m.group(5), output_index=int(m.group(6)), whcb=(w, h, c, b))
    elif m := _DIMN.search(line):
        dims = tuple(int(d) for d in m.group(2).split(" X ") if d.strip())
        if len(dims) != int(m.group(1)):
            return
        entry = LoggedTensor(op=m.group(3), output_index=int(m.group(4)), dims=dims)
    else:
        _parse_attr_line(line, log)
        return
    log.tensors[mnn_file_stem(entry.op, entry.output_index)] = entry


def _parse_attr_line(line: str, log: MnnLog) -> None:
    if m := _REQUESTED.search(line):
        log.attrs["backend_requested"] = FORWARD_TYPES.get(int(m.group(1)), m.group(1))
    elif m := _ACTUAL.search(line):
        log.attrs["backend_actual"] = FORWARD_TYPES.get(int(m.group(1)), m.group(1))
    elif m := _PRECISION.match(line):
        log.attrs["precision_requested"] = PRECISIONS.get(int(m.group(1)) % 4, m.group(1))


def logged_shape(entry: LoggedTensor, row_width: int, count: int) -> tuple[tuple[int, ...], str] | None:
    """(shape, layout) for the text data, or None when the log does not fit the file.

    4-D tensors are printed as W,H,C,B whatever their layout; the text rows are the last storage
    dimension, so a row width equal to W means NCHW (MNN's CAFFE dimension type) and equal to C
    (and not W) means NHWC (TENSORFLOW).
    """
    if entry.whcb is not None:
        w, h, c, b = entry.whcb
        if w * h * c * b != count:
            return None
        if row_width == w:
            return (b, c, h, w), "NCHW"
        if row_width == c:
            return (b, h, w, c), "NHWC"
        return None
    dims = entry.dims or ()
    numel = 1
    for d in dims:
        numel *= d
    if numel != count:
        return None
    return dims, ""
