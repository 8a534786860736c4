"""Results out to the tools people already use: Google Model Explorer and Polygraphy.

- Model Explorer node data (GraphNodeData JSON, as model_explorer/node_data_builder.py defines it):
  `{"results": {<node key>: {"value": <number>, "bgColor"?: <css>}}, "thresholds": [...]}`. A node
  key is an output tensor name or a node id; by default we use the *reference's* tensor name of each
  aligned layer, which for an ONNX Runtime / Polygraphy reference is the ONNX tensor name Model
  Explorer shows for the ONNX model. JSON has no NaN/Inf, so a layer whose outputs disagree in
  finiteness gets NONFINITE_VALUE and a purple background.
- Polygraphy RunResults JSON (polygraphy/json/serde.py): one runner, one iteration, arrays as base64
  `.npy` in LazyArray wrappers, so `polygraphy run --load-outputs` / `RunResults.load` read it.

The per-layer metric is a small local function for now (max abs diff, relative L2 over aligned
keys); layerdiff.analyzer.measure.metrics replaces it once it exists.
"""
from __future__ import annotations

import base64
import io
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import UsageError
from layerdiff.analyzer.align.naming import canonical_from_key, is_helper

if TYPE_CHECKING:
    import pandas as pd

METRICS = ("rel_l2", "max_abs")
KEY_BY = ("reference", "name", "op")
NONFINITE_VALUE = 1e30
NONFINITE_COLOR = "#9c27b0"
DEFAULT_THRESHOLDS = [
    {"value": 1e-4, "bgColor": "#c8e6c9"},
    {"value": 1e-2, "bgColor": "#fff59d"},
    {"value": 1e-1, "bgColor": "#ffcc80"},
    {"value": 1e29, "bgColor": "#ef9a9a"},
]


def layer_metric(run: np.ndarray, ref: np.ndarray, metric: str = "rel_l2") -> float | None:
    """Error of `run` against `ref` (flattened); inf when they disagree on which values are finite.

    None when the element counts differ (not the same tensor). `rel_l2` = ||run-ref|| / ||ref||
    over values finite in both (||ref|| floored at 1e-12); `max_abs` = max |run-ref| there.
    """
    a = np.asarray(run, dtype=np.float64).reshape(-1)
    b = np.asarray(ref, dtype=np.float64).reshape(-1)
    if a.size != b.size:
        return None
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb) or not np.array_equal(a[~fa], b[~fb], equal_nan=True):
        return math.inf
    diff = a[fa] - b[fb]
    if diff.size == 0:
        return 0.0
    if metric == "max_abs":
        return float(np.max(np.abs(diff)))
    if metric == "rel_l2":
        return float(np.linalg.norm(diff) / max(float(np.linalg.norm(b[fb])), 1e-12))
    raise UsageError(f"--metric {metric}: unknown metric (choose from {', '.join(METRICS)})")


def layer_metrics(run_path: Path | str, ref_path: Path | str, metric: str = "rel_l2") -> pd.DataFrame:
    """One row per run layer aligned with a reference layer: key, name, op, ref_name, value."""
    if metric not in METRICS:
        raise UsageError(f"--metric {metric}: unknown metric (choose from {', '.join(METRICS)})")
    rows = []
    with DumpFile(run_path) as run, DumpFile(ref_path) as ref:
        ref_rows = _by_canonical(ref.layers)
        for layer in run.layers.itertuples(index=False):
            match = ref_rows.get(canonical_from_key(layer.key))
            if match is None or is_helper(layer.op):
                continue
            value = layer_metric(run.tensor(int(layer.order)), ref.tensor(int(match.order)), metric)
            if value is not None:
                rows.append({"key": layer.key, "name": layer.name, "op": layer.op, "ref_name": match.name, "value": value})
    import pandas as pd  # here, not at import: `analyze --help` lists this module's options without pandas

    return pd.DataFrame(rows, columns=["key", "name", "op", "ref_name", "value"])


def _by_canonical(layers: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers.itertuples(index=False):
        if not is_helper(layer.op):
            out.setdefault(canonical_from_key(layer.key), layer)
    return out


def model_explorer_node_data(metrics: pd.DataFrame, key_by: str = "reference",
                             thresholds: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """GraphNodeData for Model Explorer from a `layer_metrics` table."""
    if key_by not in KEY_BY:
        raise UsageError(f"--key-by {key_by}: choose from {', '.join(KEY_BY)}")
    column = {"reference": "ref_name", "name": "name", "op": "op"}[key_by]
    results: dict[str, dict[str, Any]] = {}
    for row in metrics.itertuples(index=False):
        node = str(getattr(row, column))
        if node in results:
            continue
        if math.isfinite(row.value):
            results[node] = {"value": float(row.value)}
        else:
            results[node] = {"value": NONFINITE_VALUE, "bgColor": NONFINITE_COLOR}
    return {"results": results, "thresholds": thresholds or DEFAULT_THRESHOLDS}


def export_model_explorer(run: Path | str, reference: Path | str, out: Path | str, metric: str = "rel_l2",
                          key_by: str = "reference", graph_id: str | None = None) -> Path:
    """Write Model Explorer node data colouring each layer by its error against the reference."""
    data = model_explorer_node_data(layer_metrics(run, reference, metric), key_by)
    if graph_id:
        data = {graph_id: data}  # ModelNodeData: GraphNodeData by graph id
    return _write_text(Path(out), lambda fh: json.dump(data, fh, indent=2, allow_nan=False))


def export_polygraphy(run: Path | str, out: Path | str, runner_name: str | None = None) -> Path:
    """Write one run as a Polygraphy RunResults JSON (one runner, one iteration)."""
    with DumpFile(run) as dump:
        attrs = dump.attrs
        name = runner_name or "-".join(
            str(p) for p in ("layerdiff", attrs.get("engine"), attrs.get("backend_actual") or attrs.get("backend_requested"),
                             attrs.get("precision_requested")) if p)
        infer_ms = attrs.get("infer_ms")
        runtime = float(infer_ms) / 1000.0 if isinstance(infer_ms, (int, float)) and math.isfinite(infer_ms) else None

        def write(fh: TextIO) -> None:
            _write_run_results(fh, dump, name, runtime)

        return _write_text(Path(out), write)


def _write_run_results(fh: TextIO, dump: DumpFile, runner: str, runtime: float | None) -> None:
    """Stream the JSON so memory holds one tensor at a time."""
    fh.write('{"lst": [[' + json.dumps(runner) + ', [{"outputs": {')
    used: set[str] = set()
    for i, layer in enumerate(dump.layers.itertuples(index=False)):
        name = layer.name if layer.name not in used else layer.key
        used.add(name)
        fh.write(("" if i == 0 else ", ") + json.dumps(name) + ": ")
        fh.write('{"values": {"array": "' + _npy_base64(dump.tensor(int(layer.order))) + '", "polygraphy_class": "ndarray"}, '
                 '"polygraphy_class": "LazyArray"}')
    fh.write('}, "runtime": ' + json.dumps(runtime) + ', "runner_name": ' + json.dumps(runner)
             + ', "polygraphy_class": "IterationResult"}]]], "polygraphy_class": "RunResults"}\n')


def _npy_base64(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _write_text(path: Path, write) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "w", encoding="utf-8") as fh:
            write(fh)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
