"""The report's data-set and repeat sections: many inputs as one unit, and ops that vary across repeats.

Both read what the analysis already judged (findings/datasets.py, findings/repeatops.py and the
numbers of measure/repeats.py); results.json gets the same tables under `datasets` and `repeat_ops`,
present only when there is something to show, so other documents stay as they were.
"""
from __future__ import annotations

import math

import pandas as pd

from layerdiff.analyzer.report.results import records
from layerdiff.analyzer.report.tables import to_html
from layerdiff.safetext import html_text

BAR_PX = 240  # the widest bar of the per-op spread chart
MAX_CHART_OPS = 40  # ops drawn in the chart; the table holds them all


def dataset_document(analysis) -> dict:
    """results.json's `datasets` (configs, inputs, layers) and `repeat_ops`, each only when non-empty."""
    out: dict = {}
    view = analysis.dataset
    if not view.empty:
        out["datasets"] = {"configs": records(view.configs), "inputs": records(view.inputs),
                           "layers": records(view.layers)}
    if len(analysis.repeat_ops):
        out["repeat_ops"] = records(analysis.repeat_ops)
    return out


def dataset_html(analysis) -> list[str]:
    """The 'Data set' section (per configuration, then folded per input and per layer) and the
    'Run-to-run variation per op' section; nothing when neither applies."""
    parts: list[str] = []
    view = analysis.dataset
    if not view.empty:
        parts += ["<h2>Data set</h2>",
                  "<p>Each configuration that ran on several inputs, judged over all of them: how many inputs "
                  "pass, warn and fail, the first failing and the worst input, and the layers failing on the most "
                  "inputs.</p>", to_html(view.configs),
                  f"<details><summary>Per input ({len(view.inputs)})</summary>{to_html(view.inputs)}</details>",
                  f"<details><summary>Per layer: on how many inputs it fails or warns ({len(view.layers)})</summary>"
                  f"{to_html(view.layers)}</details>"]
    ops = analysis.repeat_ops
    if len(ops):
        varying = ops[ops["n_differing"] > 0]
        parts += ["<h2>Run-to-run variation per op</h2>",
                  "<p>Repeats of one configuration on one input, compared op by op with the first repeat, in "
                  "execution order: the first op that differs is where the variation is born.</p>",
                  _spread_chart(varying) if len(varying) else "<p>No op varies: every repeat is bit-identical.</p>",
                  f"<details><summary>Every op ({len(ops)})</summary>{to_html(ops.drop(columns=['group']))}</details>"]
    return parts


def _spread_chart(varying: pd.DataFrame) -> str:
    """Horizontal bars of each varying op's spread (largest rel L2 across repeats), log-scaled."""
    shown = varying.head(MAX_CHART_OPS)
    values = [float(v) for v in shown["spread_rel_l2"]]
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    low, high = (math.log10(min(finite)), math.log10(max(finite))) if finite else (0.0, 0.0)
    rows = []
    for record, value in zip(shown.to_dict("records"), values):
        width = _bar_width(value, low, high)
        rows.append(f"<tr><td>{html_text(record['configuration'])} on {html_text(record['input'])}</td>"
                    f"<td>{html_text(record['op'])}</td>"
                    f"<td>{html_text(record['op_type'])}</td><td>{int(record['n_differing'])} of "
                    f"{int(record['repeats']) - 1}</td><td><span style='display:inline-block;height:10px;"
                    f"background:#c0392b;width:{width}px'></span> {html_text(f'{value:.3g}')}</td></tr>")
    more = (f"<p>{len(varying) - MAX_CHART_OPS} more varying op(s) in the table below.</p>"
            if len(varying) > MAX_CHART_OPS else "")
    return ("<table class='data'><thead><tr><th>repeats of</th><th>op</th><th>op type</th><th>differs in</th>"
            "<th>spread (rel L2 across repeats)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>" + more)


def _bar_width(value: float, low: float, high: float) -> int:
    if not value > 0:
        return 1
    if not math.isfinite(value) or high <= low:
        return BAR_PX
    return max(4, int(round(4 + (BAR_PX - 4) * (math.log10(value) - low) / (high - low))))
