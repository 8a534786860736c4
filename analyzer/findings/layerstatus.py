"""The judge's first step: every measured layer gets pass / warn / fail from the thresholds.

Measuring (layerdiff.analyzer.measure.compare) leaves each compared row at status `measured` with its
numbers; this module decides, reading only those numbers and the run headers, never a tensor. So a
changed threshold re-judges a stored measurement (layerdiff.analyzer.measure.resultcache) without
reading a dump again. Rows that could not be measured (shape or layout mismatch, unreadable) keep the
status measuring gave them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from layerdiff.analyzer.findings.observability import mark_unwritten_zeros
from layerdiff.analyzer.findings.verdict import MIN_ZERO_COLLAPSED, Thresholds, classify
from layerdiff.analyzer.measure.comparison import MEASURED, Comparison
from layerdiff.analyzer.runs.header import reads_back_indirectly

PLAIN_JUDGED = ("judged on the plain run's output (the model run as an app runs it), which differs from the observed "
                "run's: observing every layer changed this output")
PASSED = ("pass", "")  # classify's answer for a layer with nothing to say
# Every metric classify reads: a row's dict is built from these columns alone (a whole-row dict per layer
# costs ~3 KB and is built for nothing else).
CLASSIFY_COLUMNS = ("n_nonfinite_mismatch", "rel_l2", "max_abs", "zero_collapse", "n_zero_collapsed", "n_saturated",
                    "pass_fraction", "n_nan_lost", "n_posinf_lost", "n_neginf_lost")


def judge_layers(comparison: Comparison, thresholds: Thresholds) -> pd.DataFrame:
    """Set `status` and `reasons` of every measured row of `comparison.table` (in place; also returned)."""
    table = comparison.table
    if table.empty:
        return table
    is_measured = table["status"] == MEASURED
    measured = table.index[is_measured]
    if len(measured):
        every = len(measured) == len(table)  # a re-judge's usual table: columns read whole, not through .loc

        def cells(column: str) -> list:
            return (table[column] if every else table.loc[measured, column]).tolist()

        columns = {c: _cells(c, cells(c)) for c in CLASSIFY_COLUMNS if c in table}
        quiet = surely_passing(columns, len(measured), thresholds)
        verdicts = [PASSED if quiet[i] else classify({c: values[i] for c, values in columns.items()}, thresholds)
                    for i in range(len(measured))]
        plain = cells("plain_judged") if "plain_judged" in table else [False] * len(measured)
        table.loc[measured, "status"] = [status for status, _ in verdicts]
        table.loc[measured, "reasons"] = ["; ".join(r for r in (reasons, PLAIN_JUDGED if _flag(p) else "") if r)
                                          for (_, reasons), p in zip(verdicts, plain)]
    graphs = {pair.base.label: comparison.graph(pair.base) for pair in comparison.plan.pairs
              if reads_back_indirectly(pair.other)}  # only those runs' zeros are looked at
    comparison.table = mark_unwritten_zeros(table, comparison.plan.pairs, graphs)
    return comparison.table


def surely_passing(columns: dict[str, list], rows: int, t: Thresholds) -> np.ndarray:
    """Which rows `classify` passes without a word, worked out a column at a time: a re-judge then classifies
    only the other rows one by one. `columns` are CLASSIFY_COLUMNS' cells as `classify` reads them (counts
    made ints); a missing column reads as `classify`'s default. Each test errs toward classifying a row:
    relative L2 finite and within both thresholds, no zero collapse over the smaller limit, and not one
    NaN/Inf, saturated value or lost reference NaN/Inf. Cells that are not numbers leave every row to `classify`."""
    def column(name: str, default: float) -> np.ndarray:
        return np.asarray(columns[name], dtype=np.float64) if name in columns else np.full(rows, default)

    try:
        with np.errstate(invalid="ignore"):
            lost = column("n_nan_lost", 0) + column("n_posinf_lost", 0) + column("n_neginf_lost", 0)
            collapse = ((column("zero_collapse", 0.0) > min(t.warn_zero_collapse, t.fail_zero_collapse))
                        & (column("n_zero_collapsed", 0) >= MIN_ZERO_COLLAPSED))
            return ((column("n_nonfinite_mismatch", 0) == 0) & (column("rel_l2", 0.0) <= min(t.warn_rel_l2, t.fail_rel_l2))
                    & ~collapse & (column("n_saturated", 0) == 0) & ~(column("pass_fraction", 1.0) < t.min_pass_fraction)
                    & (lost == 0))
    except (TypeError, ValueError):
        return np.zeros(rows, dtype=bool)


def _cells(column: str, values: list) -> list:
    """Counts back to ints (a table column holding NaN for unmeasured rows stores them as floats), so the
    reasons read "3 NaN/Inf", as measuring wrote them."""
    if not column.startswith("n_"):
        return values
    return [int(v) if v == v else 0 for v in values]


def _flag(value) -> bool:
    """A boolean cell that is set (NaN, the mark of an unmeasured row, is not)."""
    return isinstance(value, (bool, np.bool_)) and bool(value)
