"""One row per run: its role, verdict, counts, first divergence and output quality (the judged summary).

The last step of judging: the report, `analyze`'s verdict table and the notebook API's `runs` all read it.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from layerdiff.analyzer.findings.coverage import pair_verdicts
from layerdiff.analyzer.findings.divergence import Finding
from layerdiff.analyzer.findings.verdict import Thresholds, dense_output_beyond, worst_output
from layerdiff.analyzer.measure.comparison import Comparison
from layerdiff.analyzer.runs.sources import Run

SUMMARY_COLUMNS = ["run", "role", "reference", "config", "input", "repeat", "verdict", "verdict_reason",
                   "layers_compared", "n_pass", "n_warn", "n_fail", "n_other", "only_in_reference", "only_in_run",
                   "first_divergence", "first_divergence_op", "first_fail", "first_fail_op", "worst_layer",
                   "worst_rel_l2", "output_beyond_tolerance", "output", "output_rel_l2",
                   "output_sqnr_db", "top1", "top5", "task", "output_judgement", "backend_actual", "precision_effective", "complete", "file",
                   "bytes_pulled", "dump_bytes", "n_estimated", "worst_estimated", "worst_rel_l2_sigma"]

def run_summary(comparison: Comparison, runs: list[Run], findings: list[Finding],
                thresholds: Thresholds | None = None, judgements: dict | None = None,
                verdicts: dict[int, tuple[str, str]] | None = None) -> pd.DataFrame:
    """One row per run: its role, verdict, counts, first divergence and output quality (`judgements`:
    pair index -> the decoded-output judgement of a declared task, outputs/judge.py; `verdicts`: the
    pairs' `pair_verdicts`, when the caller has them already)."""
    plan = comparison.plan
    verdicts = pair_verdicts(comparison, thresholds, judgements) if verdicts is None else verdicts
    ref_ids = {id(r) for r in plan.references.values()}
    first = {f.run: f for f in findings if f.kind == "first_divergence"}
    rows = []
    for run in runs:
        index = next((i for i, p in enumerate(plan.pairs) if p.other is run and p.kind == "reference"), None)
        row = _identity(run, "reference" if id(run) in ref_ids else "compared")
        if index is None:
            if id(run) not in ref_ids:
                row["role"] = "repeat" if any(p.other is run for p in plan.pairs) else "not compared"
            if row["role"] == "not compared":  # said with the input key the pairing used
                row["verdict"], row["verdict_reason"] = "not compared", plan.uncompared.get(run.label, "")
            rows.append(row)
            continue
        row.update(_pair_summary(comparison, index, verdicts[index], (judgements or {}).get(index)))
        hit = first.get(run.label)
        row["first_divergence"], row["first_divergence_op"] = (hit.layer, hit.op_type) if hit else ("", "")
        fail = hit.numbers.get("first_fail", "") if hit else ""
        row["first_fail"], row["first_fail_op"] = fail, hit.numbers.get("first_fail_op", "") if fail else ""
        rows.append(row)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def _identity(run: Run, role: str) -> dict:
    return {
        "run": run.label, "role": role, "reference": "", "config": run.config_label,
        "input": str(run.attrs.get("input_label", "")), "repeat": run.repeat,
        "verdict": role if role == "reference" else "", "backend_actual": run.backend,
        "precision_effective": str(run.attrs.get("precision_effective", "")),
        "complete": bool(run.dump.complete), "file": run.path.name,
        **_pulled(run),
    }


def _pulled(run: Run) -> dict:
    """A sketch-first run's bytes over the link and its dump's size (docs/sketch.md); NaN for runs pulled whole."""
    if not run.attrs.get("sketch_first"):
        return {"bytes_pulled": math.nan, "dump_bytes": math.nan}
    return {"bytes_pulled": float(run.attrs.get("bytes_pulled", math.nan)),
            "dump_bytes": float(run.attrs.get("dump_bytes", math.nan))}


def _worst_estimate(worst_row) -> dict:
    """Whether the worst layer's rel L2 is an estimate (a layer left on the phone) and its standard deviation."""
    flag = None if worst_row is None else worst_row.get("estimated")
    if not (isinstance(flag, (bool, np.bool_)) and bool(flag)):  # None/NaN/False: measured from both tensors
        return {"worst_estimated": False, "worst_rel_l2_sigma": math.nan}
    return {"worst_estimated": True, "worst_rel_l2_sigma": float(worst_row.get("rel_l2_sigma", math.nan))}


def _pair_summary(comparison: Comparison, index: int, verdict_and_reason: tuple[str, str], judgement=None) -> dict:
    rows = comparison.pair_rows(index)
    alignment = comparison.alignments[index]
    pair = comparison.plan.pairs[index]
    status = rows["status"]
    is_measured = status.isin(["pass", "warn", "fail"])  # masks, not filtered copies of the whole table
    outputs = rows[is_measured & rows["is_output"].astype(bool)]
    measured_rel = rows["rel_l2"][is_measured]
    worst_row = rows.loc[measured_rel.idxmax()] if measured_rel.notna().any() else None
    verdict, why = verdict_and_reason
    if verdict == "not compared":
        why = _unmeasured(rows, pair)
    out = worst_output(outputs)
    scored = outputs[outputs["top1"].astype(float).notna()]
    return {
        "task": judgement.task if judgement is not None else "",
        "output_judgement": judgement.reason if judgement is not None else "",
        "reference": pair.base.label,
        "verdict": verdict, "verdict_reason": why,
        "output_beyond_tolerance": dense_output_beyond(outputs),
        "layers_compared": int(len(rows)), "n_pass": int((status == "pass").sum()),
        "n_estimated": int(rows["estimated"].eq(True).sum()) if "estimated" in rows else 0,
        "n_warn": int((status == "warn").sum()), "n_fail": int((status == "fail").sum()),
        "n_other": int((~status.isin(["pass", "warn", "fail"])).sum()),
        "only_in_reference": int(len(alignment.only_base)), "only_in_run": int(len(alignment.only_other)),
        "worst_layer": "" if worst_row is None else worst_row["key"],
        "worst_rel_l2": math.nan if worst_row is None else float(worst_row["rel_l2"]),
        **_worst_estimate(worst_row),
        "output": "" if out is None else str(out["key"]),
        "output_rel_l2": math.nan if out is None else float(out["rel_l2"]),
        "output_sqnr_db": math.nan if out is None else float(out["sqnr_db"]),
        "top1": _top("top1", scored, judgement),
        "top5": _top("top5", scored, judgement),
    }


def _top(column: str, scored: pd.DataFrame, judgement) -> float:
    """The lowest top-k agreement among the class-score outputs: recognised ones (the table's column) or,
    with a declared classification task, the judgement's (logits are class scores only when declared)."""
    values = [float(v) for v in scored[column]] if len(scored) else []
    if judgement is not None and judgement.task.startswith("classification"):
        values += [float(n[column]) for n in judgement.numbers.values() if isinstance(n, dict) and column in n]
    values = [v for v in values if not math.isnan(v)]
    return min(values) if values else math.nan


def _unmeasured(rows: pd.DataFrame, pair) -> str:
    """Why a paired run has no measured layer: nothing matched, or every match was unmeasurable."""
    if rows.empty:
        return (f"no layer in common with {pair.base.label}: names differ and no layer matched by structure "
                "(another model? try --name-map or --rename)")
    counts = rows["status"].value_counts()
    return f"{len(rows)} layer(s) matched, none measurable (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"
