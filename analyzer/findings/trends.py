"""Findings about how the error develops rather than where it breaks: over depth, and over inputs.

Drift from low-precision arithmetic or fp16 weight storage has no culprit layer, so the question
is the shape of the curve (where it starts, how much it grows, what reaches the output). A fault
that only some inputs trigger (fp16 underflow on dark images) is a question across runs: which
inputs fail on a configuration, where, and which of them collapse to zeros.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd

from layerdiff.analyzer.measure.comparison import Comparison
from layerdiff.analyzer.runs.sources import Run
from layerdiff.analyzer.measure.rows import by_position
from layerdiff.analyzer.findings.finding import Finding, FindingKind, MAX_NAMED, Severity
from layerdiff.analyzer.findings.verdict import Thresholds, worst_output
from layerdiff.analyzer.findings.wording import layer_name, percent

MAX_OTHER_OUTPUTS = 4
VERB = {"pass": "passes", "warn": "warns", "fail": "fails"}


def error_curve(rows: pd.DataFrame) -> list[Finding]:
    """How the error develops over depth, for a run with any warning: start, peak, thirds, output.

    Low-precision drift has no culprit layer; what a user needs is the curve in numbers: where the
    error starts, how much it grows, whether it keeps growing (median by thirds of the network),
    and what is left of it at the output (rel L2, top-1 / top-5 agreement).
    """
    if not rows["status"].isin(["warn", "fail"]).any():
        return []
    ordered = by_position(rows)
    rel = ordered["rel_l2"].astype(float)
    measured = ordered[np.isfinite(rel) & (rel > 0)]
    if measured.empty:
        return []
    first = measured.iloc[0]
    peak = measured.loc[measured["rel_l2"].astype(float).idxmax()]
    growth = float(peak["rel_l2"]) / float(first["rel_l2"])
    thirds = _thirds_median(measured["rel_l2"].astype(float))
    numbers = {"first_layer": first["key"], "first_rel_l2": float(first["rel_l2"]), "peak_layer": peak["key"],
               "peak_rel_l2": float(peak["rel_l2"]), "growth": growth, "thirds_median_rel_l2": thirds,
               "layers": int(len(ordered))}
    grows = (f" grows {growth:.{1 if growth < 100 else 0}f}x to {peak['rel_l2']:.2g} at {_at(peak)}"
             if peak["key"] != first["key"] else " is the largest anywhere")
    text = (f"Error over depth in {first['run']}: rel L2 {first['rel_l2']:.2g} at {_at(first)}{grows} "
            f"(median by thirds of the network: {' -> '.join(f'{v:.2g}' for v in thirds)})")
    broken = ordered[ordered["n_nonfinite_mismatch"].fillna(0) > 0]  # not unreadable / mismatched layers
    if len(broken):
        numbers["nonfinite_layers"] = int(len(broken))
        text += f"; {len(broken)} layer(s) carry NaN/Inf from {broken.iloc[0]['key']} on"
    return [Finding(FindingKind.ERROR_CURVE, first["run"], peak["key"], peak["op_type"],
                    text + _output_clause(ordered, numbers) + ".", severity=Severity.INFO, numbers=numbers)]


def _thirds_median(values: pd.Series) -> list[float]:
    """Median of the first, middle and last third: a steady rise says every layer adds to the error."""
    n = len(values)
    bounds = ((0, n // 3), (n // 3, 2 * n // 3), (2 * n // 3, n))
    return [float(values.iloc[a:b].median()) for a, b in bounds if b > a]


def _at(r) -> str:
    return f"{layer_name(r['key'], r.get('op'))} ({r['op_type']}, #{int(r['position']) + 1})"


def _output_clause(ordered: pd.DataFrame, numbers: dict) -> str:
    """'; at the output prob:0: rel L2 .., top-1 agreement ..' (fills `numbers`). With several outputs
    each is named with its figure, the one the run summary quotes (the worst, `worst_output`) first."""
    outputs = ordered[ordered["is_output"].astype(bool)]
    out = worst_output(outputs)
    if out is None:
        return ""
    numbers.update(output_layer=out["key"], output_rel_l2=float(out["rel_l2"]))
    text = f"; at the output {out['key']}: rel L2 {out['rel_l2']:.2g}"
    for name in ("top1", "top5"):
        value = float(out[name])
        if math.isfinite(value):
            numbers[name] = value
            text += f", {name[:3]}-{name[3:]} agreement {percent(value)}"
    others = outputs[outputs["key"] != out["key"]]
    if len(others):
        numbers["other_outputs_rel_l2"] = {str(k): float(v) for k, v in zip(others["key"], others["rel_l2"])}
        listed = [f"{k} {float(v):.2g}" for k, v in zip(others["key"][:MAX_OTHER_OUTPUTS], others["rel_l2"])]
        text += (f" (the worst of {len(outputs)} outputs; the others: " + ", ".join(listed)
                 + (", ..." if len(others) > MAX_OTHER_OUTPUTS else "") + ")")
    return text


def input_dependence(comparison: Comparison, t: Thresholds, zero_starts: dict[str, Finding]) -> list[Finding]:
    """Per configuration run on several inputs: which inputs fail, where, and which collapse to zeros."""
    pairs_of: dict[tuple, list[int]] = {}
    for index, pair in enumerate(comparison.plan.pairs):
        if pair.kind == "reference":
            pairs_of.setdefault(pair.other.config, []).append(index)
    groups: dict[tuple, list[dict]] = {}
    for config, indices in pairs_of.items():  # a configuration run on one input has no input dependence to show
        if len({comparison.plan.pairs[i].other.input_name for i in indices}) > 1:
            groups[config] = [_input_outcome(comparison.plan.pairs[i], comparison.pair_rows(i), t,
                                             zero_starts.get(comparison.plan.pairs[i].other.label)) for i in indices]
    labels = _config_labels({config: comparison.plan.pairs[indices[0]].other for config, indices in pairs_of.items()})
    out = []
    for config, members in groups.items():
        if len({m["verdict"] for m in members}) < 2:  # every input fares alike: nothing depends on the input
            continue
        failing = [m for m in members if m["verdict"] == "fail"] or [m for m in members if m["verdict"] == "warn"]
        where, count = Counter(m["first"] for m in failing).most_common(1)[0]
        rest = [m for m in members if m not in failing]
        rest_text = _rest_clause(rest)
        collapsed = [m["input"] for m in members if m["collapsed"]]
        out.append(Finding(FindingKind.INPUT_DEPENDENCE, labels[config], where, "",
                           f"Input dependence on {labels[config]}: {len(failing)} of {len(members)} inputs "
                           f"{failing[0]['verdict']}: " + "; ".join(m["text"] for m in failing[:8])
                           + ("; ..." if len(failing) > 8 else "") + rest_text + ".",
                           severity=failing[0]["verdict"],
                           numbers={"inputs": len(members), "failing_inputs": [m["input"] for m in failing],
                                    "collapsed_inputs": collapsed, "inputs_at_layer": count,
                                    "first_divergence_by_input": {m["input"]: m["first"] for m in members},
                                    "zero_start_by_input": {m["input"]: m["zero_start"] for m in members
                                                            if m["zero_start"]}}))
    return out


def _rest_clause(rest: list[dict]) -> str:
    """'; dog passes, owl warns', or '; of the other 17 inputs 16 pass and 1 warns' when there are many."""
    if not rest:
        return ""
    if len(rest) <= MAX_NAMED:
        return "; " + ", ".join(f"{m['input']} {VERB[m['verdict']]}" for m in rest)
    counts = Counter(m["verdict"] for m in rest)
    return f"; of the other {len(rest)} inputs " + " and ".join(
        f"{n} {VERB[v] if n == 1 else v}" for v, n in sorted(counts.items()))


def _input_outcome(pair, rows: pd.DataFrame, t: Thresholds, zero_start: Finding | None) -> dict:
    """One input's fate on one configuration: verdict, first divergence, zeros at the output, in words."""
    ordered = by_position(rows)
    verdict = "fail" if (ordered["status"] == "fail").any() else ("warn" if (ordered["status"] == "warn").any() else "pass")
    bad = ordered[ordered["status"] == verdict] if verdict != "pass" else ordered.iloc[:0]
    first = str(bad.iloc[0]["key"]) if len(bad) else ""
    outputs = ordered[ordered["is_output"].astype(bool)]
    out_collapse = float(outputs["zero_collapse"].fillna(0.0).max()) if len(outputs) else 0.0
    label = pair.other.input_name
    collapsed = out_collapse > t.fail_zero_collapse
    if collapsed:
        text = (f"{label} collapses to zero (output {outputs.iloc[-1]['key']}: {percent(out_collapse)} of the reference's "
                f"non-zero values are 0)")
    else:
        out_rel = float(outputs.iloc[-1]["rel_l2"]) if len(outputs) else math.nan
        text = f"{label} first {VERB[verdict]} at {first} (output rel L2 {out_rel:.3g})"
    zero_layer = zero_start.layer if zero_start is not None else ""
    if zero_layer:
        text += f", zeros start at {zero_layer}"
    return {"input": label, "verdict": verdict, "first": first, "collapsed": collapsed, "zero_start": zero_layer,
            "text": text}


def _config_labels(runs: dict[tuple, Run]) -> dict[tuple, str]:
    """'vulkan/low' when every configuration (each given by one of its runs) shares device and engine,
    else the full configuration label."""
    short = {config: f"{run.backend}/{run.precision}" for config, run in runs.items()}
    if len(set(short.values())) == len(short):
        return short
    return {config: run.config_label for config, run in runs.items()}
