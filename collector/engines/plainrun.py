"""The plain run: the model run as an app runs it, beside the observed (dumped) run, and how they agree.

Observing a computation can change it: an engine that hands back every intermediate tensor may stop
fusing operators (ONNX Runtime keeps a node whose output is a graph output out of every fusion), a
delegate re-partitions a graph whose activations became outputs, a per-node callback makes a
scheduler compute each node alone. The dumped layers then describe the observed computation, not the
app's. So every host engine also runs the model plainly (only the model's own outputs asked for, no
callback, the same input and configuration), twice, and records per output whether the observed
run's value is identical to the plain run's, and how far apart they are otherwise (`plain_run` in
the raw header, analyzer/FORMATS.md §1). The plain run's outputs go into the dump too (a raw dump of
their own in `<dump>/plain/`), so the analyzer judges what the app gets.

An engine passes its observed outputs (read from the dump as it is written: `DumpSink.watch`), a
function that runs the model plainly once, and one sentence saying what observing does differently
in that engine (`observing`: data the engine folder declares, shown by the report when the runs
disagree).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from layerdiff.analyzer.formats.rawdump import PLAIN_DIR, RawDumpWriter  # PLAIN_DIR: the plain outputs' sub-directory
PLAIN_RUNS = 2  # the second plain run gives the engine's own run-to-run spread


@dataclass
class Observed:
    """One model output as the observed run dumped it (None when the dump left it out: --layers, budget)."""

    name: str
    op: str
    output_index: int
    op_type: str
    layout: str
    array: np.ndarray | None


def difference(other: np.ndarray | None, plain: np.ndarray) -> dict:
    """identical (bit for bit, NaN equal to NaN), max |other - plain| and the relative L2 error against
    the plain values; a NaN or Inf on one side only is an infinite difference."""
    if other is None or np.shape(other) != np.shape(plain):
        return {"compared": False}
    a, b = np.asarray(plain), np.asarray(other)
    if a.dtype == b.dtype and a.tobytes() == b.tobytes():
        return {"compared": True, "identical": True, "max_abs": 0.0, "rel_l2": 0.0}
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    both = ~(nan_a | nan_b)
    a, b = a[both], b[both]
    same = a == b  # equal values, equal infinities included: no difference
    d = np.where(same, 0.0, b - np.where(same, 0.0, a))
    if (nan_a != nan_b).any() or not np.isfinite(d).all():
        return {"compared": True, "identical": False, "max_abs": float("inf"), "rel_l2": float("inf")}
    norm = float(np.linalg.norm(a[np.isfinite(a)]))
    rel = float(np.linalg.norm(d)) / norm if norm else (0.0 if not d.any() else float("inf"))
    return {"compared": True, "identical": not d.any(), "max_abs": float(np.abs(d).max()) if d.size else 0.0,
            "rel_l2": rel}


def record(observed: dict[str, Observed], runs: list[dict[str, np.ndarray]], observing: str) -> dict:
    """The header's `plain_run`: per output, the observed run against the first plain run, and the second
    plain run against the first (the engine's own spread)."""
    first = runs[0]
    outputs = []
    for name, plain in first.items():
        seen = observed.get(name)
        entry = {"name": name, "key": f"{seen.op}:{seen.output_index}" if seen else f"{name}:0",
                 "vs_observed": difference(seen.array if seen else None, plain)}
        if len(runs) > 1:
            entry["vs_second_plain_run"] = difference(runs[1].get(name), plain)
        outputs.append(entry)
    compared = [o["vs_observed"] for o in outputs if o["vs_observed"].get("compared")]
    return {"runs": len(runs), "observing": observing, "outputs": outputs,
            "identical": bool(compared) and len(compared) == len(outputs) and all(c["identical"] for c in compared),
            "plain_outputs": PLAIN_DIR}


def write_plain_outputs(out: Path, header: dict, observed: dict[str, Observed], plain: dict[str, np.ndarray],
                        infer_ms: float) -> None:
    """The plain run's outputs as a raw dump of their own (`<out>/plain/`), keyed like the observed run's."""
    writer = RawDumpWriter(out / PLAIN_DIR, {**header, "plain_run_of": str(out.name)})
    for name, array in plain.items():
        seen = observed.get(name)
        writer.add(op=seen.op if seen else name, op_type=seen.op_type if seen else "Output", array=array,
                   output_index=seen.output_index if seen else 0, name=name, layout=seen.layout if seen else "")
    writer.close(infer_ms=infer_ms)


def check(out: Path, header: dict, observed: dict[str, Observed], run_plain: Callable[[], dict[str, np.ndarray]],
          observing: str, now_ms: Callable[[], float]) -> dict:
    """Run the model plainly twice, write its outputs into the dump, and return the `plain_run` record."""
    runs, first_ms = [], 0.0
    for k in range(PLAIN_RUNS):
        begin = now_ms()
        runs.append({name: _dumpable(value) for name, value in run_plain().items()})
        if k == 0:
            first_ms = now_ms() - begin
    write_plain_outputs(out, header, observed, runs[0], first_ms)
    return {**record(observed, runs, observing), "infer_ms": first_ms}


def _dumpable(value) -> np.ndarray:
    """An output as the dump holds it (masks as 0/1 bytes, as every engine dumps them)."""
    array = np.asarray(value)
    return array.astype(np.uint8) if array.dtype == np.bool_ else array
