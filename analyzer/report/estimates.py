"""How the page shows a sketch-first run: the bytes it pulled, and every estimated number as an estimate.

A layer left on the phone is measured from its summary (docs/sketch.md): its figures carry a standard
deviation, or are lower bounds, or come from a 4,096-element sample. The page never shows such a figure as
if it were measured from both tensors: it reads "0.012 ± 0.0004 (estimated)". The CSV files and results.json
keep the numbers and their `*_sigma` columns apart (REPORT_SCHEMA.md); only the page's cells become text.
"""
from __future__ import annotations

import math

import pandas as pd

from layerdiff.analyzer.measure.rows import records
from layerdiff.analyzer.report.numbers import format_number

# figure -> its standard deviation's column (analyzer/measure/estimate.py SIGMA_COLUMNS)
WITH_SIGMA = {"rel_l2": "rel_l2_sigma", "cosine": "cosine_sigma", "sqnr_db": "sqnr_db_sigma",
              "pass_fraction": "pass_fraction_sigma", "beyond_scale": "beyond_scale_sigma",
              "zero_collapse": "zero_collapse_sigma"}
LOWER_BOUNDS = ("max_abs", "max_rel")  # the sample's largest: the tensor's is at least that
FROM_SAMPLE = ("mean_abs", "median_abs", "p99_abs", "mean_rel", "n_saturated", "n_fail", "n_zero_collapsed",
               "growth")  # the sample's figure, scaled to the tensor where it is a count
ESTIMATED = "(estimated)"


def estimated_text(value, sigma=None) -> str:
    """One estimated figure as the page shows it: `0.012 ± 0.0004 (estimated)`, `≈ 0.3 (estimated)`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if sigma is not None and not (isinstance(sigma, float) and math.isnan(sigma)):
        return f"{format_number(value)} ± {format_number(float(sigma))} {ESTIMATED}"
    return f"≈ {format_number(value)} {ESTIMATED}"


def lower_bound_text(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"≥ {format_number(value)} {ESTIMATED}"


def mark_estimated(table: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The layer rows as the page shows them: in each estimated row, every figure in `columns` that came from
    the summaries becomes its text (figure ± sigma, lower bound, or sample figure, each saying estimated).
    The table itself is left as it is; rows measured from both tensors keep their numbers."""
    if "estimated" not in table.columns:
        return table
    estimated = table["estimated"].eq(True).to_numpy()
    if not estimated.any():
        return table
    shown = table.copy()
    for column in columns:
        if column not in shown.columns:
            continue
        if column in WITH_SIGMA:
            sigma_column = WITH_SIGMA[column]
            sigmas = shown[sigma_column].tolist() if sigma_column in shown.columns else [None] * len(shown)
            texts = [estimated_text(v, s) for v, s in zip(shown[column].tolist(), sigmas)]
        elif column in LOWER_BOUNDS:
            texts = [lower_bound_text(v) for v in shown[column].tolist()]
        elif column in FROM_SAMPLE:
            texts = [estimated_text(v) for v in shown[column].tolist()]
        else:
            continue
        values = shown[column].astype(object)
        values[estimated] = [t for t, e in zip(texts, estimated) if e]
        shown[column] = values
    return shown


def pulled_text(bytes_pulled, dump_bytes) -> str:
    """`52.3 of 570.4 MB (9.2%)` for a sketch-first run; '' for a run pulled whole (NaN bytes)."""
    try:
        pulled, whole = float(bytes_pulled), float(dump_bytes)
    except (TypeError, ValueError):
        return ""
    if math.isnan(pulled) or math.isnan(whole):
        return ""
    share = f" ({pulled / whole:.1%})" if whole > 0 else ""
    return f"{pulled / 1e6:.1f} of {whole / 1e6:.1f} MB{share}"


def sketch_lines(summary: pd.DataFrame) -> list[str]:
    """One plain sentence per sketch-first run: the bytes it pulled of its dump, and how many layers are
    estimated (what the page states above the runs table)."""
    if "bytes_pulled" not in summary.columns:
        return []
    lines = []
    read = [c for c in ("run", "bytes_pulled", "dump_bytes", "n_estimated") if c in summary.columns]
    for row in records(summary, read):
        pulled = pulled_text(row.get("bytes_pulled"), row.get("dump_bytes"))
        if not pulled:
            continue
        n = row.get("n_estimated")
        estimated = f"; {int(n)} layers estimated from summaries" if isinstance(n, (int, float)) and n == n and n else ""
        lines.append(f"{row['run']}: pulled sketch-first, {pulled} of its dump{estimated}")
    return lines


def runs_view(summary: pd.DataFrame) -> pd.DataFrame:
    """The runs table as the page shows it: `pulled` as text, `worst_rel_l2` marked when that layer was
    estimated (its sigma beside it)."""
    shown = summary.copy()
    if "bytes_pulled" in shown.columns:
        shown.insert(shown.columns.get_loc("bytes_pulled"), "pulled",
                     [pulled_text(p, d) for p, d in zip(shown["bytes_pulled"].tolist(), shown["dump_bytes"].tolist())])
    if "worst_estimated" in shown.columns and "worst_rel_l2" in shown.columns:
        marked = shown["worst_estimated"].eq(True).to_numpy()
        if marked.any():
            values = shown["worst_rel_l2"].astype(object)
            sigmas = shown.get("worst_rel_l2_sigma", pd.Series([None] * len(shown), index=shown.index)).tolist()
            values[marked] = [estimated_text(v, s) for v, s, m in
                              zip(shown["worst_rel_l2"].tolist(), sigmas, marked) if m]
            shown["worst_rel_l2"] = values
    return shown
