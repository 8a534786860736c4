"""Whether a structural match agrees with the graph edges of both runs (producers and consumers).

Values cannot tell a truly wrong layer from a wrong partner: a broken kernel's output and every
tensor downstream of it differ from the reference as much as an unrelated tensor does. The edges
can. A pair (a, b) is *edge-consistent* when the nearest matched layers feeding `a` are the
partners of those feeding `b`, and the same holds for the nearest matched layers `a` and `b`
feed, each of which must in turn see exactly the partners of its own feeders. That is what rules
out the inner tensors of a fused or decomposed op: ONNX's HardSwish is `x * clip(x + 3) / 6`, and
pairing ncnn's one `hswish` tensor with the golden's `Clip` leaves the next conv fed by both `Clip`
and `x` on one side and by `hswish` alone on the other.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from layerdiff.analyzer.align.graph import LayerGraph, build_graph


@dataclass
class EdgeCheck:
    """The two runs' graphs, addressed by row index of their `/layers` tables."""

    graph_a: LayerGraph
    graph_b: LayerGraph
    keys_a: list[str]
    keys_b: list[str]
    weighted_a: set[str]  # keys of the layers that apply learned weights (conv, fc, matmul)
    weighted_b: set[str]
    _rows: tuple[dict[str, int], dict[str, int]] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, base: pd.DataFrame, other: pd.DataFrame, base_rows: list[int], other_rows: list[int],
           is_weighted: Callable[[str, str], bool]) -> "EdgeCheck | None":
        """Pairs are given as indexes into `base_rows`/`other_rows` (the rows left to match).

        None when either dump stores no edges (then only order, shapes, types and values decide)."""
        graph_a, graph_b = build_graph(base), build_graph(other)
        if not (graph_a.has_edges and graph_b.has_edges):
            return None
        keys_a, keys_b = list(base["key"]), list(other["key"])
        return cls(graph_a, graph_b, [keys_a[r] for r in base_rows], [keys_b[r] for r in other_rows],
                   _weighted_keys(base, is_weighted), _weighted_keys(other, is_weighted))

    def matches(self, pairs: list[tuple[int, int]]) -> "Matches":
        """The current matches, kept by key and updated in place as a settling pass goes on."""
        state = Matches(self.keys_a, self.keys_b)
        for a, b in pairs:
            state.add(a, b)
        return state

    def consistency(self, pair: tuple[int, int], matches: "Matches") -> tuple[int, int]:
        """(edges that agree, edges checked) for `pair` given the other matches (row a -> row b).

        Checked: the pair's own nearest matched feeders; its nearest matched consumers; and each of
        those consumers' feeders (with `pair` counted as matched, in place of any match of its rows).
        The matches are changed for the check and restored: rebuilding them per candidate made a
        settling pass quadratic in layers (11 s of 27 at 3,600 layers)."""
        i, j = pair
        with matches.trying(i, j):
            return self._consistency(self.keys_a[i], self.keys_b[j], matches.to_b, matches.to_a)

    def _consistency(self, key_a: str, key_b: str, to_b: dict[str, str], to_a: dict[str, str]) -> tuple[int, int]:
        consumers_a = downstream(self.graph_a, key_a, to_b)
        consumers = [(key_a, key_b)] + [(k, to_b[k]) for k in consumers_a]
        agree = int({to_b[k] for k in consumers_a} == set(downstream(self.graph_b, key_b, to_a)))
        for one_a, one_b in consumers:
            feeders_a, weights_a = feeders(self.graph_a, one_a, to_b, self.weighted_a)
            feeders_b, weights_b = feeders(self.graph_b, one_b, to_a, self.weighted_b)
            agree += {to_b[k] for k in feeders_a} == feeders_b and weights_a == weights_b
        return agree, 1 + len(consumers)


    def consumer_pairs(self, pair: tuple[int, int], matches: "Matches") -> list[tuple[int, int]]:
        """The matches (row a, row b) of the nearest matched layers that row a of `pair` feeds."""
        self._index()
        rows_a, rows_b = self._rows
        out = []
        for key in downstream(self.graph_a, self.keys_a[pair[0]], matches.to_b):
            if key in rows_a and matches.to_b[key] in rows_b:
                out.append((rows_a[key], rows_b[matches.to_b[key]]))
        return out

    def _index(self) -> None:
        if self._rows is None:
            self._rows = ({k: r for r, k in enumerate(self.keys_a)}, {k: r for r, k in enumerate(self.keys_b)})

    def siblings(self, side: int, row: int, matches: "Matches") -> list[int]:
        """Rows (of the rows left, on `side` 0 = a, 1 = b) computed from the same nearest matched
        layers as `row`: the layers downstream of its matched feeders, up to and including the
        next matched ones. Two parallel branches fed by one tensor are siblings wherever each run put
        them in its execution order."""
        graph, keys = (self.graph_a, self.keys_a) if side == 0 else (self.graph_b, self.keys_b)
        known = matches.to_b if side == 0 else matches.to_a
        self._index()
        rows = self._rows[side]
        found: set[int] = set()
        for feeder in graph.nearest(keys[row], known)[0]:
            matched, walked = graph.nearest(feeder, known, up=False)  # a match not yet settled may be wrong
            found.update(rows[k] for k in matched | walked if k in rows)
        found.discard(row)
        return sorted(found, key=lambda r: abs(r - row))


class Matches:
    """Matched keys both ways (`to_b`: key a -> key b, `to_a` the reverse), by row of the rows left."""

    def __init__(self, keys_a: list[str], keys_b: list[str]) -> None:
        self.keys_a, self.keys_b = keys_a, keys_b
        self.to_b: dict[str, str] = {}
        self.to_a: dict[str, str] = {}

    def add(self, a: int, b: int) -> None:
        self._link(self.keys_a[a], self.keys_b[b])

    def remove(self, a: int, b: int) -> None:
        key_a, key_b = self.keys_a[a], self.keys_b[b]
        if self.to_b.get(key_a) == key_b:
            del self.to_b[key_a], self.to_a[key_b]

    def _link(self, key_a: str, key_b: str) -> None:
        self.to_b[key_a] = key_b
        self.to_a[key_b] = key_a

    def _unlink(self, key_a: str | None, key_b: str | None) -> None:
        if key_a is not None and key_b is not None and self.to_b.get(key_a) == key_b:
            del self.to_b[key_a], self.to_a[key_b]

    @contextmanager
    def trying(self, a: int, b: int):
        """The matches with (a, b) in place of any match of row a or row b, restored on exit."""
        key_a, key_b = self.keys_a[a], self.keys_b[b]
        displaced = [(key_a, self.to_b.get(key_a)), (self.to_a.get(key_b), key_b)]
        for old_a, old_b in displaced:
            self._unlink(old_a, old_b)
        self._link(key_a, key_b)
        try:
            yield
        finally:
            self._unlink(key_a, key_b)
            for old_a, old_b in displaced:
                if old_a is not None and old_b is not None:
                    self._link(old_a, old_b)


def feeders(graph: LayerGraph, key: str, known, weighted: set[str]) -> tuple[set[str], int]:
    """Nearest producers of `key` in `known`, and how many weighted ops (`key` and the layers walked
    through on the way) compute it from them: a conv cannot vanish between two matched layers."""
    found, through = graph.nearest(key, known)
    return found, len(through & weighted) + (key in weighted)


def _weighted_keys(layers: pd.DataFrame, is_weighted: Callable[[str, str], bool]) -> set[str]:
    return {str(k) for k, t, o in zip(layers["key"], layers["op_type"], layers["op"]) if is_weighted(str(t), str(o))}


def downstream(graph: LayerGraph, key: str, known) -> set[str]:
    """Nearest consumers of `key` that are in `known`, walking through layers that are not."""
    return graph.nearest(key, known, up=False)[0]
