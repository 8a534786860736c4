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
from typing import Iterator

import numpy as np
import orjson
import pandas as pd

from layerdiff.analyzer.report.results import LazyRecords, dump_chunks

TABLE_ID = "layer-table"
CHART_ID = "error-chart"
FLOOR = 1e-12  # a zero error still shows on the log axis
WEBGL_POINTS = 5000  # above this many points the chart draws with WebGL (Scattergl), below with SVG
PALETTE = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"]


def layer_table_parts(rows: pd.DataFrame, columns: list[str]) -> Iterator[str]:
    """Every layer row in one DataTable (global search, sort by any column, panes for run/op type/status),
    as HTML in pieces: the rows' JSON a few thousand rows at a time, never whole in memory.

    The rows go in as one JSON island of arrays (orjson, column-wise cleaning: itables' own DataFrame
    formatter costs seconds at 10,000 rows); DataTables and its extensions come from the bundle that
    the installed itables ships (itables/html/dt_bundle.js, found without importing itables),
    inlined base64 and imported as a module by web/layer_table.js."""
    bundle = _package_dir("itables") / "html" / "dt_bundle.js"
    yield (f"<style>{_asset(bundle.with_suffix('.css'))}</style>"
           f"<table id='{TABLE_ID}' class='display compact nowrap' style='width:100%'></table>"
           "<script type='application/json' id='layer-data'>")
    # chunks end between rows, so no "</" is split across two of them
    for chunk in dump_chunks({"columns": columns, "rows": LazyRecords(rows, columns, as_lists=True)}):
        yield chunk.decode("utf-8").replace("</", "<\\/")
    yield (f"</script><script type='text/plain' id='dt-bundle'>{_base64(bundle)}</script>"
           f"<script>{_asset(Path(__file__).with_name('web') / 'layer_table.js')}</script>")


def _package_dir(name: str) -> Path:
    """An installed package's folder, located without importing it (the page needs only the browser
    code its wheel ships; importing itables or plotly cost ~0.1-0.2 s CPU and ~20 MB each)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{name} is not installed (pip install {name})")
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=4)
def _asset(path: Path) -> str:
    return path.read_text(encoding="utf-8").replace("</s", "<\\/s")


@lru_cache(maxsize=1)
def _base64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def error_chart_parts(measured: pd.DataFrame, metric: str = "rel_l2") -> Iterator[str]:
    """Error over depth, one series per run, log y; drag to zoom, double-click to reset, hover names the layer.

    x is the layer's execution order among measured layers; a non-finite error is drawn at 10x the
    largest finite one so it stands out instead of vanishing."""
    if measured.empty:
        yield f"<div id='{CHART_ID}'><p>No measured layer to chart.</p></div>"
        return
    yield from _plotly_js()  # 4.6 MB written (and freed) before the chart's data is built
    keys = list(measured.groupby("key")["position"].min().sort_values().index)
    x_of = pd.Series(range(len(keys)), index=keys, dtype="int64")
    values = pd.to_numeric(measured[metric], errors="coerce")
    finite = values[values.map(math.isfinite)]
    top = float(finite.max()) * 10 if len(finite) else 1.0
    kind = "scattergl" if len(measured) > WEBGL_POINTS else "scatter"
    traces = []
    for k, (run, part) in enumerate(measured[["run", "key"]].assign(_y=values).groupby("run", sort=False)):
        part = part.assign(_x=x_of.reindex(part["key"]).to_numpy()).sort_values("_x")
        y = part["_y"].to_numpy(dtype=np.float64)
        ys = np.where(np.isfinite(y), np.maximum(y, FLOOR), top)  # numpy arrays: orjson writes them directly
        traces.append({"type": kind, "mode": "lines", "name": run, "x": part["_x"].to_numpy(dtype=np.int64), "y": ys,
                       "text": part["key"].tolist(), "line": {"width": 1.2, "color": PALETTE[k % len(PALETTE)]},
                       "hovertemplate": f"%{{text}}<br>{metric} %{{y:.4g}}"})
    layout = {"title": {"text": f"{metric} by layer (drag to zoom, double-click to reset)"}, "height": 380,
              "margin": {"l": 70, "r": 20, "t": 50, "b": 50}, "hovermode": "closest",
              "xaxis": {"title": {"text": "layer (execution order)"}},
              "yaxis": {"title": {"text": f"{metric} vs reference (log)"}, "type": "log", "dtick": 1,
                        "exponentformat": "e"},
              "showlegend": len(traces) > 1}
    config = orjson.dumps({"displaylogo": False, "responsive": True}).decode("utf-8")
    yield (f"<div style='height:{layout['height']}px; width:100%;'>"
           f'<div id="{CHART_ID}" class="plotly-graph-div" style="height:100%; width:100%;"></div>'
           f'<script>Plotly.newPlot("{CHART_ID}", ')
    yield _script_json(traces)  # the points, their own piece: no further copy of tens of MB at 50,000 layers
    yield f", {_script_json(layout)}, {config});</script></div>"


def _script_json(value) -> str:
    """JSON safe inside <script> (no `</`); copied by the replace only when it is needed."""
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode("utf-8")
    return text.replace("</", "<\\/") if "</" in text else text


def _plotly_js() -> Iterator[str]:
    """plotly.js from the installed plotly package (not imported), inlined once before the chart."""
    bundle = _package_dir("plotly") / "package_data" / "plotly.min.js"
    yield "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script><script>"
    with bundle.open(encoding="utf-8") as js:  # in 1 MB pieces: the page is written as it is read
        while piece := js.read(1 << 20):
            yield piece
    yield "</script>"
