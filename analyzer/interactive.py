"""The report's interactive parts: the layer table (itables) and the error-over-depth chart (plotly).

Both libraries are declared dependencies that ship their browser code inside their wheels; each page
inlines that code at report time (the DataTables bundle of itables, plotly.js), so index.html stays one
self-contained file that opens offline. The browser renders from the inlined data: the table draws
only the rows in view (DataTables Scroller), the chart switches to WebGL for big layer counts, so a
10,000-layer report stays quick to build and to use.
"""
from __future__ import annotations

import base64
import importlib.util
import math
from functools import lru_cache
from pathlib import Path

import pandas as pd

from analyzer.results import LazyRecords, dumps

TABLE_ID = "layer-table"
CHART_ID = "error-chart"
FLOOR = 1e-12  # a zero error still shows on the log axis
WEBGL_POINTS = 5000  # above this many points the chart draws with WebGL (Scattergl), below with SVG
PALETTE = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"]


def layer_table_html(rows: pd.DataFrame, columns: list[str]) -> str:
    """Every layer row in one DataTable: global search, sort by any column, panes for run/op type/status.

    The rows go in as one JSON island of arrays (orjson, column-wise cleaning: itables' own DataFrame
    formatter costs seconds at 10,000 rows); DataTables and its extensions come from the bundle that
    the installed itables ships (itables/html/dt_bundle.js, found without importing itables),
    inlined base64 and imported as a module by web/layer_table.js."""
    bundle = _itables_dir() / "html" / "dt_bundle.js"
    data = dumps({"columns": columns, "rows": LazyRecords(rows, columns, as_lists=True)}).replace("</", "<\\/")
    return (f"<style>{_asset(bundle.with_suffix('.css'))}</style>"
            f"<table id='{TABLE_ID}' class='display compact nowrap' style='width:100%'></table>"
            f"<script type='application/json' id='layer-data'>{data}</script>"
            f"<script type='text/plain' id='dt-bundle'>{_base64(bundle)}</script>"
            f"<script>{_asset(Path(__file__).with_name('web') / 'layer_table.js')}</script>")


def _itables_dir() -> Path:
    """The installed itables package's folder, located without importing it (its import pulls in
    its DataFrame formatters, which the page does not use)."""
    spec = importlib.util.find_spec("itables")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("itables is not installed (pip install itables)")
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=4)
def _asset(path: Path) -> str:
    return path.read_text(encoding="utf-8").replace("</s", "<\\/s")


@lru_cache(maxsize=1)
def _base64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def error_chart_html(measured: pd.DataFrame, metric: str = "rel_l2") -> str:
    """Error over depth, one series per run, log y; drag to zoom, double-click to reset, hover names the layer.

    x is the layer's execution order among measured layers; a non-finite error is drawn at 10x the
    largest finite one so it stands out instead of vanishing."""
    import plotly.io

    if measured.empty:
        return f"<div id='{CHART_ID}'><p>No measured layer to chart.</p></div>"
    keys = list(measured.groupby("key")["position"].min().sort_values().index)
    x_of = pd.Series(range(len(keys)), index=keys, dtype="int64")
    values = pd.to_numeric(measured[metric], errors="coerce")
    finite = values[values.map(math.isfinite)]
    top = float(finite.max()) * 10 if len(finite) else 1.0
    kind = "scattergl" if len(measured) > WEBGL_POINTS else "scatter"
    traces = []
    for k, (run, part) in enumerate(measured.assign(_y=values).groupby("run", sort=False)):
        part = part.assign(_x=x_of.reindex(part["key"]).to_numpy()).sort_values("_x")
        ys = [top if not math.isfinite(v) else max(v, FLOOR) for v in part["_y"].tolist()]
        traces.append({"type": kind, "mode": "lines", "name": run, "x": part["_x"].tolist(), "y": ys,
                       "text": part["key"].tolist(), "line": {"width": 1.2, "color": PALETTE[k % len(PALETTE)]},
                       "hovertemplate": f"%{{text}}<br>{metric} %{{y:.4g}}"})
    layout = {"title": {"text": f"{metric} by layer (drag to zoom, double-click to reset)"}, "height": 380,
              "margin": {"l": 70, "r": 20, "t": 50, "b": 50}, "hovermode": "closest",
              "xaxis": {"title": {"text": "layer (execution order)"}},
              "yaxis": {"title": {"text": f"{metric} vs reference (log)"}, "type": "log", "dtick": 1,
                        "exponentformat": "e"},
              "showlegend": len(traces) > 1}
    chart = plotly.io.to_html({"data": traces, "layout": layout}, include_plotlyjs=True, full_html=False,
                              div_id=CHART_ID, validate=False, config={"displaylogo": False, "responsive": True})
    return chart

