"""The finding for a reference model output no layer of the run was paired with, with what the run computes instead.

A run whose output cannot be compared must never pass silently, and "no counterpart" alone leaves
the user guessing. The graphs say more: the last matched layers before the output show where the
two models still agree, and the run's own unmatched layers after their partners show what it
computes instead (pnnx's Silero VAD: after the last ReLU the golden computes a [1, 1, 1] conv and a
1-value output, the ncnn model a [1, 128] conv: a different tensor, not an inaccurate one).
"""
from __future__ import annotations

import json

import pandas as pd

from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity, named
from layerdiff.analyzer.align.graph import LayerGraph
from layerdiff.analyzer.align.naming import naming_of

MAX_CHAIN = 4


def unmatched_outputs(pair, alignment, graph: LayerGraph, other_graph: LayerGraph | None = None) -> list[Finding]:
    """A model output of the reference that no layer of the run was paired with: said, with why.

    The run's verdict weighs its outputs; an output it cannot show (another shape, another tensor:
    a conversion defect or a layer the engine never wrote) must be said, as a failure to check."""
    left = alignment.only_base
    if not len(left) or not graph.has_edges:  # every reference layer has its partner (the usual case)
        return []
    missing = left[left["key"].isin(set(graph.outputs()))]
    if len(missing):  # a dangling engine-inserted helper op (declared by the runs' engines) is no model output
        naming = naming_of(pair.base.attrs, pair.other.attrs)
        missing = missing[[not naming.is_helper(str(op)) for op in missing["op"]]]
    if not len(missing):
        return []
    consumed_ops = {str(k).rpartition(":")[0] for k, users in graph.consumers.items() if users}
    partner = dict(zip(alignment.matched["key"].tolist(), alignment.matched["other_key"].tolist()))
    out = []
    for r in missing.itertuples():
        side = str(r.op) in consumed_ops  # another output of the same op feeds the network: a state/side output
        what = "Side output" if side else "Model output"
        shape = _shapes(pair.base.layers).get(str(r.key), [])
        numbers = {"reference": pair.base.label, "why": str(r.why)}
        detail = _where_they_part(pair, graph, other_graph, str(r.key), partner, numbers)
        out.append(Finding(FindingKind.OUTPUT_UNMATCHED, pair.other.label, str(r.key), str(r.op_type),
                           f"{what} {r.key} ({r.op_type}, shape {shape}) of the reference {pair.base.label} has no "
                           f"counterpart in {pair.other.label} ({r.why or 'no layer paired with it'}), so it is not "
                           f"compared and the run cannot be said to reproduce it.{detail}",
                           severity=Severity.WARN if side else Severity.FAIL, numbers=numbers))
    return out


def _where_they_part(pair, graph: LayerGraph, other_graph: LayerGraph | None, key: str, partner: dict[str, str],
                     numbers: dict) -> str:
    """The last matched layers before `key` and what each run computes after them (fills `numbers`)."""
    feeders = graph.upstream(key, set(partner))
    if not feeders or other_graph is None or not other_graph.has_edges:
        return ""
    base_shapes, other_shapes = _shapes(pair.base.layers), _shapes(pair.other.layers)
    matched_other = set(partner.values())
    after_a = _between(graph, feeders, set(partner), key)
    after_b = [k for f in feeders for k in _unmatched_after(other_graph, partner[f], matched_other)]
    after_b = list(dict.fromkeys(after_b))
    numbers.update(last_matched=feeders, run_after=after_b)
    text = (f" Both agree up to {named(feeders)} (= {named([partner[f] for f in feeders])} in {pair.other.label}); "
            f"after it the reference computes {_chain(after_a, pair.base.layers, base_shapes)}, "
            f"{pair.other.label} computes {_chain(after_b, pair.other.layers, other_shapes) or 'nothing more'}.")
    ends = [k for k in after_b if not other_graph.consumers.get(k)]
    size = _size(base_shapes.get(key, []))
    differ = [k for k in ends if _size(other_shapes.get(k, [])) != size]
    if ends and len(differ) == len(ends):
        numbers.update(run_outputs=ends)
        text += (f" Its own output {named(ends)} has shape {other_shapes.get(ends[0])} where the reference's has "
                 f"{base_shapes.get(key)}: the run's model computes a different tensor there (a conversion that "
                 "changed the graph, or another model), not an inaccurate one.")
    return text


def _between(graph: LayerGraph, feeders: list[str], known: set[str], key: str) -> list[str]:
    """Reference layers from just after `feeders` to `key`, in execution order."""
    return sorted(graph.nearest(key, known)[1] | {key}, key=graph.position)


def _unmatched_after(graph: LayerGraph, start: str, matched: set[str]) -> list[str]:
    """The run's unmatched layers reachable from `start` without crossing a matched one."""
    return sorted(graph.nearest(start, matched, up=False)[1], key=graph.position)


def _chain(keys: list[str], layers: pd.DataFrame, shapes: dict[str, list[int]]) -> str:
    types = dict(zip(layers["key"], layers["op_type"]))
    parts = [f"{k} ({types.get(k, '')} {shapes.get(k, [])})" for k in keys[:MAX_CHAIN]]
    return " -> ".join(parts) + (" -> ..." if len(keys) > MAX_CHAIN else "")


def _shapes(layers: pd.DataFrame) -> dict[str, list[int]]:
    out = {}
    for key, cell in zip(layers["key"], layers["shape"]):
        try:
            out[str(key)] = [int(d) for d in json.loads(cell)]
        except (TypeError, ValueError):
            out[str(key)] = []
    return out


def _size(shape: list[int]) -> int:
    size = 1
    for d in shape:
        size *= d
    return size
