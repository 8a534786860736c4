"""`OUT/fix.json`: what `collect fix` chose and why, what it wrote, and what it measured.

The report's "Fix" section (layerdiff.analyzer.report.fixsection) reads the same file, so the keys here are the
contract between the two (listed in analyzer/REPORT_SCHEMA.md).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from layerdiff.collector.engines import ENGINES
from layerdiff.collector.fix.mechanisms import mechanism_for
from layerdiff.collector.fix.search import FixResult

FIX_JSON = "fix.json"


def number(value: float) -> float | str:
    """JSON has no inf/nan: those become strings."""
    return value if math.isfinite(value) else str(value)


def fix_document(result: FixResult, *, device: str, model: str, engine: str, backend: str, precision: str,
                 tolerance: float) -> dict:
    doc = {
        "status": result.status, "device": device, "model": model, "engine": engine, "backend": backend,
        "precision": precision, "reference": f"{backend}/high",
        "tolerance": {"metric": "relative L2 of every model output vs the reference run on the same input",
                      "max": tolerance},
        "mode": mechanism_for(engine).name,
        "layers": [{"layer": op, **result.reasons.get(op, {})} for op in result.chosen],
        "layers_total": result.layers_total, "layers_maskable": len(result.maskable),
        "errors": {label: {"before": number(err),
                           "after": number(result.after.errors[label]) if result.after else number(err)}
                   for label, err in result.before.errors.items()},
        "search": {"runs": result.runs, "trials": len(result.steps), "seconds": round(result.seconds, 2),
                   "steps": [{"phase": s.phase, "layers": list(s.trial.layers), "added": s.added,
                              "worst_error": number(s.trial.worst),
                              **({"failed": s.trial.failures} if s.trial.failures else {})} for s in result.steps]},
    }
    if result.patched is not None:
        doc["patched_model"] = {"param": result.patched.files[0].name, "bin": result.patched.files[1].name,
                                "lines_changed": len(result.masks)}
        bits = mechanism_for(engine).describe_mask
        doc["masks"] = {op: {"key": 31, "value": mask, "bits": bits(mask)} for op, mask in result.masks.items()}
    if result.speed:
        doc["speed"] = {k: number(v) if isinstance(v, float) else v for k, v in result.speed.items()}
    advice = ENGINES[engine].fix_advice if engine in ENGINES else ()
    if advice:  # what the engine offers instead of a per-layer switch
        doc["engine_options"] = list(advice)
    return doc


def write_fix_json(doc: dict, out_dir: Path) -> Path:
    path = Path(out_dir) / FIX_JSON
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def summary_lines(doc: dict) -> list[str]:
    """A few console lines: the status, the layers, the error before/after, runs and time, speed."""
    chosen = ", ".join(layer["layer"] for layer in doc["layers"]) or "none"
    g = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731 - inf/nan arrive as strings
    lines = [f"{doc['status']}: {len(doc['layers'])} of {doc['layers_total']} layers kept at high precision "
             f"({doc['mode']}): {chosen}"]
    for label, err in doc["errors"].items():
        lines.append(f"  {label}: output rel L2 {g(err['before'])} -> {g(err['after'])} "
                     f"(tolerance {g(doc['tolerance']['max'])})")
    search = doc["search"]
    lines.append(f"  {search['runs']} runs ({search['trials']} trials) in {search['seconds']:.1f}s")
    if "speed" in doc:
        speed = doc["speed"]
        lines.append(f"  patched model {doc['patched_model']['param']}: {g(speed['patched_ms'])} ms vs "
                     f"{g(speed['original_ms'])} ms for the original ({g(speed['slowdown'])}x its time)")
    return lines
