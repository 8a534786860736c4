"""Results out to the tools people already use: Google Model Explorer and Polygraphy.

- Model Explorer node data (GraphNodeData JSON, as model_explorer/node_data_builder.py defines it):
  `{"results": {<node key>: {"value": <number>, "bgColor"?: <css>}}, "thresholds": [...]}`. A node
  key is an output tensor name or a node id; by default we use the *reference's* tensor name of each
  aligned layer, which for an ONNX Runtime / Polygraphy reference is the ONNX tensor name Model
  Explorer shows for the ONNX model. JSON has no NaN/Inf, so a layer whose outputs disagree in
  finiteness gets NONFINITE_VALUE and a purple background.
- Polygraphy RunResults JSON (polygraphy/json/serde.py): one runner, one iteration, arrays as base64
  `.npy` in LazyArray wrappers, so `polygraphy run --load-outputs` / `RunResults.load` read it.

The Model Explorer values are the report's own: the run is analyzed against the reference by
`layerdiff.analyzer.analysis.analyze_paths` (the same alignment, by name with `--name-map`/`--rename`
or by structure, and the same metrics), so a layer's colour is the number its report row shows.
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

if TYPE_CHECKING:
    import pandas as pd

    from layerdiff.analyzer.align.byname import NameRules

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


def layer_metrics(run_path: Path | str, ref_path: Path | str, metric: str = "rel_l2",
                  rules: NameRules | None = None, problems: list[str] | None = None) -> pd.DataFrame:
    """One row per run layer the analysis aligned with a reference layer and measured: key, name, op,
    ref_name, value (the report's `metric`; inf where the two disagree on which values are finite).
    A layer that could not be measured (an unreadable tensor) has no row: its one-line reason is added
    to `problems`, so a caller says which nodes are uncoloured instead of leaving them silently blank."""
    from layerdiff.analyzer.analysis import analyze_paths  # the analysis loads pandas: not for `--help`

    if metric not in METRICS:
        raise UsageError(f"--metric {metric}: unknown metric (choose from {', '.join(METRICS)})")
    analysis = analyze_paths([run_path], ref=ref_path, rules=rules)
    if problems is not None:
        problems.extend(analysis.problems)
    try:
        return _aligned_values(analysis, Path(run_path), Path(ref_path), metric)
    finally:
        analysis.close()


def _aligned_values(analysis, run_path: Path, ref_path: Path, metric: str) -> pd.DataFrame:
    import pandas as pd

    run = next(r for r in analysis.runs if r.names(run_path))
    ref = next(r for r in analysis.runs if r.names(ref_path))
    table = analysis.comparison.table
    rows = table[(table["run"] == run.label) & (table["reference"] == ref.label) & table[metric].notna()]
    run_layers = run.layers.set_index("key")
    ref_names = ref.layers.set_index("key")["name"]
    nonfinite = rows["n_nonfinite_mismatch"].fillna(0).to_numpy() > 0
    return pd.DataFrame({
        "key": rows["run_key"].to_numpy(), "name": run_layers["name"].reindex(rows["run_key"]).to_numpy(),
        "op": run_layers["op"].reindex(rows["run_key"]).to_numpy(),
        "ref_name": ref_names.reindex(rows["key"]).to_numpy(),
        "value": np.where(nonfinite, math.inf, rows[metric].to_numpy(dtype=float)),
    }, columns=["key", "name", "op", "ref_name", "value"])


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
                          key_by: str = "reference", graph_id: str | None = None,
                          rules: NameRules | None = None, problems: list[str] | None = None) -> Path:
    """Write Model Explorer node data colouring each layer by its error against the reference,
    aligned and measured as `analyze RUN --ref REFERENCE` (with the same name `rules`) reports it;
    what could not be measured is added to `problems` (one line each), as `analyze` prints it."""
    if key_by not in KEY_BY:
        raise UsageError(f"--key-by {key_by}: choose from {', '.join(KEY_BY)}")
    data = model_explorer_node_data(layer_metrics(run, reference, metric, rules, problems), key_by)
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
