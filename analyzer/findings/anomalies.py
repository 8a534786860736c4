"""What a layer's input already holds: values a finding must not blame on the layer itself.

A Log fed exact zeros yields -Inf, an Exp fed -28,450 where the reference's input reaches -10 yields
nonsense, and neither op "breaks": the anomaly arrived with its input. Measurement records the facts
per layer (`n_zero_new`, `n_out_of_range` with `range_excess`, the new NaN/Inf counts; see
analyzer/measure/metrics.py); this module decides which of them are anomalies and follows one back
along the graph's edges to the layer where it starts, so the NaN/Inf origin and failure source
findings can move there and say why. It reads no tensor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from layerdiff.analyzer.align.graph import LayerGraph
from layerdiff.analyzer.findings.wording import layer_name

# A run value this far outside the reference's [min, max], in units of that range's width, is out of
# range: fp16 rounding of the maximum reaches past it by ~1e-3 of the width, an overflowed sum by far more.
OUT_OF_RANGE_WIDTHS = 1.0
ZERO, RANGE, NONFINITE = "zeros", "out_of_range", "nonfinite"


@dataclass
class Anomaly:
    """One kind of anomaly a layer holds, with the sentence fragment that states it."""

    key: str
    kind: str
    count: int
    text: str


def layer_anomalies(key: str, fact: dict) -> list[Anomaly]:
    """Every anomaly one measured row holds (new NaN/Inf, values far outside the reference's range,
    exact zeros where the reference is non-zero), most severe first."""
    found = []
    nonfinite = sum(_count(fact, c) for c in ("n_nan_new", "n_posinf_new", "n_neginf_new"))
    if nonfinite:
        found.append(Anomaly(key, NONFINITE, nonfinite, f"{nonfinite:,} NaN/Inf values where the reference has finite ones"))
    excess = fact.get("range_excess")
    if _count(fact, "n_out_of_range") and excess is not None and math.isfinite(excess) and excess > OUT_OF_RANGE_WIDTHS:
        found.append(Anomaly(key, RANGE, _count(fact, "n_out_of_range"), _range_text(fact)))
    zeros = _count(fact, "n_zero_new")
    if zeros:
        found.append(Anomaly(key, ZERO, zeros, f"{zeros:,} exact zeros where the reference's values are non-zero"
                                                + _unseen_clause(fact)))
    return found


def input_anomaly(key: str, graph: LayerGraph, facts: dict[str, dict], kinds: tuple[str, ...]) -> tuple[Anomaly, str] | None:
    """The first input of `key` holding an anomaly of one of `kinds`, and the layer upstream where that
    anomaly starts (its own inputs hold none of that kind); None when every input is clean."""
    for feeder in graph.upstream(key, set(facts)):
        for anomaly in layer_anomalies(feeder, facts[feeder]):
            if anomaly.kind in kinds:
                return anomaly, anomaly_start(feeder, anomaly.kind, graph, facts)
    return None


def anomaly_start(key: str, kind: str, graph: LayerGraph, facts: dict[str, dict]) -> str:
    """Walk up the inputs that already hold most of the same anomaly (at least half as many values) to
    the layer where it starts: one stray zero two layers up does not make that layer the start of 128."""
    current, seen = key, {key}
    while True:
        count = _kind_count(current, kind, facts)
        carriers = [f for f in graph.upstream(current, set(facts))
                    if f not in seen and 2 * _kind_count(f, kind, facts) >= count > 0]
        if not carriers:
            return current
        current = min(carriers, key=graph.position)
        seen.add(current)


def _kind_count(key: str, kind: str, facts: dict[str, dict]) -> int:
    return next((a.count for a in layer_anomalies(key, facts[key]) if a.kind == kind), 0)


def moved_clause(what: str, at: str, anomaly: Anomaly, start: str, facts: dict[str, dict], op_types: dict[str, str]) -> str:
    """The sentence that moves a finding upstream: `at`'s input already holds the anomaly, born at `start`."""
    clause = (f"; but its input {layer_name(anomaly.key)} already holds {anomaly.text}, so {at} inherits the {what} "
              f"rather than making it")
    if start != anomaly.key:
        origin = layer_anomalies(start, facts[start])
        born = next((a for a in origin if a.kind == anomaly.kind), None)
        clause += (f"; that starts at layer {layer_name(start)} ({op_types.get(start, '?')})"
                   + (f", which holds {born.text}" if born else "") + " while its own inputs hold none")
    return clause


def anomaly_numbers(anomaly: Anomaly, start: str, moved_from: str) -> dict:
    """The move as fields for --json."""
    return {"moved_from": moved_from, "input_anomaly": anomaly.kind, "anomalous_input": anomaly.key,
            "anomaly_count": int(anomaly.count), "anomaly_start": start}


def _range_text(fact: dict) -> str:
    lo, hi = float(fact["ref_min"]), float(fact["ref_max"])
    run_lo, run_hi = float(fact["run_min"]), float(fact["run_max"])
    if math.isfinite(run_lo) and run_lo < lo and (lo - run_lo) >= (run_hi - hi if math.isfinite(run_hi) else 0.0):
        reach = f"down to {run_lo:,.5g} where the reference's minimum is {lo:,.5g}"
    else:
        reach = f"up to {run_hi:,.5g} where the reference's maximum is {hi:,.5g}"
    return f"{_count(fact, 'n_out_of_range'):,} values outside the reference's range ({reach})"


def _unseen_clause(fact: dict) -> str:
    """Zeros that rel L2 hides: the input itself passes."""
    rel, status = fact.get("rel_l2"), fact.get("status")
    if status == "pass" and rel is not None and math.isfinite(rel):
        return f" (it passes at rel L2 {rel:.2g}: rel L2 does not show them)"
    return ""


def _count(fact: dict, column: str) -> int:
    value = fact.get(column)
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return 0
    return int(value)
