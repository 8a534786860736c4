"""Graph propagation: the layers a monotone alignment misses because engines order parallel branches
differently (`layerdiff.analyzer.align.structure`, step 2).

A leftover layer matches the one leftover candidate of the same shape whose nearest matched
producers are the counterparts of its own (and whose values agree, when they can be read: then the
one whose values agree among a few such candidates, since ncnn's fused Conv+HardSwish leaves the conv
and its hswish both fed by the same matched layer). The candidates are grouped by their feeders once per round, so a round is linear in layers.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from layerdiff.analyzer.align.graph import build_graph

MAX_CANDIDATES = 12  # same-feeder candidates whose values are read to find the one that agrees


def propagate(base: pd.DataFrame, other: pd.DataFrame, base_left: list[int], other_left: list[int],
               done: dict[int, tuple[int, float]], quality: np.ndarray,
               error: Callable[[int, int], float] | None,
               agree: float) -> dict[int, tuple[int, float]]:
    """Leftovers whose nearest matched producers map onto those of exactly one same-shape candidate
    (whose values agree, when they can be read: a fused op's consumer has the same feeders)."""
    graph_a, graph_b = build_graph(base), build_graph(other)
    if not (graph_a.has_edges and graph_b.has_edges):
        return {}
    keys_a, keys_b = list(base["key"]), list(other["key"])
    found: dict[int, tuple[int, float]] = {}
    for _ in range(4):  # each round can anchor the next layers of a branch
        pairs = done | found
        to_b = {keys_a[i]: keys_b[j] for i, (j, _c) in pairs.items()}
        used_b = {j for j, _c in pairs.values()}
        known_a, known_b = set(to_b), set(to_b.values())
        added = 0
        by_feeders: dict[frozenset, list[tuple[int, int]]] = {}  # the other side's leftovers by nearest matched feeders
        for jb, j in enumerate(other_left):
            if j not in used_b:
                by_feeders.setdefault(frozenset(graph_b.nearest(keys_b[j], known_b)[0]), []).append((jb, j))
        for ia, i in enumerate(base_left):
            if i in pairs:
                continue
            feeders = frozenset(to_b[k] for k in graph_a.nearest(keys_a[i], known_a)[0])
            if not feeders:
                continue
            candidates = [(jb, j) for jb, j in by_feeders.get(feeders, ()) if j not in used_b and quality[ia, jb] > 0]
            if error is not None and len(candidates) <= MAX_CANDIDATES:  # a fused chain shares its feeders
                candidates = [(jb, j) for jb, j in candidates if error(i, j) <= agree]
            if len(candidates) == 1 and (error is None or error(i, candidates[0][1]) <= agree):
                jb, j = candidates[0]
                found[i] = (j, 0.8 * float(quality[ia, jb]))
                used_b.add(j)
                added += 1
        if not added:
            break
    return found
