"""What the report draws, cut from one Analysis: the page's charts (always) and the PNGs (on request).

The page's charts are drawn by the browser from their data (`charts`), so writing a report imports
no matplotlib; `analyze --png` also draws the static PNGs (`plots`, for print and e-mail), with the
same colour per run.
"""
from __future__ import annotations

from typing import Iterator

import pandas as pd

from layerdiff.analyzer.analysis import Analysis
from layerdiff.analyzer.report import charts
from layerdiff.analyzer.report.tables import isolation_table, layer_matrix, reference_rows

MAX_RANGE_LINES = 6
FOCUS_POINTS = 20000


def chart_parts(analysis: Analysis) -> Iterator[str | bytes]:
    """The charts section: plotly.js once, then one chart per question that has data."""
    rows = reference_rows(analysis.comparison)
    measured = rows[rows["status"].isin(["pass", "warn", "fail"])]
    if measured.empty:
        yield "<p>No measured layer to chart.</p>"
        return
    colours = charts.run_colours(analysis.summary)
    yield from charts.plotly_js()  # 4.6 MB written (and freed) before the charts' data is built
    first = {f.run: f.layer for f in analysis.findings if f.kind == "first_divergence"}
    columns = [c for c in ("run", "key", "position", "rel_l2", "n_nonfinite_mismatch") if c in measured]
    traces, layout = charts.error_traces(measured[columns], colours, first, isolation_table(analysis.comparison),
                                         configs=charts.run_configs(analysis.summary))
    yield from charts.chart("error-chart", traces, layout, "Circle: first divergence; x: NaN/Inf the reference "
                            "lacks; triangle: the layer run alone on the reference's inputs. Hover names the layer.")
    del traces
    if int((analysis.summary["role"] == "compared").sum()) >= charts.HEATMAP_FROM_RUNS:
        matrix = layer_matrix(analysis.comparison)
        positions = rows.groupby("key")["position"].min().to_dict()
        yield from charts.chart("error-heatmap", *charts.heatmap_traces(matrix, positions))
    traces, layout, caption = charts.range_traces(ranges(analysis), colours)
    yield from charts.chart("range-chart", traces, layout, caption)
    if per_input_wanted(analysis.summary):
        t = analysis.thresholds
        yield from charts.chart("input-chart", *charts.per_input_traces(analysis.summary, colours, t.warn_rel_l2, t.fail_rel_l2))
    focus = failure_focus(analysis)
    if focus is not None:
        ref, run, title, label = focus
        yield from charts.chart("focus-chart", *charts.focus_traces(ref, run, title, colours.get(label, charts.PALETTE[0])),
                                f"{len(ref)} elements sampled at the same positions of both tensors.")


def draw_pngs(analysis: Analysis) -> dict[str, bytes]:
    """The static figures (`analyze --png`), same data and colours as the charts; matplotlib is
    imported here only. Names and labels are data: matplotlib reads no `$...$` math in them."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):
        return _draw_pngs(analysis)


def _draw_pngs(analysis: Analysis) -> dict[str, bytes]:
    from layerdiff.analyzer.report.plots import error_by_layer, failure_layer, heatmap, per_input_bars, value_range

    rows = reference_rows(analysis.comparison)
    measured = rows[rows["status"].isin(["pass", "warn", "fail"])]
    colours = charts.run_colours(analysis.summary)
    first = {f.run: f.layer for f in analysis.findings if f.kind == "first_divergence"}
    images = {"error_by_layer": error_by_layer(measured, first, isolated=isolation_table(analysis.comparison),
                                               colours=colours)}
    matrix = layer_matrix(analysis.comparison)
    if not matrix.empty and int((analysis.summary["role"] == "compared").sum()) >= charts.HEATMAP_FROM_RUNS:
        images["heatmap"] = heatmap(matrix)
    images["value_range"] = value_range(ranges(analysis), colours=colours)
    focus = failure_focus(analysis)
    if focus is not None:
        images["failure_source"] = failure_layer(*focus[:3])
    if per_input_wanted(analysis.summary):
        images["per_input"] = per_input_bars(analysis.summary)
    return images


def per_input_wanted(summary: pd.DataFrame) -> bool:
    """A sweep: some configuration ran on more than one input (a few runs: plain Python, not a pandas groupby)."""
    inputs: dict[str, set] = {}
    for role, config, input_label in zip(summary["role"].tolist(), summary["config"].tolist(), summary["input"].tolist()):
        if role == "compared":
            inputs.setdefault(config, set()).add(input_label)
    return any(len(labels) > 1 for labels in inputs.values())


def ranges(analysis: Analysis) -> dict[str, pd.DataFrame]:
    """The reference first, then one run per other configuration (first input), for the range chart."""
    plan = analysis.comparison.plan
    chosen = {plan.reference.label: plan.reference.layers}
    seen = {plan.reference.config}
    for pair in plan.pairs:
        run = pair.other
        if run.config not in seen and run.input_key == plan.reference.input_key and len(chosen) < MAX_RANGE_LINES:
            seen.add(run.config)
            chosen[run.label] = run.layers
    return chosen


def failure_focus(analysis: Analysis):
    """(reference sample, run sample, title, run label) for the first failure source (else the first
    divergence), or None. Only `FOCUS_POINTS` elements of each tensor are read (`DumpFile.sample`), at
    the same flat positions in both, so a 256 MB layer costs a few hundred short reads."""
    finding = next((f for kind in ("failure_source", "first_divergence") for f in analysis.findings
                    if f.kind == kind), None)
    if finding is None:
        return None
    table = analysis.comparison.table
    row = table[(table["run"] == finding.run) & (table["key"] == finding.layer) & (table["comparison"] == "reference")]
    if row.empty:
        return None
    index = int(row.iloc[0]["pair"])
    pair = analysis.comparison.plan.pairs[index]
    matched = analysis.comparison.alignments[index].matched
    hit = matched[matched["key"] == finding.layer]
    if hit.empty:
        return None
    try:
        ref = pair.base.dump.sample(int(hit.iloc[0]["base_order"]), FOCUS_POINTS)
        run = pair.other.dump.sample(int(hit.iloc[0]["other_order"]), FOCUS_POINTS)
    except Exception:  # a chart is never worth failing the report for
        return None
    if ref.size != run.size:
        return None
    number = int(row.iloc[0]["position"]) + 1
    title = f"{finding.kind.replace('_', ' ')}: {finding.layer} ({finding.op_type}, #{number}) in {finding.run}"
    return ref, run, title, finding.run
