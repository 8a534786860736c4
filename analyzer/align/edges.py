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

from dataclasses import dataclass
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

    def consistency(self, pair: tuple[int, int], mapping: dict[int, int]) -> tuple[int, int]:
        """(edges that agree, edges checked) for `pair` given the other matches `mapping` (row a -> row b).

        Checked: the pair's own nearest matched feeders; its nearest matched consumers; and each of
        those consumers' feeders (with `pair` counted as matched)."""
        i, j = pair
        to_b = {self.keys_a[a]: self.keys_b[b] for a, b in mapping.items() if a != i and b != j}
        to_b[self.keys_a[i]] = self.keys_b[j]
        known_a, known_b = set(to_b), set(to_b.values())
        consumers_a = downstream(self.graph_a, self.keys_a[i], known_a)
        consumers = [(self.keys_a[i], self.keys_b[j])] + [(k, to_b[k]) for k in consumers_a]
        agree = int({to_b[k] for k in consumers_a} == set(downstream(self.graph_b, self.keys_b[j], known_b)))
        for key_a, key_b in consumers:
            feeders_a, weights_a = feeders(self.graph_a, key_a, known_a, self.weighted_a)
            feeders_b, weights_b = feeders(self.graph_b, key_b, known_b, self.weighted_b)
            agree += {to_b[k] for k in feeders_a} == feeders_b and weights_a == weights_b
        return agree, 1 + len(consumers)


def feeders(graph: LayerGraph, key: str, known: set[str], weighted: set[str]) -> tuple[set[str], int]:
    """Nearest producers of `key` in `known`, and how many weighted ops (`key` and the layers walked
    through on the way) compute it from them: a conv cannot vanish between two matched layers."""
    found, through = graph.nearest(key, known)
    return found, len(through & weighted) + (key in weighted)


def _weighted_keys(layers: pd.DataFrame, is_weighted: Callable[[str, str], bool]) -> set[str]:
    return {str(k) for k, t, o in zip(layers["key"], layers["op_type"], layers["op"]) if is_weighted(str(t), str(o))}


def downstream(graph: LayerGraph, key: str, known: set[str]) -> set[str]:
    """Nearest consumers of `key` that are in `known`, walking through layers that are not."""
    return graph.nearest(key, known, up=False)[0]
