"""Which of the model's outputs a run could not be compared on, and why.

A verdict weighs the outputs it measured. An output it could not measure (the run stopped before it,
the run has no such tensor, its layout or shape set it aside, the reference itself is cut short) is no
evidence either way, so a run with one is never called a pass: the verdict says which output and why.
"""
from __future__ import annotations

import pandas as pd

from layerdiff.analyzer.align.graph import LayerGraph
from layerdiff.analyzer.findings.verdict import Thresholds, pair_verdict
from layerdiff.analyzer.measure.comparison import Comparison

COMPARED = ("pass", "warn", "fail")
MAX_NAMED = 3


def outputs_not_compared(pair, rows: pd.DataFrame, graph: LayerGraph) -> list[str]:
    """One short clause per reason the pair's outputs were not all compared ([] when every one was).

    `graph` is the reference's (its declared outputs); `rows` the pair's rows of the tidy table."""
    said = []
    if not pair.base.dump.complete:
        said.append(f"the reference {pair.base.label} is incomplete (its harness stopped early)")
    if graph.missing:
        said.append(_names("declared output", list(graph.missing)) + " not in the reference's dump")
    outputs = rows[rows["is_output"].astype(bool)] if len(rows) else rows
    status = dict(zip(outputs["key"], outputs["status"])) if len(outputs) else {}
    absent = [key for key in graph.outputs() if key not in status]
    if absent:
        where = (f"the run stopped before {'it' if len(absent) == 1 else 'them'} (incomplete)"
                 if not pair.other.dump.complete else "the run has no counterpart")
        said.append(f"{_names('output', absent)}: {where}")
    set_aside = [key for key in graph.outputs() if status.get(key, "pass") not in COMPARED + ("shape_mismatch",)]
    if set_aside:
        first = outputs[outputs["key"] == set_aside[0]].iloc[0]
        said.append(f"{_names('output', set_aside)} set aside ({first['status']}"
                    + (f": {first['reasons']}" if str(first.get("reasons", "") or "") else "") + ")")
    return said


def run_stopped_early(pair, rows: pd.DataFrame, graph: LayerGraph) -> bool:
    """The run is incomplete and at least one output is missing from it: the app got no result."""
    if pair.other.dump.complete:
        return False
    keys = set(rows.loc[rows["is_output"].astype(bool), "key"]) if len(rows) else set()
    return any(key not in keys for key in graph.outputs())


def _names(kind: str, keys: list[str]) -> str:
    shown = ", ".join(keys[:MAX_NAMED]) + (f" and {len(keys) - MAX_NAMED} more" if len(keys) > MAX_NAMED else "")
    return f"{kind}{'s' if len(keys) > 1 else ''} {shown}"


def pair_verdicts(comparison: Comparison, t: Thresholds | None = None, judgements: dict | None = None) -> dict[int, tuple[str, str]]:
    """Each reference pair's (verdict, reason), weighing the outputs it could not compare: worked out once
    for the findings (which cap a layer finding at its run's verdict) and the summary (which shows it)."""
    judgements = judgements or {}
    verdicts = {}
    for index, pair in enumerate(comparison.plan.pairs):
        if pair.kind != "reference":
            continue
        rows = comparison.pair_rows(index)
        graph = comparison.graph(pair.base)
        verdicts[index] = pair_verdict(rows, t, judgements.get(index), outputs_not_compared(pair, rows, graph),
                                       run_stopped_early(pair, rows, graph))
    return verdicts
