"""When values overrule the graph edges in structural matching (`layerdiff.analyzer.align.structure`).

A match every graph edge agrees with is kept whatever its values, so a broken kernel meets its
partner and fails there. Two things say the edges are wrong instead, and both are about values:
- a *twin*: either tensor has the values (within the agreement threshold) of another same-shape
  tensor around it, so values name its partner;
- *consumers that agree*: the pair's values differ but every matched layer it feeds agrees, so the
  error goes nowhere: the two are different inner tensors of an op decomposed two ways.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from layerdiff.analyzer.align.edges import EdgeCheck, Matches

MAX_VALUE_CANDIDATES = 12  # candidates whose values are read per question (nearest first)


def consumers_agree(pair: tuple[int, int], error: Callable[[int, int], float] | None, edges: EdgeCheck | None,
                    matches: Matches | None, agree: float) -> bool:
    """Whether every matched layer `pair` feeds agrees in values while the pair itself does not.

    A broken kernel's error reaches the layers it feeds; when all of them agree within `agree`, the
    two tensors are different inner tensors of one op decomposed two ways (Paddle's HardSigmoid
    `clip(0.2 x + 0.5)` is `x * 0.2`, `+ 0.5`, ReLU6 in MNN; pnnx writes `x * 1.2` then ncnn's
    HardSigmoid(1/6, 0.5): `0.2 x` and `1.2 x` sit in the same place and are no pair)."""
    if error is None or edges is None or matches is None:
        return False
    with matches.trying(*pair):
        consumers = edges.consumer_pairs(pair, matches)
    return bool(consumers) and all(error(a, b) <= agree for a, b in consumers)


def siblings(pair: tuple[int, int], edges: EdgeCheck | None, matches: Matches | None) -> tuple[list[int], list[int]]:
    """Per side, the rows computed from the same matched layers as that side's row of `pair`."""
    if edges is None or matches is None:
        return [], []
    return edges.siblings(0, pair[0], matches), edges.siblings(1, pair[1], matches)


def twin_elsewhere(pair: tuple[int, int], quality: np.ndarray, error: Callable[[int, int], float] | None,
                   agree: float, span_a: tuple[int, int], span_b: tuple[int, int],
                   kin: tuple[list[int], list[int]] = ([], [])) -> bool:
    """Whether either tensor of `pair` has the values of another same-shape tensor around it (its
    neighbouring matches included): then values, not a broken op, say where it belongs (a Conv
    without its bias beside the Add that applies it; an fc with its bias and the Reshape after it).

    "Around it" is the span between its neighbouring matches, the same-shape rows nearest the pair's
    own on each side, and its siblings `kin` (per side, the rows computed from the same matched layers):
    two parallel branches fed by one Concat (PicoDet's CSP blocks: two 1x1 convs of one shape) are
    run in opposite orders by MNN and ncnn, so the monotone pass pairs the first of one run with the
    first of the other, both consuming the same matched tensor (every edge agrees) while the true
    partner sits past the next match, outside the span, or twenty layers later."""
    if error is None:
        return False
    i, j = pair
    rows_a = _around(i, span_a, quality[:, j], kin[0])
    rows_b = _around(j, span_b, quality[i, :], kin[1])
    return (any(error(a, j) <= agree for a in rows_a) or any(error(i, b) <= agree for b in rows_b))


def _around(row: int, span: tuple[int, int], same_shape: np.ndarray, kin: list[int]) -> list[int]:
    """Same-shape rows (`same_shape > 0`) of one side to look for a twin of `row` among: those of the
    span (widened by one), the nearest others within MAX_VALUE_CANDIDATES rows of `row`, and the
    nearest same-shape siblings."""
    size = len(same_shape)
    in_span = [r for r in range(max(span[0] - 1, 0), min(span[1] + 1, size)) if r != row]
    in_span = [r for r in in_span[:MAX_VALUE_CANDIDATES] if same_shape[r] > 0]
    near = np.flatnonzero(same_shape[max(row - MAX_VALUE_CANDIDATES, 0):row + MAX_VALUE_CANDIDATES + 1] > 0)
    near = near + max(row - MAX_VALUE_CANDIDATES, 0)
    near = sorted((int(r) for r in near if r != row and r not in in_span), key=lambda r: abs(r - row))
    seen = set(in_span) | set(near[:MAX_VALUE_CANDIDATES])
    related = [r for r in kin if same_shape[r] > 0 and r not in seen][:MAX_VALUE_CANDIDATES]
    return in_span + near[:MAX_VALUE_CANDIDATES] + related
