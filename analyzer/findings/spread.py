"""Run-to-run spread: one configuration repeated on one input (`collect --repeat N [--fresh-process]`).

The per-pair `nondeterminism` finding says that two repeats differ and where first; this one says
how far apart all repeats of a configuration land at the model outputs (the spread a user sees
from one run to the next), whether the repeats ran in one process or each in a fresh one, and
also says so when they are bit-identical: "no spread over N fresh processes" is a result too.
"""
from __future__ import annotations

import math

from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity


def _fresh(run) -> bool:
    try:
        return bool(run.dump.provenance.get("fresh_process"))
    except Exception:  # noqa: BLE001 - a foreign dump says nothing about processes
        return False


def _finite_max(values) -> float:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return max(values, default=0.0)


UNMEASURED = ("unreadable", "shape_mismatch")  # rows compare.py could not measure: they prove nothing equal


def _no_spread(label: str, repeats: int, how: str, unmeasured, numbers: dict) -> Finding:
    """No measured layer differs: "bit-identical" only when every layer was measured; otherwise
    the layers that could not be compared are counted and named, and the finding warns."""
    if unmeasured.empty:
        return Finding(FindingKind.RUN_SPREAD, label, "", "",
                       f"Run-to-run spread of {label} over {repeats} repeats ({how}): none, every "
                       f"layer bit-identical.", severity=Severity.INFO, numbers=numbers)
    first = unmeasured.sort_values("position").iloc[0]
    count, total = numbers["layers_unmeasured"], numbers["layers"]
    return Finding(FindingKind.RUN_SPREAD, label, str(first["key"]), str(first["op_type"]),
                   f"Run-to-run spread of {label} over {repeats} repeats ({how}): no difference in the "
                   f"{total - count} layers that could be compared, but {count} of {total} could not "
                   f"(unreadable or of another shape; first {first['key']}), so identity is not shown.",
                   severity=Severity.WARN, numbers=numbers)


def run_spread(comparison) -> list[Finding]:
    """One finding per configuration and input with repeats: the spread of its outputs across them."""
    groups: dict[int, list[int]] = {}
    for index, pair in enumerate(comparison.plan.pairs):
        if pair.base.config == pair.other.config and pair.base.input_key == pair.other.input_key:
            groups.setdefault(id(pair.base), []).append(index)
    out = []
    for indices in groups.values():
        pairs = [comparison.plan.pairs[i] for i in indices]
        base = pairs[0].base
        rows = comparison.table[comparison.table["pair"].isin(indices)]
        if rows.empty:
            continue
        outputs = rows[rows["is_output"].astype(bool)]
        differing = rows[rows["max_abs"].fillna(0) > 0].sort_values("position")
        runs = [base] + [p.other for p in pairs]
        how = "each in a fresh process" if all(_fresh(r) for r in runs) else "in one process"
        numbers = {"repeats": len(runs), "fresh_process": how.startswith("each"), "runs": [r.label for r in runs],
                   "output_rel_l2_max": _finite_max(outputs["rel_l2"]), "output_max_abs": _finite_max(outputs["max_abs"]),
                   "layers_differing": int(differing["key"].nunique()), "layers": int(rows["key"].nunique())}
        unmeasured = rows[rows["status"].isin(UNMEASURED)]
        numbers["layers_unmeasured"] = int(unmeasured["key"].nunique())
        if differing.empty:
            out.append(_no_spread(base.label, len(runs), how, unmeasured, numbers))
            continue
        first = differing.iloc[0]
        per_run = {r["run"]: float(r["rel_l2"]) for _, r in outputs.iterrows() if math.isfinite(float(r["rel_l2"]))}
        numbers.update(first_layer=str(first["key"]), output_rel_l2_by_run=per_run)
        out.append(Finding(FindingKind.RUN_SPREAD, base.label, str(first["key"]), str(first["op_type"]),
                           f"Run-to-run spread of {base.label} over {len(runs)} repeats ({how}): the model outputs "
                           f"land up to rel L2 {numbers['output_rel_l2_max']:.3g} (max abs "
                           f"{numbers['output_max_abs']:.3g}) from {base.label}'s; {numbers['layers_differing']} of "
                           f"{numbers['layers']} layers differ between repeats, first at {first['key']} "
                           f"({first['op_type']}). One run of this configuration is not representative.",
                           severity=Severity.WARN, numbers=numbers))
    return out
