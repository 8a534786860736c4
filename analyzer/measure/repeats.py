"""Run-to-run variation per op: repeats of one configuration on one input, layer by layer.

`collect --repeat N [--fresh-process]` gives N runs of one configuration on one input; the plan pairs
each with the first repeat (analyzer/runs/reference.py) and compare_all measures every layer of every
pair. This module gathers those numbers per op, in execution order: over how many repeats the op's
output differs from the first repeat's at all (bit for bit: any max abs above 0, or a NaN/Inf the
other lacks), and how far apart the repeats land (the largest rel L2 and max abs). Numbers only: which
op to name, and in what words, is the judge's (analyzer/findings/repeatops.py).
"""
from __future__ import annotations

import pandas as pd

from layerdiff.analyzer.measure.comparison import Comparison

REPEAT_OP_COLUMNS = ["group", "run", "configuration", "input", "repeats", "fresh_process", "position", "op", "op_type", "n_differing",
                     "n_compared", "spread_rel_l2", "spread_max_abs", "is_output"]


def repeat_groups(comparison: Comparison) -> dict[tuple, list[int]]:
    """Pair indices per (configuration, input) whose pairs compare repeats of that configuration on that
    input, each against the first repeat (the base every such pair shares)."""
    groups: dict[tuple, list[int]] = {}
    for index, pair in enumerate(comparison.plan.pairs):
        if pair.base.config == pair.other.config and pair.base.input_key == pair.other.input_key:
            groups.setdefault((pair.base.config, pair.base.input_key, id(pair.base)), []).append(index)
    return groups


def repeat_spread_per_op(comparison: Comparison) -> pd.DataFrame:
    """One row per repeated configuration and input and per op compared, in execution order."""
    frames = []
    for number, indices in enumerate(repeat_groups(comparison).values()):
        rows = comparison.table[comparison.table["pair"].isin(indices)]
        if rows.empty:
            continue
        runs = [comparison.plan.pairs[indices[0]].base, *(comparison.plan.pairs[i].other for i in indices)]
        frames.append(_per_op(rows, number, runs[0], len(runs), all(ran_in_fresh_process(r) for r in runs)))
    if not frames:
        return pd.DataFrame(columns=REPEAT_OP_COLUMNS)
    return pd.concat(frames, ignore_index=True)[REPEAT_OP_COLUMNS]


def ran_in_fresh_process(run) -> bool:
    """Whether the run says it ran in a harness process of its own (`collect --fresh-process`)."""
    try:
        return bool(run.dump.provenance.get("fresh_process"))
    except Exception:  # noqa: BLE001 - a foreign dump says nothing about processes
        return False


def _per_op(rows: pd.DataFrame, group: int, base, repeats: int, fresh: bool) -> pd.DataFrame:
    """Per op of one group: repeats differing from the first, and the largest distance among them."""
    numeric = rows[rows["max_abs"].notna() | rows["n_nonfinite_mismatch"].notna()].copy()
    numeric["differs"] = (numeric["max_abs"].fillna(0) > 0) | (numeric["n_nonfinite_mismatch"].fillna(0) > 0)
    numeric["rel_known"] = pd.to_numeric(numeric["rel_l2"], errors="coerce").fillna(0.0)  # inf stays: a zero first repeat
    numeric["abs_known"] = pd.to_numeric(numeric["max_abs"], errors="coerce").fillna(0.0)
    by_op = numeric.groupby("key", sort=False).agg(
        position=("position", "min"), op_type=("op_type", "first"), n_differing=("differs", "sum"),
        n_compared=("differs", "size"), spread_rel_l2=("rel_known", "max"), spread_max_abs=("abs_known", "max"),
        is_output=("is_output", "max"))
    by_op = by_op.reset_index().rename(columns={"key": "op"}).sort_values("position", kind="stable")
    by_op["n_differing"] = by_op["n_differing"].astype(int)
    by_op["n_compared"] = by_op["n_compared"].astype(int)
    by_op["is_output"] = by_op["is_output"].astype(bool)
    by_op["op_type"] = by_op["op_type"].astype(str)
    by_op.insert(0, "group", group)
    by_op.insert(1, "run", base.label)
    by_op.insert(2, "configuration", base.config_label or base.label)
    by_op.insert(3, "input", base.input_name)
    by_op.insert(4, "repeats", repeats)
    by_op.insert(5, "fresh_process", fresh)
    return by_op

