"""Which op first varies from run to run: repeats of one configuration on one input, named per op.

`run_spread` (spread.py) says how far the repeats' model outputs land apart; this says where the
variation is born. Every op before the first varying one is bit-identical in every repeat, so that op
gets identical inputs and still computes different outputs: its kernel is not deterministic (a
reduction whose order depends on threads or timing, an atomic accumulation, an uninitialised
buffer). The numbers come from measure/repeats.py; this module only picks and words.
"""
from __future__ import annotations

import pandas as pd

from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity, named

MAX_OTHERS = 4  # varying ops named after the first


def varying_op_findings(per_op: pd.DataFrame) -> list[Finding]:
    """One finding per repeated configuration and input: the first op whose output differs between
    repeats (in execution order) with its spread, or "no op varies" when every op is bit-identical."""
    out = []
    for _, ops in per_op.groupby("group", sort=True):
        ops = ops.sort_values("position", kind="stable")
        first = ops.iloc[0]
        how = "each in a fresh process" if bool(first["fresh_process"]) else "in one process"
        where = f"{first['configuration']} on input {first['input']}"
        others = int(first["repeats"]) - 1
        varying = ops[ops["n_differing"] > 0]
        numbers = {"repeats": int(first["repeats"]), "ops_compared": int(len(ops)),
                   "ops_varying": int(len(varying)), "input": str(first["input"]),
                   "fresh_process": how.startswith("each")}
        if varying.empty:
            out.append(Finding(FindingKind.VARYING_OP, str(first["run"]), "", "",
                               f"No op varies across {numbers['repeats']} repeats of {where} ({how}): all "
                               f"{len(ops)} ops give bit-identical outputs.", severity=Severity.INFO, numbers=numbers))
            continue
        op = varying.iloc[0]
        rest = varying.iloc[1:]
        numbers.update(op=str(op["op"]), position=int(op["position"]), n_differing=int(op["n_differing"]),
                       spread_rel_l2=float(op["spread_rel_l2"]), spread_max_abs=float(op["spread_max_abs"]),
                       identical_before=int((ops["position"] < op["position"]).sum()),
                       varying_ops=[str(k) for k in varying["op"]])
        later = (f"; {len(rest)} later op(s) vary too: " + named([f"{k} ({float(s):.3g})" for k, s in
                                                                 zip(rest["op"], rest["spread_rel_l2"])])
                 if len(rest) else "; no later op varies")
        out.append(Finding(
            FindingKind.VARYING_OP, str(first["run"]), str(op["op"]), str(op["op_type"]),
            f"First op to vary across {numbers['repeats']} repeats of {where} ({how}): {op['op']} "
            f"({op['op_type']}), differs from the first repeat in {int(op['n_differing'])} of {others} repeat(s) "
            f"by up to rel L2 {float(op['spread_rel_l2']):.3g} (max abs {float(op['spread_max_abs']):.3g}), while "
            f"all {numbers['identical_before']} ops before it are bit-identical: its kernel is not deterministic"
            f"{later}.", severity=Severity.WARN, numbers=numbers))
    return out
