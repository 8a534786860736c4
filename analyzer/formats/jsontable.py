"""Tables and arrays as JSON a cache can hold: one column at a time, numbers as their bytes; big arrays as raw
bytes in a side file the JSON points into.

Stored measurements (analyzer/measure/resultcache.py) and dump headers (analyzer/runs/dumpheaders.py) keep
pandas tables in the user's cache. Entries are plain JSON (never pickle: a cache must not be able to run
code), written one column at a time (a 50,000-layer table is never a second time in memory as Python
lists); numeric columns are the base64 of their bytes (as JSON numbers they loaded as a Python float per
cell: 56 MB at 50,000 layers), texts as each distinct text once plus the rows' codes. Reading refuses
anything but these shapes (ValueError, TypeError or KeyError), so a damaged entry is ignored, never trusted.
"""
from __future__ import annotations

import base64
import binascii
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import orjson
import pandas as pd

TUPLE_COLUMNS = ("base_shape", "other_shape")
NUMERIC_KINDS = "iubf"
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def table_chunks(frame: pd.DataFrame) -> Iterator[bytes]:
    """{"columns": [...], "data": {column: cells}, "special": [...]}, one column serialized at a
    time. cells is {"dtype", "base64"} for a numeric column (NaN and infinities kept as bytes),
    {"strings", "codes"} for a column of texts, else a JSON list; "special" names the list columns
    holding NaN or infinities, written as {"f": "nan"|"inf"|"-inf"} (JSON has no such numbers; a
    dict is never a table cell, so no string can be mistaken for one)."""
    yield orjson.dumps({"columns": [str(c) for c in frame.columns]})[:-1] + b',"data":{'
    special = []
    for i, column in enumerate(frame.columns):
        data, nonfinite = _column_cells(frame[column])
        if nonfinite:
            special.append(str(column))
        yield (b"," if i else b"") + orjson.dumps(str(column)) + b":" + data
    yield b'},"special":' + orjson.dumps(special) + b"}"


def _column_cells(series: pd.Series) -> tuple[bytes, bool]:
    """A column's cells as JSON (see `_columns`), and whether it needed the non-finite encoding."""
    values = series.to_numpy()
    if values.dtype.kind in NUMERIC_KINDS:  # NaN and infinities included: bytes, not JSON numbers
        return orjson.dumps(packed(values)), False
    if len(values) and all(type(v) is str for v in values):  # each distinct text once, the rows as codes
        codes, texts = pd.factorize(values)
        return orjson.dumps({"strings": texts.tolist(), "codes": packed(codes.astype(np.int32))}), False
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


def table_frame(doc: dict) -> pd.DataFrame:
    data = doc["data"]
    for column, cells in data.items():
        if isinstance(cells, dict) and "strings" in cells:
            data[column] = _texts(cells)
        elif isinstance(cells, dict):
            data[column] = unpacked(cells)
    for column in doc["special"]:
        data[column] = [NON_FINITE[v["f"]] if isinstance(v, dict) else v for v in data[column]]
    for column in TUPLE_COLUMNS:
        if column in data:
            data[column] = [tuple(v) if isinstance(v, list) else v for v in data[column]]
    return pd.DataFrame(data, columns=doc["columns"])


def packed(values: np.ndarray) -> dict:
    values = np.ascontiguousarray(values)
    return {"dtype": values.dtype.str, "base64": base64.b64encode(values.tobytes()).decode("ascii")}


def array_ref(values: np.ndarray, offset: int) -> dict:
    """A kept array (a model output) as JSON: its dtype, shape and where its bytes start in the entry's
    side file of raw bytes (base64 in the JSON cost a changed `--task` 0.03 s to decode on a 608 x 800 detector)."""
    return {"dtype": values.dtype.str, "shape": [int(d) for d in values.shape], "offset": int(offset)}


def checked_array_ref(ref: dict, side_file: Path, side_bytes: int) -> dict:
    """A stored array's description, refused (the entry is then ignored) unless numeric, with a shape, and
    inside the side file's `side_bytes`; its bytes are read later, when a task asks for them."""
    dtype = np.dtype(ref["dtype"])
    shape = [int(d) for d in ref["shape"]]
    offset = int(ref["offset"])
    if dtype.kind not in NUMERIC_KINDS or any(d < 0 for d in shape) or offset < 0:
        raise ValueError("stored array is not a numeric array")
    if offset + math.prod(shape) * dtype.itemsize > side_bytes:
        raise ValueError("stored array's bytes are not all in its side file")
    return {"dtype": dtype.str, "shape": shape, "offset": offset, "file": str(side_file)}


def read_array_ref(ref: dict) -> np.ndarray:
    """A kept array back from its side file (OSError or ValueError when the file went meanwhile)."""
    dtype = np.dtype(ref["dtype"])
    count = math.prod(ref["shape"])
    values = np.fromfile(ref["file"], dtype=dtype, count=count, offset=ref["offset"])
    if values.size != count:
        raise ValueError(f"{ref['file']}: shorter than its entry says")
    return values.reshape(ref["shape"])


def _texts(cells: dict) -> np.ndarray:
    """A text column from its distinct texts and row codes: equal cells share one str (a str per
    cell was most of a stored 50,000-layer entry's memory)."""
    texts = np.empty(len(cells["strings"]), dtype=object)
    texts[:] = [str(t) for t in cells["strings"]]
    codes = unpacked(cells["codes"])
    if codes.dtype.kind not in "iu" or (codes.size and (int(codes.min()) < 0 or int(codes.max()) >= texts.size)):
        raise ValueError("stored text codes out of range")
    return texts[codes]


def unpacked(packed: dict) -> np.ndarray:
    """A numeric column from its stored bytes; any other type is refused (the entry is then ignored)."""
    dtype = np.dtype(packed["dtype"])
    if dtype.kind not in NUMERIC_KINDS:
        raise ValueError(f"stored column of type {dtype} is not numeric")
    raw = binascii.a2b_base64(packed["base64"], strict_mode=True)  # any other character refused, in one C pass
    return np.frombuffer(raw, dtype=dtype).copy()  # writable, like a measured column
