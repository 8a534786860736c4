"""Putting a run's tensor in the reference's axis order: NHWC against NCHW, and reshaped views.

A TFLite model computes channels-last (LiteRT dumps `[1, 64, 64, 24]`, recorded `NHWC`) and its MNN
conversion channels-first (`[1, 24, 64, 64]`, recorded `NCHW (MNN NC4HW4)`): the same values, their
axes in another order. Such a pair is compared after transposing the run's tensor into the
reference's order. The transpose comes from facts only, never from the values:
1. both recorded layouts name their axes with the same letters in another order (`NHWC` and `NCHW`):
   the letters give the transpose, whatever the sizes (a `[1, 8, 8, 8]` pair is settled too);
2. otherwise, when the shapes differ, the shapes themselves when they admit exactly one mapping
   (size-1 axes aside: they move no byte). Two axes of one size (H == W) leave two transposes and the
   layer is set aside, saying so.
Same shapes (or shapes that differ only by size-1 axes) are the same bytes. A layout that is no
axis order (a packed form, a rotated basis) is never transposed: it stays set aside.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from layerdiff.analyzer.formats.layouts import AXES, PLAIN, axis_letters, bytes_layout

@dataclass(frozen=True)
class AxisMap:
    """How a run's tensor lines up with the reference's.

    `status`: `same`, `squeezed` (size-1 axes differ), `permuted` (compared after `apply`),
    `ambiguous` or `layout` (set aside: `reason` says why) or `mismatch` (other sizes).
    `source`/`order`: the run's tensor reshaped to `source`, then transposed by `order`, holds the
    reference's axes (then reshaped to the reference's shape). `text` is what the table shows."""

    status: str
    source: tuple[int, ...] = ()
    order: tuple[int, ...] = ()
    text: str = ""
    reason: str = ""

    @property
    def measurable(self) -> bool:
        return self.status in ("same", "squeezed", "permuted")

    def apply(self, run: np.ndarray, reference_shape: tuple[int, ...]) -> np.ndarray:
        """The run's tensor in the reference's order and shape: a reshape and a transpose view (one
        copy when the reshape after the transpose needs contiguous values), never a Python loop."""
        if self.status != "permuted":
            return run.reshape(reference_shape)
        return run.reshape(self.source).transpose(self.order).reshape(reference_shape)


SAME = AxisMap("same")
SQUEEZED = AxisMap("squeezed")


@functools.lru_cache(maxsize=8192)
def axis_map(base_layout: str, base_shape: tuple[int, ...], other_layout: str,
             other_shape: tuple[int, ...]) -> AxisMap:
    """Decide how the run's tensor (`other_*`) maps onto the reference's (`base_*`), from the
    recorded layouts and the shapes (layers share both, so answers are cached)."""
    if math.prod(base_shape) != math.prod(other_shape):
        return AxisMap("mismatch", reason=f"shape {list(other_shape)} vs reference {list(base_shape)}")
    if not (_orderly(base_layout, base_shape) and _orderly(other_layout, other_shape)) and \
            bytes_layout(base_layout) != bytes_layout(other_layout):
        return AxisMap("layout", reason=f"not compared: the run holds these values as {bytes_layout(other_layout)}, "
                                        f"the reference as {bytes_layout(base_layout)} (recorded layouts differ; "
                                        "comparing them would blame an op for a relabelling)")
    declared = _declared(base_layout, base_shape, other_layout, other_shape)
    if declared is not None:
        return declared
    if base_shape == other_shape:
        return SAME
    if _squeezed(base_shape) == _squeezed(other_shape):
        return SQUEEZED
    return _by_shape(base_shape, other_shape)


def _orderly(layout: str, shape: tuple[int, ...]) -> bool:
    """The bytes are row-major in the recorded shape (the graph's order, or named axes), not packed."""
    return bytes_layout(layout) == PLAIN or bool(axis_letters(layout, len(shape)))


def _declared(base_layout: str, base_shape: tuple[int, ...], other_layout: str,
              other_shape: tuple[int, ...]) -> AxisMap | None:
    """The transpose both recorded layouts name (the same axis letters in another order), or None
    when they name none, or one the shapes contradict (a name written from the rank alone, as an
    ONNX graph's `NCHW` for a channels-last tensor: the shapes decide then)."""
    base_axes = axis_letters(base_layout, len(base_shape))
    other_axes = axis_letters(other_layout, len(other_shape))
    if not base_axes or not other_axes or base_axes == other_axes or sorted(base_axes) != sorted(other_axes):
        return None
    order = tuple(other_axes.index(letter) for letter in base_axes)
    if tuple(other_shape[i] for i in order) != base_shape:
        return None
    if base_shape == other_shape and _moves_nothing(other_shape, order):
        return SAME
    return AxisMap("permuted", other_shape, order, f"{other_axes}->{base_axes} {_order_text(order)}")


def _by_shape(base_shape: tuple[int, ...], other_shape: tuple[int, ...]) -> AxisMap:
    """The one transpose of the non-1 axes that turns the run's shape into the reference's."""
    base, other = _squeezed(base_shape), _squeezed(other_shape)
    if sorted(base) != sorted(other):
        return AxisMap("mismatch", reason=f"shape {list(other_shape)} vs reference {list(base_shape)}")
    repeated = sorted({size for size in base if base.count(size) > 1})
    if repeated:
        ways = math.prod(math.factorial(base.count(size)) for size in repeated)
        return AxisMap("ambiguous", reason=(
            f"not compared: ambiguous axis order: shape {list(other_shape)} maps onto the reference's "
            f"{list(base_shape)} in {ways} ways (axes of size {', '.join(map(str, repeated))} are "
            "interchangeable) and no recorded layout names the axes"))
    order = tuple(other.index(size) for size in base)  # sizes all differ: one axis each
    if len(base_shape) != len(other_shape):  # the order of the non-1 axes (the ranks differ)
        return AxisMap("permuted", other, order, f"by shape, axes other than 1 {_order_text(order)}")
    full = _full_order(base_shape, other_shape, order)
    return AxisMap("permuted", other_shape, full, f"by shape {_order_text(full)}")


def _full_order(base_shape: tuple[int, ...], other_shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """The transpose of all axes of an equal-rank pair: the non-1 axes as `order` maps them, the
    size-1 axes in their own order (they carry no byte)."""
    ones = iter(j for j, d in enumerate(other_shape) if d == 1)
    sized = [j for j, d in enumerate(other_shape) if d != 1]
    picks = iter(order)
    return tuple(next(ones) if d == 1 else sized[next(picks)] for d in base_shape)


def recorded_layouts(layers: pd.DataFrame) -> list[str]:
    """Each row's recorded layout as text ('' where the table has none: older dumps, some importers)."""
    if "layout" not in layers:
        return [""] * len(layers)
    return ["" if v is None or v != v else str(v) for v in layers["layout"].tolist()]


def names_axes(layouts: list[str]) -> bool:
    """True when a run records named axes (`NHWC`, `NCHW`) for some tensor: only two such runs are
    looked at in one standard axis order (a run that names none keeps its shapes as recorded)."""
    return any(axis_letters(text, len(text.split(" (", 1)[0].strip())) for text in set(layouts))


def canonical_order(layout: str, rank: int) -> tuple[int, ...] | None:
    """The transpose that puts a tensor whose layout names its axes in the letters' standard order
    (N, C, D, H, W: NHWC becomes NCHW), or None when the layout names none or they already are.
    Structural alignment compares shapes and values in this order, so NHWC and NCHW runs meet."""
    letters = axis_letters(layout, rank)
    if not letters:
        return None
    order = tuple(sorted(range(rank), key=lambda i: AXES.index(letters[i])))
    return None if order == tuple(range(rank)) else order


def canonical_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    order = canonical_order(layout, len(shape))
    return shape if order is None else tuple(shape[i] for i in order)


def canonical_tensor(tensor: np.ndarray | None, layout: str) -> np.ndarray | None:
    """The tensor in the standard axis order (a transpose view), as `canonical_shape` says."""
    if tensor is None:
        return None
    order = canonical_order(layout, tensor.ndim)
    return tensor if order is None else tensor.transpose(order)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _moves_nothing(shape: tuple[int, ...], order: tuple[int, ...]) -> bool:
    """True when the transpose only moves size-1 axes (every byte stays where it is)."""
    return [i for i in order if shape[i] != 1] == sorted(i for i in order if shape[i] != 1)


def _order_text(order: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, order)) + ")"
