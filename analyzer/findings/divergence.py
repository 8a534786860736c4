"""Findings: the few sentences that say where a run goes wrong and why.

Each finding answers one question a user asks (coremltools' habit: one function per question) and
is a plain sentence naming the layer, its op type, the run and the numbers, plus the same facts as
fields for `--json`. The graph edges stored in the dumps separate the op that broke from the ones
that inherited its error; the precomputed `/layers` stats answer NaN/Inf origins and fp16 range
risks without reading a tensor.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from layerdiff.analyzer.measure.comparison import Comparison
from layerdiff.analyzer.measure.rows import KeyedRows, by_position
from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity, named
from layerdiff.analyzer.align.graph import LayerGraph
from layerdiff.analyzer.formats.opkinds import arithmetic, op_class
from layerdiff.analyzer.runs.sources import Run
from layerdiff.analyzer.formats.enginefacts import facts_of
from layerdiff.analyzer.runs.placement import node_buffer, tied_outputs
from layerdiff.analyzer.findings.trends import error_curve, input_dependence
from layerdiff.analyzer.findings.decisions import output_decision
from layerdiff.analyzer.findings.unmatched import unmatched_outputs
from layerdiff.analyzer.findings.layouts import layout_findings
from layerdiff.analyzer.findings.observability import observed_vs_plain, split_graph
from layerdiff.analyzer.align.blocks import block_clause, layer_blocks
from layerdiff.analyzer.findings.wording import layer_name, percent, with_node_names
from layerdiff.analyzer.findings.coverage import pair_verdicts
from layerdiff.analyzer.findings.verdict import Thresholds, collapsed
from layerdiff.analyzer.findings.provenance import provenance_findings
from layerdiff.analyzer.findings.spread import run_spread
from layerdiff.analyzer.findings.versions import release_parting
from layerdiff.analyzer.findings.anomalies import (RANGE, ZERO, anomaly_numbers, input_anomaly, layer_anomalies,
                                                   moved_clause)

__all__ = ["Finding", "KIND_ORDER", "all_findings"]

MAX_PER_KIND = 3
MODEL_INPUTS = ("input", "data")  # op types of the layers that hold the model's inputs
COMPARED = ("pass", "warn", "fail")  # statuses of layers whose values were compared
COPY_OPS = {"Split"}  # engine-inserted copies (ncnn): sentences name the layer they copy instead
FP16_MAX = 65504.0
KIND_ORDER = [kind.value for kind in FindingKind]  # report order: FindingKind's declaration order


def all_findings(comparison: Comparison, runs: list[Run], t: Thresholds, judgements: dict | None = None,
                 verdicts: dict[int, tuple[str, str]] | None = None) -> list[Finding]:
    """Every finding over every run and pair, most important kinds first (`judgements`: pair index ->
    decoded-output judgement of a declared task, outputs/judge.py; `verdicts`: the pairs' `pair_verdicts`,
    when the caller has them already)."""
    found: list[Finding] = []
    judgements = judgements or {}
    verdicts = pair_verdicts(comparison, t, judgements) if verdicts is None else verdicts
    reference_pair = {p.other.label: i for i, p in enumerate(comparison.plan.pairs) if p.kind == "reference"}
    for run in runs:
        found += run_state_findings(run)
        found += observed_vs_plain(run, t.warn_rel_l2)
        counts = nonfinite_counts(run)
        if counts is None:  # no NaN or Inf anywhere in the run (the usual case): no origin to look for
            continue
        index = reference_pair.get(run.label)
        base, facts = (None, None) if index is None else (comparison.plan.pairs[index].base,
                                                          layer_facts(comparison.pair_rows(index), "run_key"))
        found += nonfinite_origins(run, comparison.graph(run), base, facts, counts)
    zero_starts: dict[str, Finding] = {}
    for index, pair in enumerate(comparison.plan.pairs):
        rows = comparison.pair_rows(index)
        observable = rows["status"] != "not_observable"  # what the backend never wrote is no evidence (observability.py)
        rows = rows if bool(observable.all()) else rows[observable]
        rows = with_node_names(rows, pair.base)
        graph = comparison.graph(pair.base)
        if pair.kind == "reference":
            found += unmatched_outputs(pair, comparison.alignments[index], graph, comparison.graph(pair.other))
            found += output_decision(pair, judgements.get(index))
            layouts = layout_findings(pair, rows)
            found += layouts
            mislaid = {f.layer for f in layouts if f.kind == FindingKind.PACKED_ORDER}
            found += saturation(rows, pair.base)
            verdict, why = verdicts[index]
            sources = failure_sources(rows, graph, None if verdict == "fail" else (verdict, why),
                                      dict(zip(pair.base.layers["key"].tolist(), pair.base.layers["op_type"].astype(str).tolist())))
            found += sources
            found += _capped(first_divergence(rows, t, graph), verdict)
            found += release_parting(pair, rows)
            # values in another order are not zeroed by arithmetic: the packed-order finding says why
            zeros = [z for z in zero_collapse_origin(rows, graph, t, pair.base, pair.other) if z.layer not in mislaid]
            zero_starts.update((f.run, f) for f in zeros)
            found += zeros
            found += error_growth(rows, {f.layer for f in sources} | {f.numbers.get("moved_from") for f in sources}, t)
            found += error_curve(rows)
        found += nondeterminism(pair, rows)
    found += run_spread(comparison)
    found += provenance_findings(runs, comparison.storage)
    found += input_dependence(comparison, t, zero_starts)
    for base in {id(r): r for r in comparison.plan.references.values()}.values():
        found += fp16_risk(base, t)
    return sorted(found, key=lambda f: KIND_ORDER.index(f.kind) if f.kind in KIND_ORDER else 99)


def _capped(findings: list[Finding], verdict: str) -> list[Finding]:
    """A layer finding is never louder than its run's verdict: a failing layer in a run whose outputs
    keep within tolerance is a warning (a red line under a yellow verdict said the opposite)."""
    if verdict != "fail":
        for finding in findings:
            if finding.severity == Severity.FAIL:
                finding.severity = Severity.WARN
    return findings


def run_state_findings(run: Run) -> list[Finding]:
    """A run cut short, or one that silently ran on another backend, makes its numbers mean something else."""
    out = []
    if not run.dump.complete:
        layers = run.layers
        computed = layers[~layers["op_type"].astype(str).str.lower().isin(("input", "data"))]
        last = computed.iloc[-1] if len(computed) else None
        if last is None:
            where = ("no layer was computed (nothing beyond the inputs was dumped), so the run failed before "
                     "its first layer: loading the model, setting up the backend or feeding the input; the "
                     "device log in the file's provenance says which")
        else:
            where = (f"the last layer dumped is {last['key']} ({last['op_type']}), so the harness died in or right "
                     "after that layer")
        out.append(Finding(FindingKind.INCOMPLETE_RUN, run.label, "" if last is None else str(last["key"]),
                           "" if last is None else str(last["op_type"]),
                           f"Run {run.label} is incomplete (harness exit status {run.attrs.get('exit_status')}): {where}.",
                           numbers={"exit_status": run.attrs.get("exit_status"), "layers_dumped": len(layers)}))
    split = split_graph(run)
    out += split
    requested, actual = str(run.attrs.get("backend_requested") or ""), str(run.attrs.get("backend_actual") or "")
    if requested and actual and requested != actual and not split and run.cpu_by_design:
        out.append(_cpu_by_design(run, requested))
    elif requested and actual and requested != actual and not split:
        out.append(Finding(FindingKind.BACKEND_FALLBACK, run.label, "", "",
                           f"Run {run.label} asked for backend {requested} but really ran on {actual}: "
                           f"its numbers are {actual} numbers.", severity=Severity.WARN,
                           numbers={"backend_requested": requested, "backend_actual": actual}))
    return out


def _cpu_by_design(run: Run, requested: str) -> Finding:
    """Nodes the engine declares it computes on the CPU, in a GPU run: said as what they are, an info, not a
    fallback (the engine's words from the dump's `engine_facts`)."""
    nodes = run.cpu_by_design
    design = facts_of(run.attrs).cpu_by_design
    buffers = [node_buffer(layout) or "" for layout in run.layers["layout"]]
    buffer = buffers[list(run.layers["key"]).index(nodes[0])]
    on_gpu = sum(b.lower().startswith(requested) and not b.lower().endswith("_host") for b in buffers)
    tied = tied_outputs(run.attrs, nodes)
    layer = [n for n in nodes if n not in tied]
    what = f"{design.what or 'the nodes its engine keeps on the CPU'} ({named(layer)})" if layer else ""
    if tied:
        what += (" and " if what else "") + (f"its output layer ({named(tied)}: computed with the same "
                                              "table, tied embeddings)")
    why = design.why or "its engine computes them on the CPU in every run"
    return Finding(FindingKind.CPU_BY_DESIGN, run.label, nodes[0], "",
                   f"Run {run.label} ran on {requested} except {what}: {why} (here in {buffer}); "
                   f"{on_gpu} of {len(buffers)} nodes ran in {requested} memory. Not a fallback: "
                   f"the recorded backend is {run.attrs.get('backend_actual')} by design.", severity=Severity.INFO,
                   numbers={"backend_requested": requested, "backend_actual": run.attrs.get("backend_actual"),
                            "cpu_nodes": nodes, "buffer": buffer})


FACT_COLUMNS = ("key", "run_key", "status", "rel_l2", "growth", "worst_input", "n_nan_new", "n_posinf_new",
                "n_neginf_new", "n_nonfinite_mismatch", "n_zero_new", "n_out_of_range", "range_excess", "ref_min",
                "ref_max", "run_min", "run_max")  # what the anomaly and entry decisions read


def layer_facts(rows: pd.DataFrame, key_column: str = "key") -> Mapping[str, dict]:
    """A pair's measured rows as {layer key: the facts the decisions read}, keyed by the reference's keys
    or the run's own (only those columns, and a layer's dict made when a decision reads it: a dict of every
    column per layer cost seconds at 50,000 layers)."""
    if rows.empty:
        return {}
    return KeyedRows(rows, key_column, [c for c in FACT_COLUMNS if c in rows.columns])


def nonfinite_counts(run: Run) -> tuple[dict, dict] | None:
    """{layer key: NaN count} and {layer key: Inf count} of the run's layers; None when no layer has any."""
    layers = run.layers
    keys = layers["key"].tolist()
    nan = dict(zip(keys, layers["n_nan"].tolist()))
    both = np.stack([layers["n_posinf"].to_numpy(), layers["n_neginf"].to_numpy()])
    inf = dict(zip(keys, np.nansum(both, axis=0).tolist()))  # as the frame's row sum: a missing count adds nothing
    return (nan, inf) if any(nan.values()) or any(inf.values()) else None


def nonfinite_origins(run: Run, graph: LayerGraph, base: Run | None = None,
                      facts: Mapping[str, dict] | None = None, known: tuple[dict, dict] | None = None) -> list[Finding]:
    """First layer with NaN (and with Inf) whose own inputs have none: where the NaN was born.

    The sentence adds what explains it: an Inf origin whose reference values pass 65504 is fp16
    overflow; a NaN origin fed by an Inf is the Inf's heir (inf - inf, 0 x inf), not a new fault. An
    origin whose input already holds an anomaly (`facts`: the run's measured rows against its reference,
    keyed by the run's layer keys) moves to where that anomaly starts: a Log fed zeros the reference does
    not have, or an op fed values far outside the reference's range, did not make the NaN/Inf itself.
    `known`: the run's `nonfinite_counts`, when the caller has them.
    """
    known = known or nonfinite_counts(run)
    if known is None:
        return []
    nan, inf = known
    layers = run.layers
    keys = layers["key"].tolist()
    blocks = layer_blocks(keys)
    out = []
    for kind, counts, what in ((FindingKind.NAN_ORIGIN, nan, "NaN"), (FindingKind.INF_ORIGIN, inf, "Inf")):
        for key in graph.order:
            producers = graph.producers.get(key, [])
            if not counts.get(key, 0) or any(counts.get(p, 0) for p in producers):
                continue
            row = layers[layers["key"] == key].iloc[0]
            numbers = {"count": int(counts[key]), "numel": int(row["numel"]), "position": graph.position(key)}
            fed = (f"its inputs ({', '.join(producers[:3])}) have no {what}" if producers
                   else "it is fed by the model input")
            moved = input_anomaly(key, graph, facts or {}, _explaining_origin(kind, _reference_peak(base, key)))
            if moved is None or (kind == FindingKind.NAN_ORIGIN and any(inf.get(p, 0) for p in producers)):
                why = _nonfinite_cause(kind, key, producers, inf, base, numbers)
                layer, op_type = key, str(row["op_type"])
            else:
                anomaly, start = moved
                op_types = dict(zip(keys, layers["op_type"].astype(str).tolist()))
                why = moved_clause(what, layer_name(key), anomaly, start, facts, op_types)
                numbers.update(anomaly_numbers(anomaly, start, key))
                layer, op_type = start, op_types.get(start, "")
            block = block_clause(blocks.get(key))
            if block:
                numbers["block"] = blocks[key]
            out.append(Finding(kind, run.label, layer, op_type,
                               f"{what} origin in {run.label}{block}: layer {layer_name(key, row.get('op'))} ({row['op_type']}) is the first with "
                               f"{what} ({counts[key]} of {int(row['numel'])} values) while {fed}{why}.",
                               numbers=numbers))
            break
    return out


def _nonfinite_cause(kind: str, key: str, producers: list[str], inf: dict, base: Run | None, numbers: dict) -> str:
    """The clause explaining a NaN/Inf origin from its inputs' Inf or the reference's values (fills `numbers`)."""
    if kind == FindingKind.NAN_ORIGIN:
        carriers = [p for p in producers if inf.get(p, 0)]
        if not carriers:
            return ""
        numbers["inf_inputs"] = carriers
        return (f"; {carriers[0]} feeds it {int(inf[carriers[0]])} Inf, and inf - inf or 0 x inf is NaN, so the "
                "NaN is inherited from that Inf")
    peak = _reference_peak(base, key)
    if peak is None:
        return ""
    numbers["reference_peak"] = peak
    if peak > FP16_MAX:
        return f"; the reference reaches {peak:.4g} there, above fp16's largest value 65504: fp16 overflow"
    return f"; the reference peaks at {peak:.4g} there (fp16 holds up to 65504), so an intermediate sum overflowed"


def _reference_peak(base: Run | None, key: str) -> float | None:
    """Largest |value| of a layer in a reference run, from its precomputed stats (None if unknown)."""
    if base is None:
        return None
    hit = base.layers[base.layers["key"] == key]
    if hit.empty:
        return None
    peak = max(abs(float(hit.iloc[0]["min"])), abs(float(hit.iloc[0]["max"])))
    return peak if math.isfinite(peak) else None


def saturation(rows: pd.DataFrame, base: Run) -> list[Finding]:
    """Values clamped to exactly +-65504 where the reference is larger: fp16 saturation, not overflow."""
    hit = rows[rows["n_saturated"].fillna(0) > 0]
    if hit.empty:
        return []
    first = hit.iloc[0]
    ref = base.layers.set_index("key").loc[first["key"]]
    ref_peak = max(abs(float(ref["min"])), abs(float(ref["max"])))
    return [Finding(FindingKind.SATURATION, first["run"], first["key"], first["op_type"],
                    f"fp16 saturation in {first['run']}: layer {first['key']} ({first['op_type']}) has "
                    f"{int(first['n_saturated'])} values pinned at exactly +-65504 where the reference reaches "
                    f"{ref_peak:.4g}; the backend clamps instead of overflowing to inf, so no NaN marks it and "
                    f"{len(hit) - 1} later layer(s) saturate too.",
                    numbers={"n_saturated": int(first["n_saturated"]), "reference_peak": ref_peak,
                             "layers_saturated": int(len(hit)), "position": int(first["position"])})]


def first_divergence(rows: pd.DataFrame, t: Thresholds | None = None, graph: LayerGraph | None = None) -> list[Finding]:
    """Where the error that makes a run diverge enters: one definition for every run, so "first
    divergence" means the same everywhere.

    The first layer in execution order that warns or fails is where the error crossed a threshold,
    often layers after it entered: a layer whose error doubles its input's is carrying it on. From that
    layer the worst inputs (the `worst_input` column: the compared feeding layer with the largest rel L2)
    are followed back while their error is still a visible share of it (`ENTRY_SHARE`); the most
    upstream layer on that path whose error jumps `growth_factor` times past its inputs' is where it
    entered, and is named (without one, the layer that crossed). The first failing layer is named apart.
    An input of that layer already holding what rel L2 cannot show (exact zeros the reference lacks,
    values far outside its range; `graph` gives the edges) is said too: the failure source says where it starts.
    """
    t = t or Thresholds()
    ordered = by_position(rows)
    diverging = ordered[ordered["status"].isin(["warn", "fail"])]
    if diverging.empty:
        return []
    crossed = diverging.iloc[0].to_dict()
    facts = layer_facts(rows)
    entry = _error_entry(crossed, facts, t)
    r = crossed if entry["key"] == crossed["key"] else ordered[ordered["key"] == entry["key"]].iloc[0].to_dict()
    numbers = _metric_numbers(r)
    failing = ordered[ordered["status"] == "fail"]
    if failing.empty:
        then = " No layer fails."
    elif failing.iloc[0]["key"] == r["key"]:
        then = " It is also the first layer that fails."
        numbers.update(first_fail=str(r["key"]), first_fail_op=str(r["op_type"]))
    else:
        f = failing.iloc[0]
        numbers.update(first_fail=str(f["key"]), first_fail_op=str(f["op_type"]), first_fail_position=int(f["position"]))
        then = (f" The first layer that fails is {layer_name(f['key'], f.get('op'))} ({f['op_type']}), #{int(f['position']) + 1}, "
                f"rel L2 {f['rel_l2']:.3g} ({f['reasons']}).")
    status = str(crossed["status"])
    block = block_clause(r.get("block"))
    if block:
        numbers["block"] = int(r["block"])
    if r["key"] == crossed["key"]:
        text = (f"First divergence in {r['run']}{block}: layer {layer_name(r['key'], r.get('op'))} ({r['op_type']}), "
                f"#{int(r['position']) + 1} in execution order, {status}s with rel L2 {r['rel_l2']:.3g}, max abs "
                f"{r['max_abs']:.3g}, SQNR {r['sqnr_db']:.1f} dB ({r['reasons']}).")
    else:
        worst_in = r["rel_l2"] / r["growth"] if _finite(r.get("growth")) else 0.0
        numbers.update(threshold_layer=str(crossed["key"]), threshold_op=str(crossed["op_type"]),
                       threshold_position=int(crossed["position"]), threshold_rel_l2=float(crossed["rel_l2"]),
                       input_rel_l2=float(worst_in))
        jump = (f"rel L2 {worst_in:.2g} at its inputs, {r['rel_l2']:.2g} at its output ({r['growth']:.0f}x)"
                if worst_in > 0 else f"its inputs are exact, its output has rel L2 {r['rel_l2']:.2g}")
        text = (f"First divergence in {r['run']}{block}: the error enters at layer {layer_name(r['key'], r.get('op'))} "
                f"({r['op_type']}), #{int(r['position']) + 1} in execution order: {jump}, max abs {r['max_abs']:.3g}. "
                f"It is carried on from there to layer {layer_name(crossed['key'], crossed.get('op'))} "
                f"({crossed['op_type']}), #{int(crossed['position']) + 1}, the first that {status}s: rel L2 "
                f"{crossed['rel_l2']:.3g}, SQNR {crossed['sqnr_db']:.1f} dB ({crossed['reasons']}), "
                f"{_growth_text(crossed)}.")
    hidden = input_anomaly(r["key"], graph, facts, (RANGE, ZERO)) if graph is not None and graph.has_edges else None
    if hidden is not None:
        anomaly, start = hidden
        numbers.update(anomalous_input=anomaly.key, input_anomaly=anomaly.kind, anomaly_start=start)
        text += f" Its input {layer_name(anomaly.key)} already holds {anomaly.text}."
    return [Finding("first_divergence", r["run"], r["key"], r["op_type"], text + then, severity=status, numbers=numbers)]


# A failing layer that sums many terms (`_sums_terms`) whose error is less than this many times its inputs'
# may be carrying their error on, magnified by its own arithmetic (a fully connected layer whose one output is 1/900 of the terms it sums
# turns inputs at rel L2 0.012 into 0.39 while computing exactly): "this op breaks" is said with that
# alternative. An op that breaks on inputs of fp16-level error grows it thousands of times.
AMPLIFY_LIMIT = 100.0
ENTRY_SHARE = 0.01  # inputs whose error is below this share of the diverging layer's carry none of it


def _error_entry(crossed: dict, facts: dict[str, dict], t: Thresholds) -> dict:
    """The layer where the error of the first diverging layer `crossed` entered (itself when no layer
    upstream on its path of worst inputs jumps: the error grew gradually, or entered right there)."""
    rel = crossed["rel_l2"]
    if not _finite(rel) or rel <= 0:
        return crossed
    floor, path, current = rel * ENTRY_SHARE, [crossed], crossed
    while True:
        upstream = facts.get(str(current.get("worst_input") or ""))
        if (upstream is None or any(upstream["key"] == p["key"] for p in path) or not _finite(upstream["rel_l2"])
                or upstream["rel_l2"] < floor):
            break
        path.append(upstream)
        current = upstream
    for row in reversed(path):  # most upstream first
        growth = row.get("growth")
        if _finite(growth) and growth >= t.growth_factor:
            return row
    # no jump: the error grew step by step (a layer fed exact values that rounds is no jump either, or
    # every fp16 run would name its first layer), so the layer that crossed the threshold is named
    return crossed


def _growth_text(row: dict) -> str:
    growth = row.get("growth")
    return f"{growth:.2g}x its inputs' error" if _finite(growth) else "its inputs exact"


def _finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def failure_sources(rows: pd.DataFrame, graph: LayerGraph, output_ok: tuple[str, str] | None = None,
                    layer_ops: dict[str, str] | None = None) -> list[Finding]:
    """Failing layers whose every feeding layer does not fail: the ops that broke, not the heirs.

    `output_ok`: the run's (verdict, reason) when its outputs keep within tolerance. Then no layer is
    named a failure source (nothing the user gets has failed); the first such layer is said once, as a
    warning that its error does not reach the output.
    `layer_ops`: the reference's op type per layer key. Reference layers between a failing layer and
    the compared layers feeding it that were not compared themselves (no counterpart in the run: fused,
    converted into other ops, another shape) are named: the error arises somewhere in that stretch, and
    "this op breaks" would blame, say, a Reshape for a Conv the run's graph computes differently."""
    if not graph.has_edges:
        return []
    layer_ops = layer_ops or {}
    keys = rows["key"].tolist()  # lists: zipping pandas string columns steps through them element by element
    status = dict(zip(keys, rows["status"].tolist()))
    rel = dict(zip(keys, rows["rel_l2"].tolist()))
    failing = list(by_position(rows).loc[rows["status"] == "fail", "key"])
    op_type = dict(zip(keys, rows["op_type"].tolist()))
    op_name = dict(zip(keys, rows["op"].tolist())) if "op" in rows else {}
    if not failing:  # itertuples builds a 60-field row type even for no rows
        return []
    facts = layer_facts(rows)
    out = []
    for r in rows[rows["status"] == "fail"].sort_values("position").itertuples():
        nearest, walked = graph.nearest(r.key, set(status))
        feeders = sorted((f for f in nearest if status[f] in COMPARED), key=graph.position)
        if any(status[f] == "fail" for f in feeders):
            continue
        stretch = _unobserved_stretch(graph, walked, [f for f in nearest if status[f] not in COMPARED], layer_ops)
        worst_in = max((rel[f] for f in feeders), default=0.0)
        inputs = named(_through_copies(graph, feeders, op_type, set(status)))
        fed = (f"every layer feeding it passes or only warns ({inputs}; worst input rel L2 {worst_in:.3g})"
               if feeders else "no compared layer feeds it" if stretch else "it reads only the model input")
        blame = "this op breaks at this setting."
        growth = r.rel_l2 / worst_in if worst_in > 0 and _finite(r.rel_l2) else math.inf
        if growth < AMPLIFY_LIMIT and _sums_terms(r.op_type, op_name.get(r.key, "")):
            blame = (f"this op breaks at this setting, or magnifies the error its inputs already carry ({growth:.0f}x): "
                     "an output much smaller than the terms it sums (a sum that cancels) does that while computing "
                     "correctly; `collect isolate` feeds it the reference's inputs and tells which.")
        if stretch:
            blame = (f"but {len(stretch)} reference layer(s) between them were not compared ("
                     + named([f"{layer_name(k)} ({layer_ops.get(k) or '?'})" for k in stretch])
                     + "; no counterpart in the run: fused, converted into other ops, or another shape), so the error "
                       "arises in that stretch or in this op, not necessarily here.")
        others = [k for k in failing if k != r.key]
        heirs = [k for k in others if k in _downstream(graph, r.key)]
        numbers = {"rel_l2": r.rel_l2, "worst_input_rel_l2": worst_in, "inputs": feeders, "op": op_name.get(r.key, ""),
                   "position": int(r.position), "failing_layers": len(failing), "downstream_failing": heirs,
                   "not_compared_between": stretch, "growth": growth if math.isfinite(growth) else None}
        block = block_clause(getattr(r, "block", None))
        where = f"layer {layer_name(r.key, op_name.get(r.key))} ({r.op_type}){block}"
        if block:
            numbers["block"] = int(r.block)
        source_key, source_type = r.key, r.op_type
        moved = None if stretch else input_anomaly(r.key, graph, facts, _explaining_kinds(facts[r.key]))
        if moved is not None:
            anomaly, start = moved
            blame = moved_clause("failure", layer_name(r.key), anomaly, start, facts, op_type)[2:] + "."
            numbers.update(anomaly_numbers(anomaly, start, r.key))
            source_key, source_type = start, op_type.get(start, "")
        if output_ok is not None:
            verdict, why = output_ok
            out.append(Finding("layer_divergence", r.run, r.key, r.op_type,
                               f"Layer divergence in {r.run} that does not reach the output: {where} fails "
                               f"({r.reasons}) while {fed}, yet the run's outputs keep within tolerance (verdict "
                               f"{verdict}{': ' + why if why else ''}), so no failure source is named. "
                               f"{_heirs_clause(others, heirs)}", severity="warn", numbers=numbers))
            break
        out.append(Finding("failure_source", r.run, source_key, source_type,
                           f"Failure source in {r.run}: {where} fails ({r.reasons}) while {fed}; "
                           f"{blame} {_heirs_clause(others, heirs)}", numbers=numbers))
        if len(out) >= MAX_PER_KIND:
            break
    return out


def _sums_terms(op_type: str, op: str) -> bool:
    """Whether the op adds many terms (a conv, fully connected layer or matmul, a normalisation, a pooling
    or reduction, an Add or Sub): where they cancel, its output magnifies its inputs' error."""
    return op_class(op_type, op) in ("conv", "norm", "pool") or arithmetic(op_type, op) in ("add", "sub")


def _explaining_kinds(fact: dict) -> tuple[str, ...]:
    """Which input anomalies explain a failing layer: values far outside the reference's range always;
    exact zeros when the layer's own output is NaN/Inf or far outside the reference's range (a Log of
    zero: -Inf, or -65504 where fp16 saturates); a few zeros in the input of a layer that fails
    otherwise explain nothing."""
    own = {a.kind for a in layer_anomalies(str(fact.get("key", "")), fact)}
    if _beyond_fp16(fact.get("ref_min")) or _beyond_fp16(fact.get("ref_max")):
        return (RANGE,)  # the reference itself passes fp16's range here: overflow explains it, not zeros fed in
    return (RANGE, ZERO) if _count_of(fact, "n_nonfinite_mismatch") or RANGE in own else (RANGE,)


def _explaining_origin(kind: str, reference_peak: float | None) -> tuple[str, ...]:
    """Which input anomalies explain a NaN/Inf origin: values far outside the reference's range always;
    zeros the reference lacks (a Log or a Div of them) unless the reference's own values at an Inf origin
    pass fp16's largest value, where overflow explains the Inf (a sum that fp16 cannot hold)."""
    if kind == FindingKind.INF_ORIGIN and reference_peak is not None and reference_peak > FP16_MAX:
        return (RANGE,)
    return (RANGE, ZERO)


def _beyond_fp16(value) -> bool:
    return value is not None and math.isfinite(float(value)) and abs(float(value)) > FP16_MAX


def _count_of(fact: dict, column: str) -> int:
    value = fact.get(column)
    return int(value) if value is not None and math.isfinite(float(value)) else 0


def _unobserved_stretch(graph: LayerGraph, walked: set[str], uncompared: list[str],
                        layer_ops: dict[str, str]) -> list[str]:
    """Reference layers between a layer and its compared feeders that carry no evidence: not compared
    (walked through, or a row without values), copies left out; in execution order."""
    keys = [k for k in set(walked) | set(uncompared)
            if op_class(layer_ops.get(k, "")) != "copy" and layer_ops.get(k, "").lower() not in MODEL_INPUTS]
    return sorted(keys, key=graph.position)


def _heirs_clause(others: list[str], heirs: list[str]) -> str:
    """Which other failing layers lie downstream of a failure source (they inherit its error)."""
    if not others:
        return "No other layer fails."
    if len(heirs) == len(others):
        return f"The {len(others)} other failing layer(s) ({named(others)}) are all downstream of it."
    return (f"{len(heirs)} of the {len(others)} other failing layer(s) are downstream of it; "
            f"the rest ({named([k for k in others if k not in heirs])}) are not.")


def _through_copies(graph: LayerGraph, keys: list[str], op_type: dict[str, str], known: set[str]) -> list[str]:
    """Name the model's layers, not the engine's copies: a Split (ncnn) stands for the layer it copies."""
    named: list[str] = []
    for key in keys:
        real = graph.upstream(key, known) if op_type.get(key) in COPY_OPS else []
        named += [k for k in (real or [key]) if k not in named]
    return named


def _downstream(graph: LayerGraph, key: str) -> set[str]:
    """Every layer reachable from `key` along the graph's edges."""
    seen: set[str] = set()
    stack = list(graph.consumers.get(key, []))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(graph.consumers.get(current, []))
    return seen


def zero_collapse_origin(rows: pd.DataFrame, graph: LayerGraph, t: Thresholds, base: Run | None = None,
                         other: Run | None = None) -> list[Finding]:
    """First layer where a share of the reference's non-zeros became 0 while its inputs kept theirs.

    The reference's own values at that layer say whether fp16 underflow explains it (most of them
    below fp16's smallest normal 6.1e-5), and the output's share of zeros says how far it spread.
    """
    keys = rows["key"].tolist()  # lists: zipping pandas string columns steps through them element by element
    flags = [collapsed(share, n, t.warn_zero_collapse)
             for share, n in zip(rows["zero_collapse"].fillna(0.0).tolist(), rows["n_zero_collapsed"].fillna(0).tolist())]
    if not any(flags):  # itertuples builds a 60-field row type even for no rows
        return []
    collapse = dict(zip(keys, flags))
    nonfinite = dict(zip(keys, rows["n_nonfinite_mismatch"].fillna(0).tolist()))
    status = dict(zip(keys, rows["status"].tolist()))
    for r in rows[pd.Series(flags, index=rows.index, dtype=bool)].sort_values("position").itertuples():
        feeders = graph.upstream(r.key, set(collapse))
        if any(collapse[f] or nonfinite[f] for f in feeders):
            continue  # inherited: zeros (or NaN/Inf) were already coming in
        numbers = {"zero_collapse": r.zero_collapse, "n_zero_collapsed": int(r.n_zero_collapsed),
                   "position": int(r.position)}
        if any(status[f] == "fail" for f in feeders):
            cause = "its inputs already fail, so the zeros may come from the error upstream"
        else:
            cause = _underflow_cause(base, r.key, t, numbers, other)
        return [Finding("zero_collapse_origin", r.run, r.key, r.op_type,
                        f"Zero collapse starts in {r.run} at layer {layer_name(r.key, getattr(r, 'op', None))} ({r.op_type}): {percent(r.zero_collapse)} of the "
                        f"reference's non-zero values became 0 ({int(r.n_zero_collapsed)} values) while its inputs "
                        f"kept theirs; {cause}.{_collapse_spread(rows, r.key, numbers)}",
                        severity=Severity.FAIL if r.status == "fail" else Severity.WARN, numbers=numbers)]
    return []


def _underflow_cause(base: Run | None, key: str, t: Thresholds, numbers: dict, other: Run | None = None) -> str:
    """Whether the reference's values at `key` sit in fp16's underflow range (fills `numbers`).

    Only said when one of the two runs computes in fp16: between fp32 (or bf16, whose range is
    fp32's) runs a flush to zero is not fp16 underflow, whatever the values."""
    precisions = [str(r.attrs.get("precision_effective") or "") for r in (base, other) if r is not None]
    known = [p for p in precisions if p]
    if known and len(known) == len(precisions) and not any("16" in p and "bf16" not in p for p in known):
        numbers["precisions"] = known
        return (f"both runs compute in {' and '.join(sorted(set(known)))}, so it is not fp16 underflow: this op's own "
                "arithmetic (or a pairing of two different tensors) zeroes them")
    hit = base.layers[base.layers["key"] == key] if base is not None else pd.DataFrame()
    if hit.empty:
        return "typical of fp16 underflow (|x| < 6.1e-5 flushes to 0)"
    ref = hit.iloc[0]
    share = float(ref["n_fp16_underflow"]) / max(int(ref["numel"]), 1)
    peak = max(abs(float(ref["min"])), abs(float(ref["max"])))
    numbers.update(reference_underflow_share=share, reference_peak=peak)
    if share > t.underflow_risk_share:
        return (f"in the reference {percent(share)} of this layer's values lie between 0 and 6.1e-5 (largest |x| "
                f"{peak:.3g}), where fp16 keeps only a few bits (subnormals) down to 6e-8 and 0 below: fp16 underflow")
    return (f"the reference's values here are not in fp16's underflow range ({percent(share)} below 6.1e-5, largest "
            f"|x| {peak:.3g}), so this op's own arithmetic zeroes them")


def _collapse_spread(rows: pd.DataFrame, origin: str, numbers: dict) -> str:
    """How far the zeros reach: the worst layer and the model output (fills `numbers`)."""
    share = rows["zero_collapse"].fillna(0.0)
    worst = rows.loc[share.idxmax()]
    outputs = rows[rows["is_output"].astype(bool)]
    out = outputs.loc[outputs["zero_collapse"].fillna(0.0).idxmax()] if len(outputs) else None
    parts = []
    if worst["key"] != origin and worst["zero_collapse"] > numbers["zero_collapse"]:
        parts.append(f"it grows to {percent(worst['zero_collapse'])} at {worst['key']}")
    if out is not None:
        numbers["output_zero_collapse"] = float(out["zero_collapse"])
        if out["key"] != origin:
            parts.append(f"the model output {out['key']} has {percent(out['zero_collapse'])} of its non-zero values at 0")
    if not parts:
        return ""
    text = "; ".join(parts)
    return " " + text[0].upper() + text[1:] + "."


def error_growth(rows: pd.DataFrame, sources: set[str], t: Thresholds) -> list[Finding]:
    """The layer that multiplies the error it receives the most, other than a failure source already named."""
    candidates = rows[(rows["rel_l2"] > t.warn_rel_l2) & (rows["growth"] >= t.growth_factor)
                      & ~rows["key"].isin(sources)]
    if candidates.empty:
        return []
    r = candidates.loc[candidates["growth"].idxmax()]
    worst_in = r["rel_l2"] / r["growth"]
    return [Finding(FindingKind.ERROR_GROWTH, r["run"], r["key"], r["op_type"],
                    f"Error growth in {r['run']}: layer {layer_name(r['key'], r.get('op'))} ({r['op_type']}) amplifies the error {r['growth']:.0f}x, "
                    f"from rel L2 {worst_in:.3g} at its inputs to {r['rel_l2']:.3g} at its output.", severity=Severity.WARN,
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
    return [Finding(FindingKind.NONDETERMINISM, pair.other.label, r["key"], r["op_type"],
                    f"Nondeterminism: {pair.other.label} and {pair.base.label} ran the same configuration on the same input "
                    f"but differ at {len(differing)} of {len(rows)} layers, first at {layer_name(r['key'], r.get('op'))} ({r['op_type']}) by max abs "
                    f"{r['max_abs']:.3g}.", severity=Severity.WARN,
                    numbers={"layers_differing": int(len(differing)), "layers_compared": int(len(rows)),
                             "max_abs": float(r["max_abs"]), "other": pair.base.label})]


def fp16_risk(base: Run, t: Thresholds) -> list[Finding]:
    """Layers of a reference whose own values cannot be held in fp16: risk known before any phone runs."""
    layers = base.layers
    out = []
    over = layers[layers["n_fp16_overflow"] > 0]
    if len(over):
        r = over.iloc[0]
        peak = max(abs(float(r["min"])), abs(float(r["max"])))
        out.append(Finding(FindingKind.FP16_RISK, base.label, str(r["key"]), str(r["op_type"]),
                           f"fp16 overflow risk in reference {base.label}: layer {layer_name(r['key'], r.get('op'))} ({r['op_type']}) reaches {peak:.4g} "
                           f"(> 65504) in {int(r['n_fp16_overflow'])} values; {len(over)} layer(s) exceed fp16's range.",
                           severity=Severity.WARN, numbers={"peak": peak, "n_overflow": int(r["n_fp16_overflow"]),
                                                      "layers": [str(k) for k in over["key"]][:50]}))
    share = layers["n_fp16_underflow"] / layers["numel"].clip(lower=1)
    under = layers[share > t.underflow_risk_share]
    if len(under):
        r = under.iloc[0]
        out.append(Finding(FindingKind.FP16_RISK, base.label, str(r["key"]), str(r["op_type"]),
                           f"fp16 underflow risk in reference {base.label}: layer {layer_name(r['key'], r.get('op'))} ({r['op_type']}) has "
                           f"{percent(share[r.name])} of its values between 0 and 6.1e-5, which fp16 flushes toward 0; "
                           f"{len(under)} layer(s) are above {percent(t.underflow_risk_share)}.",
                           severity="warn", numbers={"share": float(share[r.name]),
                                                     "layers": [str(k) for k in under["key"]][:50]}))
    return out


def _metric_numbers(r) -> dict:
    keys = ("position", "rel_l2", "max_abs", "mean_abs", "sqnr_db", "cosine", "pass_fraction", "n_nonfinite_mismatch")
    return {k: (int(r[k]) if k in ("position", "n_nonfinite_mismatch") else float(r[k])) for k in keys}
