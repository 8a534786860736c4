"""The judge of isolated layers: pass / warn / fail alone, the blame, and one finding each.

Measuring an isolated dump (layerdiff.analyzer.measure.isolation) gives each isolated layer its metrics
against the reference's own tensor; here they are judged with the same thresholds as every other layer,
set beside the same layer's judged status in the full run, and the blame follows: a layer still off
alone has a kernel that is off at this precision (or an input type that cannot hold the reference's
values); a layer clean alone only inherited error from upstream.
"""
from __future__ import annotations

import math

import pandas as pd

from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity
from layerdiff.analyzer.findings.verdict import Thresholds, classify
from layerdiff.analyzer.findings.wording import percent
from layerdiff.analyzer.measure.comparison import MEASURED, Comparison
from layerdiff.analyzer.measure.isolation import ATTACHED_COLUMNS, FED_AS_INF, ISOLATED_METRICS, Isolation

FP16_MAX = 65504.0
JUDGED = ("pass", "warn", "fail")


def judge_isolation(isolation: Isolation, comparison: Comparison, thresholds: Thresholds) -> Isolation:
    """Judge every measured isolated layer, set it beside its cumulative row (already judged), and make
    the findings; in place, also returned."""
    if isolation.table.empty:
        return isolation
    rows = isolation.table.to_dict("records")
    cumulative: dict[int, dict] = {}
    for row in rows:
        if row["isolated_status"] == MEASURED:
            row["isolated_status"], row["isolated_reasons"] = classify(row["isolated_metrics"], thresholds)
        pair = int(row["pair"])
        if pair not in cumulative:
            cumulative[pair] = {r["key"]: r for r in comparison.pair_rows(pair).to_dict("records")}
        _add_cumulative(row, cumulative[pair].get(row["key"]))
    isolation.table = pd.DataFrame(rows, columns=isolation.table.columns)
    isolation.findings = [isolation_finding(r) for r in rows if r["isolated_status"] in JUDGED]
    return isolation


def _add_cumulative(row: dict, cumulative: dict | None) -> None:
    """The same layer's row from the full run (if it was compared), and the blame that follows."""
    if cumulative is not None:
        row.update({k: cumulative[k] for k in ("position", "status", "rel_l2", "max_abs", "sqnr_db")})
    if row["isolated_status"] in JUDGED:
        row["isolation"] = blame(row["isolated_status"], row["status"], int(row.get("isolated_fed_overflow") or 0))


def blame(isolated_status: str, cumulative_status: str, fed_overflow: int = 0) -> str:
    """`kernel`: off even alone; `input_type`: off alone only because its input's type cannot hold the
    reference's values (fed_overflow of them); `upstream`: clean alone but off in the full run; `clean`."""
    if isolated_status in ("warn", "fail"):
        return "input_type" if fed_overflow > 0 else "kernel"
    return "upstream" if cumulative_status in ("warn", "fail") else "clean"


def attach_isolated(table: pd.DataFrame, isolation: Isolation) -> None:
    """Add the isolated columns to the tidy comparison table, filled on the rows of isolated layers."""
    if isolation.table.empty:
        return
    for column in ATTACHED_COLUMNS:
        table[column] = math.nan if column.startswith(("isolated_rel", "isolated_max", "isolated_sqnr")) else None
    where = {(int(p), k): i for i, p, k, c in zip(table.index, table["pair"], table["key"], table["comparison"])
             if c == "reference"}
    for row in isolation.table.to_dict("records"):
        i = where.get((int(row["pair"]), row["key"]))
        if i is not None:
            for column in ATTACHED_COLUMNS:
                table.at[i, column] = row[column]


def isolation_finding(r: dict) -> Finding:
    """One sentence per isolated layer: the kernel is off, or the layer is fine given correct inputs."""
    subgraph = r.get("isolated_range") or ""
    what = f"the sub-graph {subgraph}, output {r['key']} ({r['op_type']})," if subgraph else f"layer {r['key']} ({r['op_type']})"
    alone = f"{what} run alone on {r['isolated_setting']} with the reference's own inputs"
    verb = "passes" if r["status"] == "pass" else f"{r['status']}s"
    cumulative = (f"in the full run it {verb} with rel L2 {_g(r['rel_l2'])}" if r["status"] in JUDGED
                  else "the full run did not compare it")
    if r["isolation"] == "kernel":
        nonfinite = int(r["isolated_n_nonfinite_mismatch"] or 0)
        size = (f"{nonfinite} NaN/Inf values" if nonfinite else
                f"rel L2 {_g(r['isolated_rel_l2'])} (max abs {_g(r['isolated_max_abs'])})")
        why = _cause(r) or (f" ({r['isolated_reasons']})" if r["isolated_reasons"] else "")
        if subgraph:  # its output's range says nothing about which node made the error
            why = f"; isolate its nodes one by one, from {subgraph.split(' ')[0]} on, to name the op"
        kernel = "a kernel inside it is" if subgraph else "the kernel itself is"
        sentence = (f"Isolation in {r['run']}: {alone} still {r['isolated_status']}s, so {kernel} off by "
                    f"{size} at this precision{why}; {cumulative}.")
        severity = r["isolated_status"]
    elif r["isolation"] == "input_type":
        nonfinite = int(r["isolated_n_nonfinite_mismatch"] or 0)
        size = f"{nonfinite} NaN/Inf values" if nonfinite else f"rel L2 {_g(r['isolated_rel_l2'])}"
        sentence = (f"Isolation in {r['run']}: {alone} still {r['isolated_status']}s ({size}), but not by its own "
                    f"kernel: it reads {r['isolated_fed']}, the type its input has at this precision, so those values "
                    f"{r.get('isolated_fed_effect') or FED_AS_INF}; the cause is that input's type (where it is made), "
                    f"not this op; {cumulative}.")
        severity = Severity.INFO
    elif r["isolation"] == "upstream":
        sentence = (f"Isolation in {r['run']}: {alone} passes (rel L2 {_g(r['isolated_rel_l2'])}, max abs "
                    f"{_g(r['isolated_max_abs'])}), so this {'sub-graph' if subgraph else 'layer'} is fine given correct inputs; the error comes from "
                    f"upstream ({cumulative}).")
        severity = Severity.INFO
    else:
        sentence = (f"Isolation in {r['run']}: {alone} passes (rel L2 {_g(r['isolated_rel_l2'])}) and {cumulative}: "
                    "nothing to blame here at this precision.")
        severity = Severity.INFO
    numbers = {"verdict": r["isolation"], "isolated_status": r["isolated_status"],
               **{f"isolated_{m}": r[f"isolated_{m}"] for m in ISOLATED_METRICS},
               "cumulative_status": r["status"], "cumulative_rel_l2": r["rel_l2"], "cumulative_max_abs": r["max_abs"],
               "position": r["position"], "isolated_file": r["isolated_file"], "reference": r["isolated_reference"],
               "fed_overflow": int(r.get("isolated_fed_overflow") or 0), "range": r.get("isolated_range") or ""}
    return Finding(FindingKind.ISOLATION, r["run"], r["key"], r["op_type"], sentence, severity=severity, numbers=numbers)


def _cause(r: dict) -> str:
    """What the isolated numbers say about why, when they say it plainly (fp16 range, NaN/Inf, underflow)."""
    born, pinned, peak = r["isolated_nonfinite_new"], r["isolated_n_saturated"], r["reference_peak"]
    if (born or pinned) and peak > FP16_MAX:
        what = "overflows to Inf/NaN" if born else f"saturates at +-65504 ({int(pinned)} values)"
        return f": its true output reaches {peak:.4g}, beyond fp16's 65504, so it {what} (fp16 overflow)"
    if born:
        return f": it produces {int(born)} NaN/Inf of its own"
    if pinned:
        return f": {int(pinned)} values pinned at +-65504"
    if r["isolated_zero_collapse"] > 0.05:
        return f": {percent(r['isolated_zero_collapse'])} of the reference's non-zero values become 0 (fp16 underflow?)"
    return ""


def _g(value) -> str:
    try:
        return f"{float(value):.3g}"
    except (TypeError, ValueError):
        return str(value)
