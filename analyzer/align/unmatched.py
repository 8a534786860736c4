"""Why a layer of one run has no partner in the other: the sentence listed next to every unmatched layer.

`layerdiff.analyzer.align.byname` aligns; this module only explains what alignment left, in the
terms a user can check (an engine-inserted op, a model input, a shape the other run never writes,
candidates between two matched neighbours that neither values nor edges confirmed).
"""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import pandas as pd

from layerdiff.analyzer.align.naming import NEUTRAL, PairNaming
from layerdiff.analyzer.runs.header import declared_unobservable

@dataclass
class Unmatched:
    """Why a layer of `layers` has no partner in `partner` (`rows`: this side's row -> partner row)."""

    layers: pd.DataFrame
    partner: pd.DataFrame
    rows: dict[int, int]
    by_structure: bool
    naming: PairNaming = NEUTRAL  # the pair's name rules: the helper ops its engines declare

    def reason(self, row: int) -> str:
        op, op_type = str(self._column("op")[row]), str(self._column("op_type")[row])
        shape = _shape(self._column("shape")[row])
        helper = self.naming.helper_reason(op)
        if helper:
            return helper
        if op_type.lower() in ("input", "data"):
            return "model input: fed to the model, not computed by a layer (the other run has no layer for it)"
        if not self.by_structure:
            fused = self._fused_into(row)
            if fused:  # Paddle-Lite's conv+bn+act: the fused kernel writes only the last variable
                return f"fused in the other run: its value is inside {fused}, the next layer on its path that both runs have"
            return "no layer of this name in the other run (after the built-in and --rename/--name-map rules)"
        if not shape:
            return "its shape is unknown, so structure cannot pair it"
        if _squeezed(shape) not in self._partner_shapes:
            return f"no layer of the other run has shape {list(shape)}"
        return self._between(row, shape)

    def _fused_into(self, row: int) -> str:
        """The first matched layer this one feeds (graph edges of its own run), when the two runs name
        layers alike: the op that kept only its last output after fusion. "" without edges or such a layer."""
        if "inputs" not in self.layers or "name" not in self.layers:
            return ""
        graph, keys = self._graph, self._column("key")
        matched = self._matched_keys
        seen, frontier = set(), [str(keys[row])]
        while frontier:
            following = []
            for key in frontier:
                for consumer in graph.consumers.get(key, ()):
                    if consumer in matched:
                        return consumer if self._skips(consumer, str(keys[row])) else ""
                    if consumer not in seen and len(seen) < 64:  # fusion spans a few ops, never the network
                        seen.add(consumer)
                        following.append(consumer)
            frontier = sorted(following, key=graph.position)
        return ""

    def _skips(self, consumer: str, key: str) -> bool:
        """Whether the other run's `consumer` reads what fed `key` here (an ancestor), not `key`'s path:
        the mark of a fused op rather than a layer the other run merely did not dump."""
        partner_graph = self._partner_graph
        partner_key = self._partner_key.get(consumer)
        if partner_key is None or "inputs" not in self.partner:
            return False
        feeders = {self._own_key.get(k) for k in partner_graph.producers.get(partner_key, ())}
        ancestors, frontier = set(), [key]
        while frontier and len(ancestors) < 64:
            frontier = [p for k in frontier for p in self._graph.producers.get(k, ()) if p not in ancestors]
            ancestors.update(frontier)
        own_matched_ancestors = ancestors & self._matched_keys
        return bool(feeders & ancestors) or (not partner_graph.producers.get(partner_key) and not own_matched_ancestors)

    @cached_property
    def _matched_keys(self) -> set[str]:
        keys = self._column("key")
        return {str(keys[i]) for i in self.rows}

    @cached_property
    def _partner_key(self) -> dict[str, str]:
        keys, partner_keys = self._column("key"), self.partner["key"].to_numpy()
        return {str(keys[i]): str(partner_keys[j]) for i, j in self.rows.items()}

    @cached_property
    def _own_key(self) -> dict[str, str]:
        return {p: k for k, p in self._partner_key.items()}

    @cached_property
    def _partner_graph(self):
        from layerdiff.analyzer.align.graph import build_graph

        return build_graph(self.partner)

    @cached_property
    def _graph(self):
        from layerdiff.analyzer.align.graph import build_graph

        return build_graph(self.layers)

    @cached_property
    def _partner_shapes(self) -> set[tuple[int, ...]]:
        return {_squeezed(_shape(cell)) for cell in self.partner["shape"]}

    def _column(self, name: str) -> np.ndarray:
        """A column of `layers` as an array, made once (pandas' per-row access cost ~0.4 ms a layer)."""
        columns = self.__dict__.setdefault("_columns", {})
        if name not in columns:
            columns[name] = self.layers[name].to_numpy()
        return columns[name]

    @cached_property
    def _partner_shape_cells(self) -> np.ndarray:
        return self.partner["shape"].to_numpy()

    @cached_property
    def _matched_rows(self) -> list[int]:
        return sorted(self.rows)

    @cached_property
    def _used(self) -> set[int]:
        return set(self.rows.values())

    def _between(self, row: int, shape: tuple[int, ...]) -> str:
        """Name the matched layers around it and what the other run has in between."""
        matched = self._matched_rows
        at = bisect.bisect_left(matched, row)
        before = matched[at - 1] if at > 0 else None
        after = matched[at] if at < len(matched) and matched[at] != row else (
            matched[at + 1] if at + 1 < len(matched) else None)
        low = self.rows[before] if before is not None else -1
        high = self.rows[after] if after is not None else len(self.partner)
        used = self._used
        same = [r for r in range(min(low, high) + 1, max(low, high)) if r not in used
                and _squeezed(_shape(self._partner_shape_cells[r])) == _squeezed(shape)]
        keys = self.layers["key"]
        span = (f"between the matched layers {keys.iloc[before]} and {keys.iloc[after]}" if before is not None
                and after is not None else f"after the matched layer {keys.iloc[before]}" if before is not None
                else f"before the matched layer {keys.iloc[after]}" if after is not None else "anywhere")
        if not same:
            return (f"the other run writes no tensor of shape {list(shape)} {span}: computed inside an op it "
                    "fuses or folds there")
        return (f"{len(same)} layer(s) of the other run with shape {list(shape)} {span}, none confirmed by "
                "values or by the graph edges")


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


@lru_cache(maxsize=4096)
def _shape(cell: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in json.loads(cell))
    except (json.JSONDecodeError, TypeError, ValueError):
        return ()


def relabel_unmatched(alignment, base, other) -> None:
    """Unmatched layers the other side declared unobservable say so (instead of 'no layer of this name')."""
    for frame, declaring in ((alignment.only_base, other), (alignment.only_other, base)):
        hidden = declared_unobservable(declaring)
        if not hidden or frame.empty:
            continue
        known = frame["key"].isin(list(hidden))
        frame.loc[known, "why"] = [hidden[k] for k in frame.loc[known, "key"]]
