"""Name normalization that lets ONNX Runtime / Polygraphy tensors align with MNN dump names.

Facts this rests on (checked with MNN 3.6.1's converter and session callbacks on the host, and in
MNN's tools/cpp/MNNV2Basic.cpp, ModuleBasic.cpp, ExprDebug.hpp):
- MNN names each op after the ONNX node's *first output tensor* (`/blk/conv/Conv_output_0`), and
  op output k is the node's k-th ONNX output. A TopK node with outputs `/tk/TopK_output_0` and
  `/tk/TopK_output_1` is one MNN op `/tk/TopK_output_0` with outputs 0 and 1.
- MNN's dump tools write op output i to the file `output/<op name with '/' replaced by '_'>_<i>`.
- MNN's geometry pass inserts `Raster` ops named `<consumer>_raster_<k>`; ONNX has no counterpart
  and their set differs between backends.
- ONNX Runtime (directly or through Polygraphy) names results by ONNX tensor name.

So an ONNX tensor `T` and an MNN output `(op, i)` are the same layer when `canonical_key(T, 0) ==
canonical_key(op, i)`. The rules are data (`NAME_RULES`) so the aligner can fold them into its own
rule set and print them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class NameRule:
    """One normalization step: `pattern` is replaced by `replacement` in an op name."""

    name: str
    pattern: str
    replacement: str
    why: str


NAME_RULES: tuple[NameRule, ...] = (
    NameRule(
        "slash-to-underscore",
        r"/",
        "_",
        "MNN's dump tools replace '/' in op names by '_' in file names",
    ),
    NameRule(
        "onnx-output-index",
        r"^(?P<base>.*_output_)(?P<k>[1-9]\d*)$",
        r"\g<base>0",
        "ONNX tensor '<node>_output_<k>' (k>0) is output k of the MNN op named '<node>_output_0'",
    ),
)

HELPER_PATTERNS: tuple[str, ...] = (r"_raster_\d+$",)
"""Op names of engine-inserted helper ops that have no counterpart in other engines."""

_SLASH = re.compile(NAME_RULES[0].pattern)
_OUTPUT_INDEX = re.compile(NAME_RULES[1].pattern)
_HELPERS = tuple(re.compile(p) for p in HELPER_PATTERNS)


def canonical_key(op: str, output_index: int = 0) -> str:
    """The engine-neutral alignment key `<normalized op>:<output index>` of one tensor."""
    name = _SLASH.sub("_", op)
    match = _OUTPUT_INDEX.match(name)
    if match and output_index == 0:
        name, output_index = match.group("base") + "0", int(match.group("k"))
    return f"{name}:{output_index}"


def canonical_from_key(key: str) -> str:
    """`canonical_key` of a stored `<op>:<output index>` key (op names may contain ':')."""
    op, sep, index = key.rpartition(":")
    if not sep or not index.isdigit():
        return canonical_key(key, 0)
    return canonical_key(op, int(index))


def is_helper(op: str) -> bool:
    """True for engine-inserted helper ops (MNN `_raster_<k>`) that other engines never have."""
    return any(p.search(op) for p in _HELPERS)
