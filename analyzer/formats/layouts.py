"""Tensor layouts as dumps record them: which byte orders are the graph's own, and which two can be compared.

Every harness writes a tensor in the logical layout its graph declares: row-major in the graph's own
axis order, with the engine's packed forms (MNN's NC4HW4, whose packs are 4, 8 or 16 channels
depending on the CPU; ncnn's elempack) undone before dumping. The names producers write for that
order depend on the rank and the producer (`NCHW`, `NC`, `HW`, `NCDHW`, `flat`, `graph`, or nothing
from older dumps and foreign importers); all of them mean the same bytes order. A layout string may
add, after ` (`, how the engine itself held the tensor (`NCHW (MNN NC4HW4)`): that is provenance,
not the bytes. Two tensors are compared only when their bytes' orders are the same: a packed or
channels-last tensor set against a plain one would blame an op for a relabelling, unless both name
their axes (`NHWC` from LiteRT, `NCHW` from MNN, ONNX Runtime or ncnn, `axis_letters`): then the
analyzer transposes one into the other's order (layerdiff.analyzer.align.axes). A harness that knows
the buffer a node lived in records `<producer>/<type>@<buffer>` (provenance: C-order bytes; the ggml
harness writes `ggml/f32@Vulkan0`) and, before it, a representation llama.cpp uses in some
configurations only: `rotated basis` (a quantized KV cache stores K and V, and attention
computes, multiplied by a rotation) and `V cache transposed` (no flash attention).
"""
from __future__ import annotations

import re

PLAIN = "graph order"
# Names that mean "row-major in the graph's own axis order" (by rank, as the harnesses write them).
PLAIN_NAMES = frozenset({"", "graph", "flat", "c", "nc", "hw", "ncw", "nchw", "ncdhw", "scalar"})
BUFFER_PROVENANCE = re.compile(r"^[A-Za-z0-9_]+/[^@\s/]+@\S+$")  # <producer>/<type>@<buffer>: C-order bytes
RANK_NAMES = {0: "scalar", 1: "C", 2: "NC", 3: "NCW", 4: "NCHW", 5: "NCDHW"}


def plain_layout(rank: int) -> str:
    """The name a harness writes for the graph's own order at this rank (`flat` past rank 5)."""
    return RANK_NAMES.get(rank, "flat")


def bytes_layout(label: object) -> str:
    """The order of the bytes a layout string records: `PLAIN`, or the packed/permuted form's name."""
    text = str(label or "").split(" (", 1)[0].strip()
    if text.lower() in PLAIN_NAMES or BUFFER_PROVENANCE.match(text):
        return PLAIN
    return text


AXES = "NCDHW"  # the letters a layout may name its axes with: batch, channels, depth, height, width


def axis_letters(label: object, rank: int) -> str:
    """The axes a recorded layout names, one letter per axis of a tensor of this rank (`NHWC`), or ''
    when it names none (the graph's order unnamed, a packed form, a basis, another rank)."""
    text = str(label or "").split(" (", 1)[0].strip().upper()
    if len(text) != rank or rank < 2 or len(set(text)) != rank or not set(text) <= set(AXES):
        return ""
    return text


def engine_layout(label: object) -> str:
    """How the engine held the tensor, when the producer recorded it (`MNN NC4HW4`), else ''."""
    text = str(label or "")
    return text.split(" (", 1)[1].rstrip(")").strip() if " (" in text else ""


def layouts_differ(a: object, b: object) -> bool:
    """True when the two recorded layouts put the same values in different byte orders."""
    return bytes_layout(a) != bytes_layout(b)
