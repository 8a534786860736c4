"""Measured comparisons kept next to the dumps, so one set of runs is measured once.

A sweep ends with its own report, and users then often run `analyze` on the same runs (another
`-o`, `--json`): without this, every layer was read and measured twice. The expensive part of an
analysis, `analyzer.compare.compare_all` (alignment + every metric of every layer), is stored in
`<common folder of the dumps>/.layerdiff-cache/` and reused when the same dumps are analyzed with
the same options.

The key covers everything the measurement depends on: each dump's path, size, modification time
and inode (a rewritten dump gets a new key), the pairing, the name rules, the thresholds and the
tool version. Entries are plain JSON (never pickle: a cache folder arriving inside a colleague's
zip must not be able to run code) and any entry that does not load is ignored and recomputed.
Failing to write the cache (read-only media) is never an error.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd

from analyzer import __version__
from analyzer.align import NameRules, PairAlignment
from analyzer.compare import Comparison
from analyzer.graph import build_graph
from analyzer.outdir import atomic_write_text
from analyzer.reference import Plan
from analyzer.verdict import Thresholds

CACHE_DIR = ".layerdiff-cache"
KEEP = 4  # newest entries kept per folder
TUPLE_COLUMNS = ("base_shape", "other_shape")


def cache_key(plan: Plan, rules: NameRules, thresholds: Thresholds) -> str:
    runs = {id(r): r for p in plan.pairs for r in (p.base, p.other)}
    files = []
    for run in runs.values():
        st = run.path.stat()
        files.append([str(run.path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, run.label])
    identity = {
        "version": __version__, "files": sorted(files),
        "pairs": [[str(p.base.path.resolve()), str(p.other.path.resolve()), p.kind] for p in plan.pairs],
        "rules": [sorted(rules.name_map.items()), [[r.pattern, s] for r, s in rules.regex], rules.builtin],
        "thresholds": thresholds.as_dict(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cache_folder(plan: Plan) -> Path | None:
    """The dumps' common folder, unless that is a system-wide one like `/` or `/tmp` (no cache then)."""
    paths = [str(r.path.resolve().parent) for p in plan.pairs for r in (p.base, p.other)]
    common = Path(os.path.commonpath(paths))
    return common / CACHE_DIR if len(common.parts) >= 3 else None


def load(plan: Plan, key: str) -> Comparison | None:
    """The stored comparison for `key` attached to this plan, or None (absent, damaged, stale)."""
    folder = cache_folder(plan)
    if folder is None:
        return None
    path = folder / f"{key}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("key") != key or len(doc["alignments"]) != len(plan.pairs):
            return None
        alignments = [PairAlignment(**{part: _frame(a[part]) for part in ("matched", "only_base", "only_other")})
                      for a in doc["alignments"]]
        table = _frame(doc["table"])
        runs = {id(r): r for p in plan.pairs for r in (p.base, p.other)} | {id(plan.reference): plan.reference}
        graphs = {run.label: build_graph(run.layers) for run in runs.values()}
        os.utime(path)  # recently used entries survive the pruning
        return Comparison(plan=plan, table=table, alignments=alignments, graphs=graphs,
                          problems=[str(p) for p in doc["problems"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(comparison: Comparison, key: str) -> None:
    folder = cache_folder(comparison.plan)
    if folder is None:
        return
    doc = {"key": key, "table": _columns(comparison.table), "problems": comparison.problems,
           "alignments": [{part: _columns(getattr(a, part)) for part in ("matched", "only_base", "only_other")}
                          for a in comparison.alignments]}
    try:
        folder.mkdir(exist_ok=True)
        atomic_write_text(folder / f"{key}.json", json.dumps(doc, allow_nan=True, default=_plain))
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for stale in entries[KEEP:]:
            stale.unlink(missing_ok=True)
    except OSError:
        pass


def _columns(frame: pd.DataFrame) -> dict:
    return {"columns": list(frame.columns), "data": {c: frame[c].tolist() for c in frame.columns}}


def _frame(doc: dict) -> pd.DataFrame:
    data = dict(doc["data"])
    for column in TUPLE_COLUMNS:
        if column in data:
            data[column] = [tuple(v) for v in data[column]]
    return pd.DataFrame(data, columns=doc["columns"])


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")
