"""The report's interactive layer table (itables' DataTables bundle); the charts are in `charts`.

Both libraries are declared dependencies that ship their browser code inside their wheels; each page
inlines that code at report time (the DataTables bundle of itables, plotly.js), so index.html stays one
self-contained file that opens offline. The browser renders from the inlined data: the table draws
only the rows in view (DataTables Scroller), the chart switches to WebGL for big layer counts, so a
10,000-layer report stays quick to build and to use.
"""
from __future__ import annotations

import base64
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import pandas as pd

from layerdiff.analyzer.report.results import LazyRecords, dump_chunks
from layerdiff.safetext import json_in_script

TABLE_ID = "layer-table"


def layer_table_parts(rows: pd.DataFrame, columns: list[str]) -> Iterator[str | bytes]:
    """Every layer row in one DataTable (global search, sort by any column, panes for run/op type/status),
    as HTML in pieces: the rows' JSON a few thousand rows at a time, never whole in memory.

    The rows go in as one JSON island of arrays (orjson, column-wise cleaning: itables' own DataFrame
    formatter costs seconds at 10,000 rows); DataTables and its extensions come from the bundle that
    the installed itables ships (itables/html/dt_bundle.js, found without importing itables),
    inlined base64 and imported as a module by web/layer_table.js."""
    bundle = package_dir("itables") / "html" / "dt_bundle.js"
    yield (f"<style>{_asset(bundle.with_suffix('.css'))}</style>"
           f"<table id='{TABLE_ID}' class='display compact nowrap' style='width:100%'></table>"
           "<script type='application/json' id='layer-data'>")
    # the names are data: no "<" reaches the page inside the JSON (layerdiff.safetext)
    for chunk in dump_chunks({"columns": columns, "rows": LazyRecords(rows, columns, as_lists=True)}):
        yield json_in_script(chunk)  # UTF-8 bytes already
    yield (f"</script><script type='text/plain' id='dt-bundle'>{_base64(bundle)}</script>"
           f"<script>{_asset(Path(__file__).with_name('web') / 'layer_table.js')}</script>")


def package_dir(name: str) -> Path:
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
