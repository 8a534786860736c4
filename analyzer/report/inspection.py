"""`analyze inspect`: what a dump holds, answered from its attributes and `/layers` table alone.

Dumps can be many gigabytes; the precomputed per-layer statistics make "which layers have NaN, which
exceed fp16's range" instant, so nothing here reads a tensor.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import InputError
from layerdiff.analyzer.align.graph import build_graph
from layerdiff.analyzer.report.results import clean
from layerdiff.analyzer.report.numbers import format_number
from layerdiff.safetext import terminal_cell

PROVENANCE_SHOWN = ("engine", "engine_version", "backend_requested", "backend_actual", "precision_requested",
                    "precision_effective", "threads", "device_model", "device_serial", "soc", "abi", "gpu",
                    "model_name", "input_label", "repeat", "complete", "exit_status", "infer_ms", "harness", "created")
LAYER_SHOWN = ("order", "key", "op_type", "shape", "min", "max", "mean", "std", "n_nan", "n_posinf", "n_neginf",
               "n_zero", "n_fp16_overflow", "n_fp16_underflow", "n_fp16_saturated")


def inspect_dump(path: Path, layer: str | None = None, as_json: bool = False) -> None:
    """Print the dump's provenance and layer table, or one layer's summary."""
    with DumpFile(path) as dump:
        attrs, layers = dump.attrs, dump.layers
    if layer is not None:
        row = find_layer(layers, layer, path)
        _print_layer(row, layers, as_json)
        return
    if as_json:
        print(json.dumps(clean({"provenance": {k: attrs.get(k) for k in PROVENANCE_SHOWN},
                                "layers": layers[list(LAYER_SHOWN)].to_dict("records")}), indent=1))
        return
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=220)
    console.print(terminal_cell(f"{path}  ({len(layers)} layers)"))
    for key in PROVENANCE_SHOWN:
        console.print(terminal_cell(f"  {key}: {attrs.get(key, '')}"))
    console.print(_layer_table(layers))


def find_layer(layers: pd.DataFrame, wanted: str, path: Path) -> pd.Series:
    """A layer by key, op name or tensor name; a unique substring match is accepted as a convenience."""
    for column in ("key", "op", "name"):
        hit = layers[layers[column] == wanted]
        if len(hit):
            return hit.iloc[0]
    partial = layers[layers["key"].str.contains(wanted, regex=False)]
    if len(partial) == 1:
        return partial.iloc[0]
    hint = f"; {len(partial)} layers contain it, e.g. {', '.join(partial['key'].head(3))}" if len(partial) else ""
    raise InputError(f"{path}: no layer {wanted!r}{hint} (list them with: analyze inspect {path})")


def _layer_table(layers: pd.DataFrame) -> Table:
    table = Table(show_lines=False)
    for column in LAYER_SHOWN:
        table.add_column(column)
    for row in layers.to_dict("records"):
        risky = row["n_nan"] or row["n_posinf"] or row["n_neginf"] or row["n_fp16_overflow"] or row["n_fp16_saturated"]
        table.add_row(*(terminal_cell(format_number(_py(row[c]))) for c in LAYER_SHOWN), style="red" if risky else None)
    return table


def _print_layer(row: pd.Series, layers: pd.DataFrame, as_json: bool) -> None:
    graph = build_graph(layers)
    key = str(row["key"])
    summary = {**{c: _py(row[c]) for c in layers.columns},
               "fed_by": list(graph.producers.get(key, ())), "feeds": list(graph.consumers.get(key, ())),
               "zero_share": _share(row["n_zero"], row["numel"]),
               "fp16_underflow_share": _share(row["n_fp16_underflow"], row["numel"])}
    if as_json:
        print(json.dumps(clean(summary), indent=1))
        return
    console = Console(highlight=False, soft_wrap=True)
    for name, value in summary.items():
        text = ", ".join(map(str, value)) if isinstance(value, list) else format_number(value)
        console.print(terminal_cell(f"{name:>22}: {text}"))


def _share(count, total) -> float:
    return float(count) / float(total) if total else 0.0


def _py(value):
    return value.item() if hasattr(value, "item") else value
