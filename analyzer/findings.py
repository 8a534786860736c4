"""Findings: the few sentences that say where a run goes wrong and why.

Each finding answers one question a user asks (coremltools' habit: one function per question) and
is a plain sentence naming the layer, its op type, the run and the numbers, plus the same facts as
fields for `--json`. The graph edges stored in the dumps separate the op that broke from the ones
that inherited its error; the precomputed `/layers` stats answer NaN/Inf origins and fp16 range
risks without reading a tensor.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import pandas as pd

from analyzer.compare import Comparison
from analyzer.graph import LayerGraph, build_graph
from analyzer.sources import Run
from analyzer.verdict import Thresholds

MAX_PER_KIND = 3
KIND_ORDER = ["incomplete_run", "backend_fallback", "nan_origin", "inf_origin", "saturation", "failure_source",
              "first_divergence", "zero_collapse_origin", "error_growth", "nondeterminism", "input_dependence",
              "fp16_risk"]


@dataclass
class Finding:
    """One thing worth telling the user, as a sentence and as data."""

    kind: str
    run: str
    layer: str
    op_type: str
    sentence: str
    severity: str = "fail"  # fail | warn | info
    numbers: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def all_findings(comparison: Comparison, runs: list[Run], t: Thresholds) -> list[Finding]:
    """Every finding over every run and pair, most important kinds first."""
    found: list[Finding] = []
    for run in runs:
        found += run_state_findings(run)
        found += nonfinite_origins(run, comparison.graphs.get(run.label) or build_graph(run.layers))
    for index, pair in enumerate(comparison.plan.pairs):
        rows = comparison.pair_rows(index)
        graph = comparison.graphs[pair.base.label]
        if pair.kind == "reference":
            found += saturation(rows, pair.base)
            sources = failure_sources(rows, graph)
            found += sources
            found += first_divergence(rows)
            found += zero_collapse_origin(rows, graph, t)
            found += error_growth(rows, {f.layer for f in sources}, t)
        found += nondeterminism(pair, rows)
    found += input_dependence(comparison)
    for base in {id(r): r for r in comparison.plan.references.values()}.values():
        found += fp16_risk(base, t)
    return sorted(found, key=lambda f: KIND_ORDER.index(f.kind) if f.kind in KIND_ORDER else 99)


def run_state_findings(run: Run) -> list[Finding]:
    """A run cut short, or one that silently ran on another backend, makes its numbers mean something else."""
    out = []
    if not run.dump.complete:
        layers = run.layers
        last = layers.iloc[-1] if len(layers) else None
        where = f"the last layer dumped is {last['key']} ({last['op_type']})" if last is not None else "nothing was dumped"
        out.append(Finding("incomplete_run", run.label, "" if last is None else str(last["key"]),
                           "" if last is None else str(last["op_type"]),
                           f"Run {run.label} is incomplete (harness exit status {run.attrs.get('exit_status')}): {where}, "
                           "so the harness died in or right after that layer.",
                           numbers={"exit_status": run.attrs.get("exit_status"), "layers_dumped": len(layers)}))
    requested, actual = str(run.attrs.get("backend_requested") or ""), str(run.attrs.get("backend_actual") or "")
    if requested and actual and requested != actual:
        out.append(Finding("backend_fallback", run.label, "", "",
                           f"Run {run.label} asked for backend {requested} but really ran on {actual}: "
                           f"its numbers are {actual} numbers.", severity="warn",
                           numbers={"backend_requested": requested, "backend_actual": actual}))
    return out


def nonfinite_origins(run: Run, graph: LayerGraph) -> list[Finding]:
    """First layer with NaN (and with Inf) whose own inputs have none: where the NaN was born."""
    layers = run.layers
    out = []
    for kind, columns, what in (("nan_origin", ["n_nan"], "NaN"), ("inf_origin", ["n_posinf", "n_neginf"], "Inf")):
        counts = dict(zip(layers["key"], layers[columns].sum(axis=1)))
        for key in graph.order:
            if counts.get(key, 0) and not any(counts.get(p, 0) for p in graph.producers.get(key, [])):
                row = layers[layers["key"] == key].iloc[0]
                producers = graph.producers.get(key, [])
                fed = f"its inputs ({', '.join(producers[:3])}) have none" if producers else "it is fed by the model input"
                out.append(Finding(kind, run.label, key, str(row["op_type"]),
                                   f"{what} origin in {run.label}: layer {key} ({row['op_type']}) is the first with "
                                   f"{what} ({counts[key]} of {int(row['numel'])} values) while {fed}.",
                                   numbers={"count": int(counts[key]), "numel": int(row["numel"]),
                                            "position": graph.position(key)}))
                break
    return out


def saturation(rows: pd.DataFrame, base: Run) -> list[Finding]:
    """Values clamped to exactly +-65504 where the reference is larger: fp16 saturation, not overflow."""
    hit = rows[rows["n_saturated"].fillna(0) > 0]
    if hit.empty:
        return []
    first = hit.iloc[0]
    ref = base.layers.set_index("key").loc[first["key"]]
    ref_peak = max(abs(float(ref["min"])), abs(float(ref["max"])))
    return [Finding("saturation", first["run"], first["key"], first["op_type"],
                    f"fp16 saturation in {first['run']}: layer {first['key']} ({first['op_type']}) has "
                    f"{int(first['n_saturated'])} values pinned at exactly +-65504 where the reference reaches "
                    f"{ref_peak:.4g}; the backend clamps instead of overflowing to inf, so no NaN marks it and "
                    f"{len(hit) - 1} later layer(s) saturate too.",
                    numbers={"n_saturated": int(first["n_saturated"]), "reference_peak": ref_peak,
                             "layers_saturated": int(len(hit)), "position": int(first["position"])})]


def first_divergence(rows: pd.DataFrame) -> list[Finding]:
    """The first layer in execution order that fails (else the first that warns)."""
    ordered = rows.sort_values("position")
    for status in ("fail", "warn"):
        hit = ordered[ordered["status"] == status]
        if not hit.empty:
            r = hit.iloc[0]
            return [Finding("first_divergence", r["run"], r["key"], r["op_type"],
                            f"First divergence in {r['run']}: layer {r['key']} ({r['op_type']}), #{int(r['position']) + 1} "
                            f"in execution order, {status}s with rel L2 {r['rel_l2']:.3g}, max abs {r['max_abs']:.3g}, "
                            f"SQNR {r['sqnr_db']:.1f} dB ({r['reasons']}).", severity=status,
                            numbers=_metric_numbers(r))]
    return []


def failure_sources(rows: pd.DataFrame, graph: LayerGraph) -> list[Finding]:
    """Failing layers whose every feeding layer does not fail: the ops that broke, not the heirs."""
    if not graph.has_edges:
        return []
    status = dict(zip(rows["key"], rows["status"]))
    rel = dict(zip(rows["key"], rows["rel_l2"]))
    n_fail = int((rows["status"] == "fail").sum())
    out = []
    for r in rows.sort_values("position").itertuples():
        if r.status != "fail":
            continue
        feeders = graph.upstream(r.key, set(status))
        if any(status[f] == "fail" for f in feeders):
            continue
        worst_in = max((rel[f] for f in feeders), default=0.0)
        fed = (f"every layer feeding it passes (worst input rel L2 {worst_in:.3g})" if feeders
               else "it reads only the model input")
        out.append(Finding("failure_source", r.run, r.key, r.op_type,
                           f"Failure source in {r.run}: layer {r.key} ({r.op_type}) fails ({r.reasons}) while {fed}; this op breaks at this setting and the "
                           f"{n_fail - 1} other failing layer(s) inherit or add to it.",
                           numbers={"rel_l2": r.rel_l2, "worst_input_rel_l2": worst_in, "inputs": feeders,
                                    "position": int(r.position), "failing_layers": n_fail}))
        if len(out) >= MAX_PER_KIND:
            break
    return out


def zero_collapse_origin(rows: pd.DataFrame, graph: LayerGraph, t: Thresholds) -> list[Finding]:
    """First layer where a share of the reference's non-zeros became 0 while its inputs kept theirs."""
    collapse = dict(zip(rows["key"], rows["zero_collapse"].fillna(0.0)))
    nonfinite = dict(zip(rows["key"], rows["n_nonfinite_mismatch"].fillna(0)))
    for r in rows.sort_values("position").itertuples():
        if collapse[r.key] <= t.warn_zero_collapse:
            continue
        feeders = graph.upstream(r.key, set(collapse))
        if any(collapse[f] > t.warn_zero_collapse or nonfinite[f] for f in feeders):
            continue  # inherited: zeros (or NaN/Inf) were already coming in
        status = dict(zip(rows["key"], rows["status"]))
        cause = ("its inputs already fail, so the zeros may come from the error upstream"
                 if any(status[f] == "fail" for f in feeders) else
                 "typical of fp16 underflow (|x| < 6.1e-5 flushes to 0)")
        return [Finding("zero_collapse_origin", r.run, r.key, r.op_type,
                        f"Zero collapse starts in {r.run} at layer {r.key} ({r.op_type}): {r.zero_collapse:.1%} of the "
                        f"reference's non-zero values became 0 ({int(r.n_zero_collapsed)} values) while its inputs "
                        f"kept theirs; {cause}.",
                        severity="fail" if r.status == "fail" else "warn",
                        numbers={"zero_collapse": r.zero_collapse, "n_zero_collapsed": int(r.n_zero_collapsed),
                                 "position": int(r.position)})]
    return []


def error_growth(rows: pd.DataFrame, sources: set[str], t: Thresholds) -> list[Finding]:
    """The layer that multiplies the error it receives the most, other than a failure source already named."""
    candidates = rows[(rows["rel_l2"] > t.warn_rel_l2) & (rows["growth"] >= t.growth_factor)
                      & ~rows["key"].isin(sources)]
    if candidates.empty:
        return []
    r = candidates.loc[candidates["growth"].idxmax()]
    worst_in = r["rel_l2"] / r["growth"]
    return [Finding("error_growth", r["run"], r["key"], r["op_type"],
                    f"Error growth in {r['run']}: layer {r['key']} ({r['op_type']}) amplifies the error {r['growth']:.0f}x, "
                    f"from rel L2 {worst_in:.3g} at its inputs to {r['rel_l2']:.3g} at its output.", severity="warn",
                    numbers={"factor": float(r["growth"]), "input_rel_l2": float(worst_in), "rel_l2": float(r["rel_l2"]),
                             "position": int(r["position"])})]


def nondeterminism(pair, rows: pd.DataFrame) -> list[Finding]:
    """Runs of the same configuration on the same input that differ: the backend is not deterministic."""
    if pair.base.config != pair.other.config or pair.base.input_key != pair.other.input_key or rows.empty:
        return []
    differing = rows[rows["max_abs"].fillna(0) > 0].sort_values("position")
    if differing.empty:
        return []
    r = differing.iloc[0]
    return [Finding("nondeterminism", pair.other.label, r["key"], r["op_type"],
                    f"Nondeterminism: {pair.other.label} and {pair.base.label} ran the same configuration on the same input "
                    f"but differ at {len(differing)} of {len(rows)} layers, first at {r['key']} ({r['op_type']}) by max abs "
                    f"{r['max_abs']:.3g}.", severity="warn",
                    numbers={"layers_differing": int(len(differing)), "layers_compared": int(len(rows)),
                             "max_abs": float(r["max_abs"]), "other": pair.base.label})]


def input_dependence(comparison: Comparison) -> list[Finding]:
    """Per configuration run on several inputs: which inputs fail, and where their failures start."""
    table = comparison.table
    groups: dict[tuple, list[tuple[str, str, str]]] = {}
    for index, pair in enumerate(comparison.plan.pairs):
        if pair.kind != "reference":
            continue
        rows = table[table["pair"] == index].sort_values("position")
        bad = rows[rows["status"].isin(["fail", "warn"])]
        verdict = "fail" if (rows["status"] == "fail").any() else ("warn" if len(bad) else "pass")
        first = bad.iloc[0]["key"] if len(bad) else ""
        label = str(pair.other.attrs.get("input_label") or pair.other.input_key[:12])
        groups.setdefault((pair.other.config, pair.other.config_label), []).append((label, verdict, first))
    out = []
    for (_, config_label), members in groups.items():
        verdicts = {v for _, v, _ in members}
        if len({label for label, _, _ in members}) < 2 or len(verdicts) < 2:
            continue
        failing = [m for m in members if m[1] == "fail"] or [m for m in members if m[1] == "warn"]
        where, count = Counter(m[2] for m in failing).most_common(1)[0]
        names = ", ".join(m[0] for m in failing[:8]) + (", ..." if len(failing) > 8 else "")
        out.append(Finding("input_dependence", config_label, where, "",
                           f"Input dependence on {config_label}: {len(failing)} of {len(members)} inputs "
                           f"{failing[0][1]} ({names}); {count} of them first diverge at layer {where}.",
                           severity=failing[0][1],
                           numbers={"inputs": len(members), "failing_inputs": [m[0] for m in failing],
                                    "first_divergence_by_input": {m[0]: m[2] for m in members}}))
    return out


def fp16_risk(base: Run, t: Thresholds) -> list[Finding]:
    """Layers of a reference whose own values cannot be held in fp16: risk known before any phone runs."""
    layers = base.layers
    out = []
    over = layers[layers["n_fp16_overflow"] > 0]
    if len(over):
        r = over.iloc[0]
        peak = max(abs(float(r["min"])), abs(float(r["max"])))
        out.append(Finding("fp16_risk", base.label, str(r["key"]), str(r["op_type"]),
                           f"fp16 overflow risk in reference {base.label}: layer {r['key']} ({r['op_type']}) reaches {peak:.4g} "
                           f"(> 65504) in {int(r['n_fp16_overflow'])} values; {len(over)} layer(s) exceed fp16's range.",
                           severity="warn", numbers={"peak": peak, "n_overflow": int(r["n_fp16_overflow"]),
                                                      "layers": [str(k) for k in over["key"]][:50]}))
    share = layers["n_fp16_underflow"] / layers["numel"].clip(lower=1)
    under = layers[share > t.underflow_risk_share]
    if len(under):
        r = under.iloc[0]
        out.append(Finding("fp16_risk", base.label, str(r["key"]), str(r["op_type"]),
                           f"fp16 underflow risk in reference {base.label}: layer {r['key']} ({r['op_type']}) has "
                           f"{share[r.name]:.1%} of its values between 0 and 6.1e-5, which fp16 flushes toward 0; "
                           f"{len(under)} layer(s) are above {t.underflow_risk_share:.0%}.",
                           severity="warn", numbers={"share": float(share[r.name]),
                                                     "layers": [str(k) for k in under["key"]][:50]}))
    return out


def _metric_numbers(r) -> dict:
    keys = ("position", "rel_l2", "max_abs", "mean_abs", "sqnr_db", "cosine", "pass_fraction", "n_nonfinite_mismatch")
    return {k: (int(r[k]) if k in ("position", "n_nonfinite_mismatch") else float(r[k])) for k in keys}
