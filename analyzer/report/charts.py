"""The report's charts, drawn by the browser (plotly.js inlined once), one chart per question.

- Where does each run go wrong?  error by layer: one line per run, the first divergence circled,
  NaN/Inf marked at the top, isolated layers as triangles; with many runs also a runs x layers heatmap.
- Do values leave fp16's range?  value range by layer against fp16's limits (+ the underflow share,
  only when some layer has any).
- Which inputs break?  worst error per input and configuration (sweeps only).
- What does the failing layer's error look like?  difference histogram and run-vs-reference scatter.

Rules every chart keeps: a run has one colour everywhere (`run_colours`: by configuration, the
reference grey); x is the layer's number in the reference's execution order, 1-based like the
findings' "#N in execution order", and the hover names the layer, so no axis label is ever cut; the
legend sits below the plot, never over a marker; lines that coincide stay visible (each drawn with its
own dash and a narrower width than the one under it). Building a chart is numpy + JSON: no matplotlib
(static PNGs are drawn only on request, `analyze --png`).
"""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import orjson
import pandas as pd

from layerdiff.analyzer.report.buckets import plottable, worst_columns, worst_per_bucket
from layerdiff.analyzer.report.interactive import package_dir
from layerdiff.safetext import chart_text, chart_texts, html_text, json_in_script

FLOOR = 1e-12  # a zero error still shows on the log axis
WEBGL_POINTS = 5000  # above this many points a chart draws with WebGL (scattergl), below with SVG
PALETTE = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"]
REFERENCE_COLOUR = "#616161"
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
HEATMAP_FROM_RUNS = 7  # from this many compared runs the lines tangle: the heatmap shows them apart
FP16_MAX, FP16_MIN_NORMAL = 65504.0, 6.1e-5
LEGEND_BELOW = {"orientation": "h", "x": 0, "xanchor": "left", "y": -0.22, "yanchor": "top"}
CONFIG = {"displaylogo": False, "responsive": True}


def run_configs(summary: pd.DataFrame) -> dict[str, str]:
    """Run label -> its configuration's label (a sweep's legend names configurations, not 40 runs)."""
    return dict(zip(summary["run"].astype(str), summary["config"].astype(str)))


def run_colours(summary: pd.DataFrame) -> dict[str, str]:
    """Run label -> colour, one per configuration (a sweep's 20 inputs of vulkan/low share one), the
    reference grey; the same map colours every chart (and the PNGs when asked for)."""
    colours: dict[str, str] = {}
    configs: dict[str, str] = {}
    for row in summary[["run", "role", "config"]].itertuples(index=False):
        if row.role == "reference":
            colours[row.run] = REFERENCE_COLOUR
            continue
        if row.config not in configs:
            configs[row.config] = PALETTE[len(configs) % len(PALETTE)]
        colours[row.run] = configs[row.config]
    return colours


def plotly_js() -> Iterator[str | bytes]:
    """plotly.js from the installed plotly package (not imported), inlined once before the charts, as the
    file's own UTF-8 bytes (the page is UTF-8: no decode and encode of 4.6 MB)."""
    bundle = package_dir("plotly") / "package_data" / "plotly.min.js"
    yield "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script><script>"
    with bundle.open("rb") as js:  # in 1 MB pieces: the page is written as it is read
        while piece := js.read(1 << 20):
            yield piece
    yield "</script>"


def chart(element_id: str, traces: list, layout: dict, caption: str = "") -> Iterator[str]:
    """One chart: a div and the script that draws it; the traces are their own piece (tens of MB at
    50,000 layers are not copied into a bigger string)."""
    height = layout.get("height", 380)
    yield (f"<figure class='chart'><div style='height:{height}px; width:100%;'>"
           f'<div id="{element_id}" class="plotly-graph-div" style="height:100%; width:100%;"></div>'
           f'<script>Plotly.newPlot("{element_id}", ')
    yield script_json_bytes(traces)  # UTF-8 already: the page takes bytes as they are
    yield f", {script_json(layout)}, {script_json(CONFIG)});</script></div>"
    yield f"<figcaption>{html_text(caption)}</figcaption></figure>" if caption else "</figure>"


def script_json(value) -> str:
    """JSON safe inside <script> (no `<` at all: layerdiff.safetext). The labels inside were made
    plotly-safe by whoever built the traces (`chart_text`)."""
    return script_json_bytes(value).decode("utf-8")


def script_json_bytes(value) -> bytes:
    """`script_json` as UTF-8 bytes (a chart's traces are up to MBs: not decoded to be encoded again)."""
    return json_in_script(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


def _log_axis(title: str) -> dict:
    return {"title": {"text": title}, "type": "log", "exponentformat": "e", "automargin": True}


def _layer_axis() -> dict:
    return {"title": {"text": "layer # (execution order of the reference, as in the findings)"}, "automargin": True,
            "rangemode": "tozero"}


def _base_layout(title: str, height: int, legend: bool) -> dict:
    return {"title": {"text": title}, "height": height, "margin": {"l": 70, "r": 20, "t": 50, "b": 40},
            "hovermode": "closest", "showlegend": legend, "legend": LEGEND_BELOW}


def error_traces(measured: pd.DataFrame, colours: dict[str, str], first: dict[str, str],
                 isolated: pd.DataFrame | None = None, metric: str = "rel_l2",
                 configs: dict[str, str] | None = None) -> tuple[list, dict]:
    """Error over depth: (traces, layout). `measured` has run, key, position, `metric` and optionally
    n_nonfinite_mismatch; a non-finite error (or one NaN/Inf the reference lacks) is drawn at 10x the
    largest finite error, marked with an x."""
    values = pd.to_numeric(measured[metric], errors="coerce").to_numpy(np.float64)
    finite = values[np.isfinite(values)]
    top = float(finite.max()) * 10 if finite.size else 1.0
    iso = _isolated(isolated, metric)
    if iso is not None and np.isfinite(iso["_y"]).any():
        top = max(top, float(np.nanmax(iso["_y"][np.isfinite(iso["_y"])])) * 10)
    runs = list(dict.fromkeys(measured["run"]))
    kind = "scattergl" if len(measured) > WEBGL_POINTS else "scatter"
    thin = len(runs) >= HEATMAP_FROM_RUNS
    mismatch = measured["n_nonfinite_mismatch"].fillna(0).to_numpy() > 0 if "n_nonfinite_mismatch" in measured else None
    traces, marks = [], {"first": [], "bad": [], "iso": []}
    frame = measured[["run", "key", "position"]].assign(_y=values, _bad=~np.isfinite(values) if mismatch is None
                                                         else ~np.isfinite(values) | mismatch)
    shown_configs: set[str] = set()
    for k, (run, part) in enumerate(frame.groupby("run", sort=False)):
        part = part.sort_values("position", kind="stable")
        x = part["position"].to_numpy(np.int64) + 1
        y = part["_y"].to_numpy(np.float64)
        ys = np.where(np.isfinite(y), np.maximum(y, FLOOR), top)
        colour = colours.get(run, PALETTE[k % len(PALETTE)])
        trace = {"type": kind, "mode": "lines", "name": chart_text(run), "x": x, "y": ys, "text": chart_texts(part["key"]),
                 "line": {"width": 1 if thin else max(3.2 - 0.6 * k, 1.2), "color": colour,
                          "dash": "solid" if thin else DASHES[k % len(DASHES)]},
                 "opacity": 0.5 if thin else 0.95,
                 "hovertemplate": f"#%{{x}} %{{text}}<br>{chart_text(run)}<br>{metric} %{{y:.4g}}<extra></extra>"}
        if thin:  # one legend entry per colour (configuration), not 40 lines of names
            trace["legendgroup"] = colour
            trace["showlegend"] = colour not in shown_configs
            trace["name"] = chart_text((configs or {}).get(run, run))
            shown_configs.add(colour)
        traces.append(trace)
        bad = part["_bad"].to_numpy()
        marks["bad"] += [(int(a), top, f"{run}: {key}", colour) for a, key in zip(x[bad], part["key"].to_numpy()[bad])]
        if run in first:
            hit = np.flatnonzero(part["key"].to_numpy() == first[run])
            if hit.size:
                marks["first"].append((int(x[hit[0]]), float(ys[hit[0]]), f"{run}: {first[run]}", colour))
    if iso is not None:
        for run, key, position, value in zip(iso["run"], iso["key"], iso["position"], iso["_y"]):
            y = value if math.isfinite(value) else top
            marks["iso"].append((int(position) + 1, max(y, FLOOR), f"{run}: {key} alone", colours.get(run, "#000")))
    traces += _marker_traces(marks)
    layout = _base_layout(f"{metric} by layer (drag to zoom, double-click to reset)", 420, True)
    layout.update(xaxis=_layer_axis(), yaxis=_log_axis(f"{metric} vs reference (log)"))
    return traces, layout


def _marker_traces(marks: dict[str, list]) -> list:
    """The circles, crosses and triangles: drawn over the lines, each kind one legend entry."""
    styles = {"first": ("first divergence", {"symbol": "circle-open", "size": 16, "line": {"width": 3}}, True),
              "bad": ("NaN/Inf not in the reference", {"symbol": "x", "size": 9}, False),
              "iso": ("layer run alone on the reference's inputs", {"symbol": "triangle-up", "size": 13,
                                                                    "line": {"width": 1, "color": "#000"}}, False)}
    traces = []
    for kind, (name, marker, red) in styles.items():
        points = marks[kind]
        if not points:
            continue
        colours = ["#c62828" if red else p[3] for p in points]
        traces.append({"type": "scatter", "mode": "markers", "name": name, "x": [p[0] for p in points],
                       "y": [p[1] for p in points], "text": chart_texts(p[2] for p in points),
                       "marker": {**marker, "color": colours}, "hovertemplate": f"{name}<br>%{{text}}<extra></extra>"})
    return traces


def _isolated(isolated: pd.DataFrame | None, metric: str) -> pd.DataFrame | None:
    column = f"isolated_{metric}"
    if isolated is None or isolated.empty or column not in isolated:
        return None
    values = pd.to_numeric(isolated[column], errors="coerce")
    frame = isolated[["run", "key", "position"]].assign(_y=values.to_numpy(np.float64))
    frame = frame[values.notna().to_numpy()]
    return frame if len(frame) else None


def heatmap_traces(matrix: pd.DataFrame, positions: dict[str, int], metric: str = "rel_l2") -> tuple[list, dict]:
    """Runs x layers on a log colour scale (log10 of the error, white equal, dark red worst); past
    `MAX_POINTS` layers each column keeps the worst of its bucket. Run labels are the y axis, in full."""
    values = matrix.to_numpy(dtype=float)
    values = np.where(np.isfinite(values), np.maximum(values, FLOOR), np.where(np.isnan(values), np.nan, np.inf))
    keys = list(matrix.columns)
    x = np.array([positions.get(k, i) + 1 for i, k in enumerate(keys)], dtype=np.int64)
    labels = keys
    if values.shape[1] > 1500:
        edges = np.linspace(0, values.shape[1], 1501).astype(np.int64)[:-1]
        values, x = worst_columns(values), x[edges]
        labels = [f"from {keys[i]}" for i in edges]
    finite = values[np.isfinite(values)]
    top = float(finite.max()) * 10 if finite.size else 1.0
    values = np.where(np.isposinf(values), top, values)
    z = np.log10(values)
    z = np.where(np.isfinite(z), z, None)  # NaN: not compared (the grey background)
    labels = chart_texts(labels)
    trace = {"type": "heatmap", "z": z.tolist(), "x": x, "y": chart_texts(matrix.index),
             "text": [labels] * len(matrix.index), "colorscale": "Reds", "hoverongaps": False,
             "colorbar": {"title": {"text": f"log10 {metric}"}},
             "hovertemplate": f"%{{y}}<br>#%{{x}} %{{text}}<br>log10 {metric} %{{z:.2f}}<extra></extra>"}
    height = int(min(140 + 22 * len(matrix.index), 900))
    layout = _base_layout(f"{metric}, runs x layers (light: small, dark red: largest; grey: not compared)",
                          height, False)
    layout.update(xaxis={**_layer_axis(), "rangemode": "normal"}, yaxis={"automargin": True, "autorange": "reversed"},
                  plot_bgcolor="#cccccc")
    return [trace], layout


def range_traces(ranges: dict[str, pd.DataFrame], colours: dict[str, str]) -> tuple[list, dict, str]:
    """Each layer's largest |value| per run against fp16's limits, in the reference's layer order;
    below it the reference's share of values in (0, 6.1e-5), only when some layer has any.
    Returns (traces, layout, caption); the caption says which lines coincide."""
    reference = next(iter(ranges.values()))
    order = pd.Series(np.arange(len(reference)), index=reference["key"].tolist())
    order = order[~order.index.duplicated()]
    traces, seen = [], {}
    for k, (label, layers) in enumerate(ranges.items()):
        peak = np.maximum(layers["min"].abs(), layers["max"].abs()).to_numpy(float)
        x = order.reindex(layers["key"]).to_numpy()
        keep = ~np.isnan(x)
        xs, ys = worst_per_bucket(x[keep].astype(np.int64) + 1, np.maximum(peak[keep], FLOOR))
        seen.setdefault((xs.tobytes(), ys.tobytes()), []).append(label)
        names = chart_texts(np.asarray(layers["key"])[keep])
        traces.append({"type": "scattergl" if xs.size > WEBGL_POINTS else "scatter", "mode": "lines",
                       "name": chart_text(label), "x": xs, "y": ys, "text": names[:xs.size] if xs.size == len(names) else None,
                       "line": {"color": colours.get(label, PALETTE[k % len(PALETTE)]), "dash": DASHES[k % len(DASHES)],
                                "width": max(4.0 - 0.8 * k, 1.2)},
                       "hovertemplate": f"{chart_text(label)}<br>#%{{x}} %{{text}}<br>max |value| %{{y:.4g}}<extra></extra>"})
    share = (reference["n_fp16_underflow"] / reference["numel"].clip(lower=1)).to_numpy(float)
    layout = _base_layout("Value range by layer against fp16 limits", 420, True)
    layout.update(xaxis=_layer_axis(), yaxis=_log_axis("max |value| (log)"),
                  shapes=[_hline(FP16_MAX, "#c62828", "dash"), _hline(FP16_MIN_NORMAL, "#1565c0", "dot")],
                  annotations=[_hlabel(FP16_MAX, "fp16 max 65504"), _hlabel(FP16_MIN_NORMAL, "fp16 smallest normal 6.1e-5")])
    if share.size and float(np.nanmax(share)) > 0:
        xs, ys = worst_per_bucket(np.arange(len(share)) + 1, share)
        traces.append({"type": "scatter", "mode": "lines", "line": {"shape": "hvh", "width": 0, "color": REFERENCE_COLOUR},
                       "fill": "tozeroy", "name": "reference: share of values in (0, 6.1e-5)", "x": xs, "y": ys,
                       "xaxis": "x2", "yaxis": "y2", "hovertemplate": "#%{x}: %{y:.2%} below fp16's normal range<extra></extra>"})
        layout["height"] = 540
        layout["yaxis"]["domain"] = [0.34, 1]
        layout["xaxis"] = {"automargin": True, "showticklabels": False, "rangemode": "tozero"}  # the lower panel's axis says it
        layout["xaxis2"] = {**_layer_axis(), "matches": "x", "anchor": "y2"}
        layout["yaxis2"] = {"domain": [0, 0.22], "anchor": "x2", "title": {"text": "share in (0, 6.1e-5)"},
                            "rangemode": "tozero", "tickformat": ".0%", "automargin": True}
        for shape in layout["shapes"]:
            shape["yref"] = "y"
    same = ["; ".join(" = ".join(group) for group in seen.values() if len(group) > 1)]
    caption = (f"Identical ranges (drawn on top of each other, each with its own dash): {same[0]}." if same[0] else "")
    if not (share.size and float(np.nanmax(share)) > 0):
        caption += " No reference value lies in fp16's subnormal range (0, 6.1e-5)."
    return traces, layout, caption.strip()


def _hline(y: float, colour: str, dash: str) -> dict:
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y,
            "line": {"color": colour, "dash": dash, "width": 1.5}}


def _hlabel(y: float, text: str) -> dict:
    return {"xref": "paper", "x": 1, "xanchor": "right", "yref": "y", "y": math.log10(y), "yanchor": "bottom",
            "text": text, "showarrow": False, "font": {"size": 11}}


def per_input_traces(summary: pd.DataFrame, colours: dict[str, str], warn: float, fail: float,
                     metric: str = "worst_rel_l2") -> tuple[list, dict]:
    """Worst error per input, one bar group per configuration in its colour, the verdict written on
    each bar, the warn and fail thresholds as lines."""
    compared = summary[summary["role"] == "compared"]
    traces = []
    for config, part in compared.groupby("config", sort=False):
        part = part.sort_values("input")
        values = pd.to_numeric(part[metric], errors="coerce").to_numpy(float)
        finite = values[np.isfinite(values)]
        top = float(finite.max()) * 10 if finite.size else 1.0
        traces.append({"type": "bar", "name": chart_text(config), "x": chart_texts(str(i) or "?" for i in part["input"]),
                       "y": np.where(np.isfinite(values), np.maximum(values, FLOOR), top),
                       "text": chart_texts(part["verdict"]), "textposition": "outside",
                       "marker": {"color": colours.get(str(part["run"].iloc[0]), PALETTE[len(traces) % len(PALETTE)])},
                       "hovertemplate": f"{chart_text(config)}<br>input %{{x}}: %{{text}}<br>{metric} %{{y:.4g}}<extra></extra>"})
    layout = _base_layout(f"{metric} per input (the verdict on each bar)", 420, True)
    layout.update(barmode="group", xaxis={"title": {"text": "input"}, "automargin": True, "type": "category"},
                  yaxis=_log_axis(f"{metric} (log)"), shapes=[_hline(warn, "#ef6c00", "dash"), _hline(fail, "#c62828", "dash")],
                  annotations=[_hlabel(warn, f"warn above {warn:g}"), _hlabel(fail, f"fail above {fail:g}")])
    return traces, layout


def focus_traces(ref: np.ndarray, run: np.ndarray, title: str, colour: str) -> tuple[list, dict]:
    """One layer: histogram of run - reference (left) and run against reference (right), from samples."""
    a, b = np.asarray(ref, dtype=np.float64).reshape(-1), np.asarray(run, dtype=np.float64).reshape(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        diff = b - a
    finite = diff[plottable(diff)]
    counts, edges = np.histogram(finite if finite.size else [0.0], bins=80)
    both = plottable(a) & plottable(b)
    lo, hi = (float(min(a[both].min(), b[both].min())), float(max(a[both].max(), b[both].max()))) if both.any() else (0, 1)
    traces = [{"type": "bar", "x": (edges[:-1] + edges[1:]) / 2, "y": counts, "name": "run - reference",
               "marker": {"color": colour}, "showlegend": False, "hovertemplate": "%{x:.4g}: %{y} elements<extra></extra>"},
              {"type": "scattergl" if int(both.sum()) > WEBGL_POINTS else "scatter", "mode": "markers",
               "x": a[both], "y": b[both], "xaxis": "x2", "yaxis": "y2",
               "marker": {"size": 3, "opacity": 0.5, "color": colour}, "showlegend": False, "name": "elements",
               "hovertemplate": "reference %{x:.4g}<br>run %{y:.4g}<extra></extra>"},
              {"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [lo, hi], "xaxis": "x2", "yaxis": "y2",
               "line": {"color": REFERENCE_COLOUR, "width": 1}, "showlegend": False, "hoverinfo": "skip"}]
    layout = _base_layout(chart_text(title), 400, False)
    layout.update(xaxis={"domain": [0, 0.45], "title": {"text": f"run - reference ({diff.size - finite.size} non-finite)"},
                         "automargin": True},
                  yaxis={"type": "log", "title": {"text": "elements (log)"}, "automargin": True},
                  xaxis2={"domain": [0.55, 1], "title": {"text": "reference value"}, "anchor": "y2", "automargin": True},
                  yaxis2={"title": {"text": "run value"}, "anchor": "x2", "automargin": True})
    return traces, layout
