"""The layer graph of one dump, rebuilt from the `/layers` table's `name` and `inputs` columns.

Findings that separate "this op broke" from "this op inherited the error" (failure source, NaN/Inf
origin, zero-collapse origin, error growth) all ask the same question: which layers feed this one?
The dump stores edges as tensor *names*; this module maps them to layer keys once, so findings work
on keys only. Names that no layer produced are model inputs and have no producer.

A model's outputs are the ones it declares (the dump's `outputs` attribute: a graph output may also
feed another op, as an audio-to-MIDI network's note output feeds its onset branch); a dump that
declares none (ncnn's .param has no outputs) falls back to the layers nothing consumes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class LayerGraph:
    """Producers and consumers per layer key, plus the execution order of the keys."""

    order: list[str]
    producers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    consumers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    declared: tuple[str, ...] = ()  # keys of the outputs the model declares, in its order
    missing: tuple[str, ...] = ()  # declared output names no layer of the dump holds
    _positions: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def has_edges(self) -> bool:
        return any(self.producers.values())

    def outputs(self) -> list[str]:
        """The model's outputs: the ones it declares, consumed or not; without a declaration the layers
        nothing consumes (the last layer when the dump has no edges)."""
        if self.declared:
            return list(self.declared)
        if not self.has_edges:
            return self.order[-1:]
        return [key for key in self.order if not self.consumers.get(key)]

    def upstream(self, key: str, known: set[str]) -> list[str]:
        """Nearest producers of `key` that are in `known`, walking through layers that are not.

        Layers a run could not be compared on (an op only one backend has, a layer whose shape did
        not match) must not cut the graph: their own producers stand in for them.
        """
        return sorted(self.nearest(key, known)[0], key=self.position)

    def nearest(self, key: str, known: set[str], up: bool = True) -> tuple[set[str], set[str]]:
        """The nearest layers in `known` up (producers) or down (consumers) from `key`, walking
        through the layers that are not, and those walked-through layers themselves."""
        edges = self.producers if up else self.consumers
        found: set[str] = set()
        seen: set[str] = set()
        stack = list(edges.get(key, []))
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            if current in known:
                found.add(current)
            else:
                stack.extend(edges.get(current, []))
        return found, seen - found

    def position(self, key: str) -> int:
        """Execution index of a key (-1 when the dump does not have it)."""
        if not self._positions and self.order:  # built once (duplicate keys keep their last index)
            self._positions = {k: i for i, k in enumerate(self.order)}
        return self._positions.get(key, -1)


def declared_outputs(attrs) -> list[str]:
    """The output tensor names a dump's `outputs` attribute declares (a JSON list; [] when absent or malformed)."""
    text = attrs.get("outputs") if hasattr(attrs, "get") else None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        value = json.loads(text) if isinstance(text, str) and text.strip() else []
    except json.JSONDecodeError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def build_graph(layers: pd.DataFrame, outputs: list[str] = ()) -> LayerGraph:
    """Graph of one dump's layers; tolerant of malformed `inputs` cells (treated as no edges).

    `outputs`: the tensor names the model declares as outputs (`declared_outputs`)."""
    order = layers["key"].tolist()  # lists: stepping through a pandas string column costs ~1 us a cell
    producer_of = dict(zip(layers["name"].tolist(), order))
    graph = LayerGraph(order=order)
    found = [producer_of[name] for name in outputs if name in producer_of]
    if found:  # declared names none of which this dump holds (a --layers filter): the unconsumed layers stand in
        graph.declared = tuple(dict.fromkeys(found))
        graph.missing = tuple(name for name in outputs if name not in producer_of)
    for key, names in zip(order, _parse_all_names(layers["inputs"].tolist())):
        sources = tuple(dict.fromkeys(producer_of[n] for n in names if n in producer_of and producer_of[n] != key))
        graph.producers[key] = sources
        for source in sources:
            graph.consumers.setdefault(source, []).append(key)
    for key, users in graph.consumers.items():  # tuples: a list per layer was ~4 MB more at 50,000 layers
        graph.consumers[key] = tuple(users)
    return graph


def run_graph(run) -> LayerGraph:
    """The graph of an opened run (`analyzer.runs.sources.Run` or a DumpFile), with its declared outputs."""
    return build_graph(run.layers, declared_outputs(run.attrs))


def _parse_all_names(cells: list) -> list[list[str]]:
    """Every layer's input names: the whole column parsed as one JSON document (one parse instead of one per
    layer, a third of building the graph), or cell by cell when any cell is not a clean JSON list of texts."""
    if cells and all(isinstance(cell, str) and cell.startswith("[") for cell in cells):
        try:
            parsed = json.loads("[" + ",".join(cells) + "]")
        except (json.JSONDecodeError, RecursionError):
            parsed = None
        if (parsed is not None and len(parsed) == len(cells)
                and all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in parsed)):
            return parsed
    return [_parse_names(cell) for cell in cells]


def _parse_names(cell: str) -> list[str]:
    try:
        value = json.loads(cell) if cell else []
    except (json.JSONDecodeError, TypeError):
        return []
    return [str(v) for v in value] if isinstance(value, list) else []
