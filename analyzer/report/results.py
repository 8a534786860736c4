"""The machine-readable results (`analyze --json`, `results.json`): one versioned document.

Scripts and CI jobs read this, so its shape is a contract written down in analyzer/REPORT_SCHEMA.md
and versioned by `SCHEMA_VERSION`: fields are only ever added within a version; renaming or
removing one bumps it. JSON has no NaN or infinity: NaN is written as null, +-infinity as the
strings "inf" / "-inf".
"""
from __future__ import annotations

import math
import secrets
from typing import Any, Iterator

import numpy as np
import orjson
import pandas as pd

from layerdiff.analyzer import __version__
from layerdiff.analyzer.measure.comparison import Comparison
from layerdiff.analyzer.measure.rows import records as plain_records
from layerdiff.analyzer.formats.dumpfile import utc_now
from layerdiff.analyzer.findings.divergence import Finding
from layerdiff.analyzer.measure.isolation import ATTACHED_COLUMNS
from layerdiff.analyzer.runs.sources import Run
from layerdiff.analyzer.runs.header import observability
from layerdiff.analyzer.findings.verdict import Thresholds

SCHEMA_NAME = "layerdiff-results"
SCHEMA_VERSION = 1
ROWS_PER_CHUNK = 2000
LAYER_FIELDS = ["position", "key", "run_key", "op", "op_type", "status", "reasons", "shape", "run_shape",
                "shape_status", "permutation", "match", "confidence", "is_output", "numel", "max_abs", "mean_abs", "median_abs", "p99_abs",
                "max_rel", "mean_rel", "rel_l2", "cosine", "sqnr_db", "pass_fraction", "n_fail", "beyond_scale",
                "n_nonfinite_mismatch", "n_nan_new", "n_nan_lost", "n_posinf_new", "n_posinf_lost",
                "n_neginf_new", "n_neginf_lost", "zero_collapse", "n_zero_collapsed", "n_saturated", "top1", "top5",
                "n_top1_flips", "n_tie_flips", "growth", "worst_input", "n_zero_new", "n_out_of_range", "range_excess",
                "ref_min", "ref_max", "run_min", "run_max", "estimated", "rel_l2_sigma", "cosine_sigma",
                "sqnr_db_sigma", "pass_fraction_sigma", "beyond_scale_sigma", "zero_collapse_sigma"]
# Present on every layer when isolated dumps were analyzed (null on layers that were not isolated).
ISOLATED_LAYER_FIELDS = ATTACHED_COLUMNS
PROVENANCE_FIELDS = ["engine", "engine_version", "backend_requested", "backend_actual", "precision_requested",
                     "precision_effective", "threads", "device_serial", "device_model", "soc", "board", "abi",
                     "android_release", "gpu", "model_name", "model_sha256", "input_label", "input_sha256",
                     "infer_ms", "harness", "repeat", "complete", "exit_status", "created", "tool_version"]


def build_results(comparison: Comparison, runs: list[Run], findings: list[Finding], summary: pd.DataFrame,
                  thresholds: Thresholds, problems: list[str], isolated: list[dict] | None = None) -> dict[str, Any]:
    """The whole document as plain Python values (JSON-safe after `clean`).

    `isolated` lists the isolated dumps placed next to a run (layerdiff.analyzer.measure.isolation `Isolation.matched`);
    the key is present only when there were some, so documents without isolation are unchanged.
    """
    plan = comparison.plan
    summary_by_run = {row["run"]: row for row in plain_records(summary)}
    return clean({
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "created": utc_now(),
        "reference": {"run": plan.reference.label, "file": str(plan.reference.path), "reason": plan.reason,
                      "per_input": {k or "": r.label for k, r in plan.references.items()}},
        "thresholds": thresholds.as_dict(),
        "problems": list(problems),
        "runs": [_run_entry(run, comparison, findings, summary_by_run.get(run.label, {})) for run in runs],
        "findings": [f.as_dict() for f in findings],
        **({"isolated": list(isolated)} if isolated else {}),
    })


def _run_entry(run: Run, comparison: Comparison, findings: list[Finding], summary: dict) -> dict[str, Any]:
    index = next((i for i, p in enumerate(comparison.plan.pairs) if p.other is run and p.kind == "reference"), None)
    entry: dict[str, Any] = {
        "run": run.label,
        "file": str(run.path),
        "role": summary.get("role", ""),
        "reference": summary.get("reference", ""),
        "verdict": summary.get("verdict", ""),
        "provenance": {k: run.attrs.get(k) for k in PROVENANCE_FIELDS if k in run.attrs},
        "summary": {k: v for k, v in summary.items() if k not in ("run", "role", "reference", "verdict", "file")},
        "first_divergence": None,
        "findings": [f.as_dict() for f in findings if f.run == run.label],
        "layers": [],
        "unmatched": {"only_in_reference": [], "only_in_run": []},
        "not_compared_reason": comparison.plan.uncompared.get(run.label, ""),
        "observability": observability(run),  # how the run knows its dumped tensors were written (FORMATS.md §1)
    }
    first = next((f for f in findings if f.kind == "first_divergence" and f.run == run.label), None)
    if first is not None:
        entry["first_divergence"] = {"layer": first.layer, "op_type": first.op_type, "status": first.severity,
                                     **first.numbers}
    if index is not None:
        rows = comparison.pair_rows(index)
        extra = [c for c in (*ISOLATED_LAYER_FIELDS, "block") if c in rows.columns]  # block: findings/blocks.py
        entry["layers"] = LazyRecords(rows, [c for c in LAYER_FIELDS if c in rows.columns] + extra)
        alignment = comparison.alignments[index]
        entry["unmatched"] = {"only_in_reference": records(alignment.only_base),
                              "only_in_run": records(alignment.only_other)}
    return entry


class LazyRecords:
    """A table's rows in the document, turned into JSON-safe dicts `ROWS_PER_CHUNK` at a time only when
    the document is written (`dump_chunks`): a dict per layer of a 50,000-layer run held ~100 MB."""

    def __init__(self, frame: pd.DataFrame, columns: list[str], *, as_lists: bool = False) -> None:
        self.frame, self.columns, self.as_lists = frame, columns, as_lists

    def chunks(self) -> Iterator[list]:
        """Rows as dicts (or, `as_lists`, as lists in `columns` order), `ROWS_PER_CHUNK` at a time."""
        for start in range(0, len(self.frame), ROWS_PER_CHUNK):
            part = self.frame.iloc[start:start + ROWS_PER_CHUNK]
            if self.as_lists:
                yield [list(row) for row in zip(*(_clean_column(part[c]) for c in self.columns))]
            else:
                yield records(part, self.columns)

    def __iter__(self) -> Iterator:
        return (row for chunk in self.chunks() for row in chunk)

    def __len__(self) -> int:
        return len(self.frame)


class _Cleaned(list):
    """Rows already JSON-safe (built column by column by `records`): `clean` passes them through."""


def records(frame: pd.DataFrame, columns: list[str] | None = None) -> list[dict]:
    """`frame.to_dict("records")`, JSON-safe, built column-wise: 10,000 layers x 40 fields cost
    seconds when every cell went through pandas and `clean` one by one."""
    columns = list(frame.columns) if columns is None else columns
    values = [_clean_column(frame[c]) for c in columns]
    return _Cleaned(dict(zip(columns, row)) for row in zip(*values))


def _clean_column(series: pd.Series) -> list:
    """A column as JSON-safe Python values, a whole column per numpy step where the dtype allows
    (per-cell `clean` was most of writing results.json for small layers)."""
    if series.dtype.kind in "iub":
        return series.tolist()
    if series.dtype.kind == "f":
        values = series.to_numpy(dtype=float)
        if bool(np.isfinite(values).all()):
            return values.tolist()
        out = values.astype(object)  # Python floats; then NaN -> None, +-inf -> "inf" / "-inf"
        out[np.isnan(values)] = None
        out[np.isposinf(values)] = "inf"
        out[np.isneginf(values)] = "-inf"
        return out.tolist()
    values = series.tolist()
    if isinstance(series.dtype, pd.StringDtype) and not series.hasnans:  # texts only: nothing to clean
        return values
    if pd.api.types.is_string_dtype(series.dtype) and not bool(series.isna().any()) \
            and all(type(v) is str for v in values):
        return values
    return [clean(v) for v in values]


def clean(value: Any) -> Any:
    """Recursively make a value JSON-safe: numpy scalars to Python, NaN to None, inf to strings."""
    if isinstance(value, (_Cleaned, LazyRecords)):
        return value
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    return value


def dumps(document: dict[str, Any]) -> str:
    """Compact JSON through orjson (a 10,000-layer document in tens of milliseconds, not seconds)."""
    return b"".join(dump_chunks(document)).decode("utf-8")


def dump_chunks(document: dict[str, Any]) -> Iterator[bytes]:
    """The document's compact JSON in pieces: the skeleton once, each `LazyRecords` a chunk of rows at a
    time in its place, so a big document is never whole in memory (results.json is written from this)."""
    lazy: list[LazyRecords] = []
    token = secrets.token_hex(8)

    def placeholder(value: Any) -> str:
        if isinstance(value, LazyRecords):
            lazy.append(value)
            return f"{token}:{len(lazy) - 1}"
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    skeleton = orjson.dumps(document, default=placeholder, option=orjson.OPT_SERIALIZE_NUMPY)
    for i, rows in enumerate(lazy):
        before, skeleton = skeleton.split(f'"{token}:{i}"'.encode(), 1)
        yield before
        yield b"["
        first = True
        for chunk in rows.chunks():
            if chunk:
                yield (b"" if first else b",") + orjson.dumps(chunk, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
                first = False
        yield b"]"
    yield skeleton
