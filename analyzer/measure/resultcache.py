"""Measured comparisons kept in the user's layerdiff cache, so one set of runs is measured once.

A sweep ends with its own report, and users then often run `analyze` on the same runs (another
`-o`, `--json`): without this, every layer was read and measured twice. The expensive part of an
analysis, `layerdiff.analyzer.measure.compare.compare_all` (alignment + every metric of every layer), is stored as
one `results-<key>.json` entry of the cache that also holds conversions (`layerdiff.analyzer.importers.convcache`: the
user's private XDG cache directory, bounded least-recently-used first, shown and emptied by
`analyze cache`), and reused when the same dumps are analyzed with the same options. The entry also keeps
the model outputs a task decodes (`Comparison.outputs`: both sides of each run-vs-reference pair, up to
16 MiB each), so a changed `--task` re-judges without opening a tensor.

The key covers everything the measurement depends on: each dump's path, size, modification time
and inode (a rewritten dump gets a new key), the pairing, the name rules, the tolerances (atol, rtol: what the allclose share counts; the
thresholds only judge, so a changed threshold reuses the entry) and the
analyzer's own code (a hash of its sources, so a changed metric or alignment is never answered from
an entry measured by older code, even in a development install where the version stays the same). Entries are plain JSON (never pickle: a cache must not be able to run code), written
one column at a time (a 50,000-layer table is never a second time in memory as Python lists);
numeric columns are the base64 of their bytes (as JSON numbers they loaded as a Python float per
cell: 56 MB at 50,000 layers, over the memory bound of a whole analysis), and
any entry that does not load is ignored and recomputed. A cache that cannot be used (read-only,
owned by someone else) is never an error: the analysis just is not stored.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import orjson
import pandas as pd

from layerdiff.analyzer.importers import convcache
from layerdiff.analyzer.align.byname import NameRules, PairAlignment
from layerdiff.analyzer.measure.compare import Comparison
from layerdiff.errors import LayerdiffError
from layerdiff.analyzer.formats.atomic import atomic_write_chunks
from layerdiff.analyzer.formats.dumpformat import LAYER_COLUMNS
from layerdiff.analyzer.runs.reference import Plan
from layerdiff.analyzer.measure.metrics import Tolerances
from layerdiff.analyzer.measure.fingerprint import code_fingerprint
from layerdiff.analyzer.measure.storage import StorageEvidence

PREFIX = "results-"
FORMAT = 7  # 3: numeric columns as bytes; 4: rows measured, not judged (status `measured`); 5: storage evidence;
# 6: the model outputs a task decodes; 7: each run's /layers table
TUPLE_COLUMNS = ("base_shape", "other_shape")
NUMERIC_KINDS = "iubf"
LAYER_NAMES = tuple(name for name, _ in LAYER_COLUMNS)  # the /layers table as DumpFile reads it
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def cache_key(plan: Plan, rules: NameRules, tolerances: Tolerances) -> str:
    runs = {id(r): r for p in plan.pairs for r in (p.base, p.other)}
    files = []
    for run in runs.values():
        st = run.path.stat()
        files.append([str(run.path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, run.label])
    identity = {
        "code": code_fingerprint(), "files": sorted(files),
        "pairs": [[str(p.base.path.resolve()), str(p.other.path.resolve()), p.kind] for p in plan.pairs],
        "rules": [sorted(rules.name_map.items()), [[r.pattern, s] for r, s in rules.regex], rules.builtin],
        "tolerances": [tolerances.atol, tolerances.rtol],
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def entry_path(key: str) -> Path | None:
    """Where the entry for `key` lives, or None when the user's cache cannot be used."""
    try:
        return convcache.cache_dir() / f"{PREFIX}{key}.json"
    except (LayerdiffError, OSError):
        return None


def load(plan: Plan, key: str) -> Comparison | None:
    """The stored comparison for `key` attached to this plan, or None (absent, damaged, stale)."""
    path = entry_path(key)
    if path is None:
        return None
    try:
        doc = orjson.loads(path.read_bytes())
        if doc.get("key") != key or doc.get("format") != FORMAT or len(doc["alignments"]) != len(plan.pairs):
            return None
        alignments = [PairAlignment(**{part: _frame(a[part]) for part in ("matched", "only_base", "only_other")})
                      for a in doc["alignments"]]
        table = _frame(doc.pop("table"))
        convcache.touch(path)  # recently used entries survive the trimming
        storage = {str(label): StorageEvidence(*(int(v) for v in counts)) for label, counts in doc["storage"].items()}
        outputs = {(str(dump), int(order)): _checked_packed(packed) for dump, order, packed in doc["outputs"]}
        layers = {str(dump): _frame(columns) for dump, columns in doc["layers"]}
        for run in _plan_runs(plan):
            if str(run.path) in layers:
                run.dump.adopt_layers(layers[str(run.path)])
        return Comparison(plan=plan, table=table, alignments=alignments, graphs={},  # built when judging asks
                          problems=[str(p) for p in doc["problems"]], storage=storage, outputs=outputs)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None


def store(comparison: Comparison, key: str) -> None:
    path = entry_path(key)
    if path is None:
        return
    try:
        atomic_write_chunks(path, _document(comparison, key))
        convcache.trim(keep=path)
    except (OSError, LayerdiffError):
        pass


def _document(comparison: Comparison, key: str) -> Iterator[bytes]:
    head = {"key": key, "format": FORMAT, "problems": comparison.problems,
            "storage": {label: [e.informative, e.fp16_exact, e.bf16_exact] for label, e in comparison.storage.items()}}
    yield orjson.dumps(head)[:-1] + b',"alignments":['
    for i, alignment in enumerate(comparison.alignments):
        yield b"," if i else b""
        yield b'{"matched":'
        yield from _columns(alignment.matched)
        yield b',"only_base":'
        yield from _columns(alignment.only_base)
        yield b',"only_other":'
        yield from _columns(alignment.only_other)
        yield b"}"
    yield b'],"table":'
    yield from _columns(comparison.table)
    yield b',"layers":['
    for i, run in enumerate(_plan_runs(comparison.plan)):  # (dump file, its /layers table as read and checked)
        yield (b"," if i else b"") + b"[" + orjson.dumps(str(run.path)) + b","
        yield from _columns(run.layers[list(LAYER_NAMES)])
        yield b"]"
    yield b'],"outputs":['
    for i, ((dump, order), values) in enumerate(comparison.outputs.items()):  # (dump file, order, its values)
        packed = values if isinstance(values, dict) else packed_array(values)
        yield (b"," if i else b"") + orjson.dumps([dump, order, packed])
    yield b"]}"


def _plan_runs(plan: Plan) -> list:
    """Every run the plan compares or compares against, once each."""
    return list({id(r): r for p in plan.pairs for r in (p.base, p.other)}.values())


def _columns(frame: pd.DataFrame) -> Iterator[bytes]:
    """{"columns": [...], "data": {column: cells}, "special": [...]}, one column serialized at a
    time. cells is {"dtype", "base64"} for a numeric column (NaN and infinities kept as bytes),
    {"strings", "codes"} for a column of texts, else a JSON list; "special" names the list columns
    holding NaN or infinities, written as {"f": "nan"|"inf"|"-inf"} (JSON has no such numbers; a
    dict is never a table cell, so no string can be mistaken for one)."""
    yield orjson.dumps({"columns": [str(c) for c in frame.columns]})[:-1] + b',"data":{'
    special = []
    for i, column in enumerate(frame.columns):
        data, nonfinite = _column(frame[column])
        if nonfinite:
            special.append(str(column))
        yield (b"," if i else b"") + orjson.dumps(str(column)) + b":" + data
    yield b'},"special":' + orjson.dumps(special) + b"}"


def _column(series: pd.Series) -> tuple[bytes, bool]:
    """A column's cells as JSON (see `_columns`), and whether it needed the non-finite encoding."""
    values = series.to_numpy()
    if values.dtype.kind in NUMERIC_KINDS:  # NaN and infinities included: bytes, not JSON numbers
        return orjson.dumps(_packed(values)), False
    if len(values) and all(type(v) is str for v in values):  # each distinct text once, the rows as codes
        codes, texts = pd.factorize(values)
        return orjson.dumps({"strings": texts.tolist(), "codes": _packed(codes.astype(np.int32))}), False
    cells = [_plain(v) for v in values.tolist()]
    return orjson.dumps(cells), any(isinstance(v, dict) for v in cells)


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {"f": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if hasattr(value, "item"):
        return _plain(value.item())
    if isinstance(value, (tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool, list, dict)) or value is None:
        return value
    raise TypeError(f"not JSON: {type(value).__name__}")


def _frame(doc: dict) -> pd.DataFrame:
    data = doc["data"]
    for column, cells in data.items():
        if isinstance(cells, dict) and "strings" in cells:
            data[column] = _texts(cells)
        elif isinstance(cells, dict):
            data[column] = _unpacked(cells)
    for column in doc["special"]:
        data[column] = [NON_FINITE[v["f"]] if isinstance(v, dict) else v for v in data[column]]
    for column in TUPLE_COLUMNS:
        if column in data:
            data[column] = [tuple(v) if isinstance(v, list) else v for v in data[column]]
    return pd.DataFrame(data, columns=doc["columns"])


def _packed(values: np.ndarray) -> dict:
    values = np.ascontiguousarray(values)
    return {"dtype": values.dtype.str, "base64": base64.b64encode(values.tobytes()).decode("ascii")}


def packed_array(values: np.ndarray) -> dict:
    """A kept model output as JSON: its dtype, shape and bytes (base64); decoded only when a task asks."""
    return {**_packed(np.asarray(values).reshape(-1)), "shape": [int(d) for d in np.shape(values)]}


def unpacked_array(packed: dict) -> np.ndarray:
    """A kept model output back from `packed_array`."""
    return _unpacked(packed).reshape(packed["shape"])


def _checked_packed(packed: dict) -> dict:
    """A stored output's description, refused (the entry is then ignored) unless numeric with a shape
    that holds exactly its bytes; its bytes are decoded later, when a task asks for them."""
    dtype = np.dtype(packed["dtype"])
    shape = [int(d) for d in packed["shape"]]
    if dtype.kind not in NUMERIC_KINDS or any(d < 0 for d in shape) or not isinstance(packed["base64"], str):
        raise ValueError("stored output is not a numeric array")
    if len(packed["base64"]) != 4 * -(-math.prod(shape) * dtype.itemsize // 3):
        raise ValueError("stored output's bytes do not fill its shape")
    return {"dtype": packed["dtype"], "shape": shape, "base64": packed["base64"]}


def _texts(cells: dict) -> np.ndarray:
    """A text column from its distinct texts and row codes: equal cells share one str (a str per
    cell was most of a stored 50,000-layer entry's memory)."""
    texts = np.empty(len(cells["strings"]), dtype=object)
    texts[:] = [str(t) for t in cells["strings"]]
    codes = _unpacked(cells["codes"])
    if codes.dtype.kind not in "iu" or (codes.size and (int(codes.min()) < 0 or int(codes.max()) >= texts.size)):
        raise ValueError("stored text codes out of range")
    return texts[codes]


def _unpacked(packed: dict) -> np.ndarray:
    """A numeric column from its stored bytes; any other type is refused (the entry is then ignored)."""
    dtype = np.dtype(packed["dtype"])
    if dtype.kind not in NUMERIC_KINDS:
        raise ValueError(f"stored column of type {dtype} is not numeric")
    raw = binascii.a2b_base64(packed["base64"], strict_mode=True)  # any other character refused, in one C pass
    return np.frombuffer(raw, dtype=dtype).copy()  # writable, like a measured column
