"""Dump headers kept in the user's cache, so that a re-judged analysis opens no HDF5 file.

Changing a threshold or `--task` re-judges a stored measurement (analyzer/measure/resultcache.py). What it
still needs of each dump is its root attributes and its /layers table, and for the report's focus chart a
few thousand values of two tensors. Reading those through HDF5 meant loading h5py and opening every file,
about a tenth of a re-judged analysis. A `DumpHeader` (analyzer/formats/dumpfile.py) holds them, with the
file offset of each contiguous tensor and the model inputs' shapes (a task reads an image's size). A dump that
records no engine facts is read with what its engine declares; the entry keeps that declaration too, so reading
it again imports no engine registry. It is kept here, one entry per file, beside the stored measurements
in the same bounded cache (`analyze cache` shows and empties it).

The key is the file's resolved path, size, modification and change times, inode and device, and the
analyzer's code. A rewritten, touched, replaced or moved file, or another layerdiff, is read through HDF5
again. The change time cannot be set back by anyone writing the file, so equal keys mean the bytes the
header describes are still the file's. Entries are plain JSON (analyzer/formats/jsontable.py). An entry that
does not load is ignored, and a cache that cannot be used is never an error: the dump is then read from
HDF5, as without this module.
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

import orjson

from layerdiff.analyzer.formats.atomic import atomic_write_chunks
from layerdiff.analyzer.formats.dumpfile import DumpHeader
from layerdiff.analyzer.formats.enginefacts import declared_text, reads_declaration, remember_declared
from layerdiff.analyzer.formats.fingerprint import code_fingerprint
from layerdiff.analyzer.formats.jsontable import NON_FINITE, table_chunks, table_frame
from layerdiff.analyzer.importers import convcache
from layerdiff.errors import LayerdiffError

PREFIX = "header-"
FORMAT = 1


def entry_path(path: Path) -> Path | None:
    """Where the header of the file at `path`, as it is now, is kept; None when the file or the cache
    cannot be used."""
    try:
        st = os.stat(path)
        identity = [str(Path(path).resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                    code_fingerprint(), FORMAT]
        key = hashlib.sha256(orjson.dumps(identity)).hexdigest()[:32]
        return convcache.cache_dir() / f"{PREFIX}{key}.json"
    except (LayerdiffError, OSError):
        return None


def load(path: Path) -> DumpHeader | None:
    """The header kept for this very file, or None (none kept, the file changed, the entry damaged)."""
    entry = entry_path(path)
    if entry is None or not entry.is_file():
        return None
    try:
        doc = orjson.loads(entry.read_bytes())
        if doc.get("format") != FORMAT or doc.get("entry") != entry.name or not isinstance(doc["attrs"], dict):
            return None
        attrs = {str(name): _decoded(value) for name, value in doc["attrs"].items()}
        offsets = {int(order): int(offset) for order, offset in doc["offsets"].items()}
        if any(offset < 0 for offset in offsets.values()):
            return None
        shapes = doc["inputs"]
        if shapes is not None:
            shapes = [(str(name), tuple(int(d) for d in shape)) for name, shape in shapes]
        header = DumpHeader(attrs, table_frame(doc["layers"]), offsets, shapes)
        if isinstance(doc.get("declared"), str):
            remember_declared(str(attrs.get("engine", "") or ""), doc["declared"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    convcache.touch(entry)  # recently used entries survive the trimming
    return header


def store(path: Path, header: DumpHeader, trim: bool = True) -> Path | None:
    """Keep `header` for the file at `path` (returns its entry, None when not kept). Attributes that JSON does not
    carry exactly (a tuple, a NaN inside a list) keep no header: the file is then read from HDF5 each time, as
    without this module. `trim=False` leaves the cache's bound to the caller (one trim for many headers)."""
    entry = entry_path(path)
    if entry is None:
        return None
    try:
        encoded = {name: _encoded(value) for name, value in header.attrs.items()}
        attrs = orjson.dumps(encoded)
        if orjson.loads(attrs) != encoded:
            return None
        offsets = orjson.dumps({str(order): offset for order, offset in header.offsets.items()})
        shapes = None if header.input_shapes is None else [[name, list(shape)] for name, shape in header.input_shapes]
        declared = b""
        if header.attrs.get("engine") and reads_declaration(header.attrs):  # read with its engine's declaration
            text = declared_text(str(header.attrs["engine"]))
            declared = b'"declared":%s,' % orjson.dumps(text) if text is not None else b""
        head = b'{"format":%d,"entry":%s,"attrs":%s,"offsets":%s,"inputs":%s,%s"layers":' % (
            FORMAT, orjson.dumps(entry.name), attrs, offsets, orjson.dumps(shapes), declared)
        atomic_write_chunks(entry, [head, *table_chunks(header.layers), b"}"])
        if trim:
            convcache.trim(keep=entry)
        return entry
    except (OSError, LayerdiffError, TypeError, ValueError):
        return None


def store_all(headers: list[tuple[Path, DumpHeader]]) -> None:
    """`store` each, then bound the cache once (a trim reads the whole cache folder: once per dump of a
    200-input data set was 200 reads of it)."""
    kept = [entry for path, header in headers if (entry := store(path, header, trim=False)) is not None]
    if kept:
        try:
            convcache.trim(keep=kept[-1], added=kept)
        except (OSError, LayerdiffError):
            pass


def _encoded(value: Any) -> Any:
    """An attribute for JSON: a non-finite float (`infer_ms` of a run that timed nothing is NaN) as {"f": ...};
    an attribute is never a dict, so the marker cannot be mistaken for one."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"f": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    return value


def _decoded(value: Any) -> Any:
    return NON_FINITE[value["f"]] if isinstance(value, dict) else value
