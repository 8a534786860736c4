"""The HDF5 dump: the one contract between the collector and the analyzer (analyzer/FORMATS.md §2).

Everything that writes or reads a `.h5` dump goes through `DumpWriter` / `DumpFile`, so the format
has one definition. Layer names never become HDF5 paths (they contain `/`): tensors live under
`/tensors/<order>` and the `/layers` table maps orders to names.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import h5py
import numpy as np

from analyzer import __version__
from analyzer.diskspace import as_write_error, writing
from analyzer.errors import DumpFormatError
from analyzer.h5guard import local_dataset, local_group
from analyzer.limits import MAX_TENSOR_BYTES, check_tensor_bytes, checked_numel, human_bytes
from analyzer.tensorstats import TensorStats, tensor_stats
from analyzer.timestamps import utc_now  # noqa: F401  (re-exported: callers import it from here)

if TYPE_CHECKING:  # pandas costs ~0.5 s to import: engine children write dumps without it
    import pandas as pd

FORMAT_NAME = "dump"
FORMAT_VERSION = 1

_STR = h5py.string_dtype("utf-8")
LAYER_COLUMNS: list[tuple[str, Any]] = [
    ("order", np.int64),
    ("key", _STR),
    ("op", _STR),
    ("op_type", _STR),
    ("output_index", np.int64),
    ("name", _STR),
    ("inputs", _STR),
    ("shape", _STR),
    ("dtype", _STR),
    ("layout", _STR),
    ("memory", _STR),
    ("time_ms", np.float64),
    ("numel", np.int64),
    ("min", np.float64),
    ("max", np.float64),
    ("mean", np.float64),
    ("std", np.float64),
    ("n_nan", np.int64),
    ("n_posinf", np.int64),
    ("n_neginf", np.int64),
    ("n_zero", np.int64),
    ("n_fp16_overflow", np.int64),
    ("n_fp16_underflow", np.int64),
    ("n_fp16_saturated", np.int64),
]
_STRING_COLUMNS = [name for name, kind in LAYER_COLUMNS if kind is _STR]

# Root attributes every dump has, with the value used when a producer does not know it.
ROOT_DEFAULTS: dict[str, Any] = {
    "engine": "",
    "engine_version": "",
    "backend_requested": "",
    "backend_actual": "",
    "precision_requested": "",
    "precision_effective": "",
    "threads": 0,
    "device_serial": "",
    "device_model": "",
    "soc": "",
    "board": "",
    "abi": "",
    "android_release": "",
    "gpu": "",
    "model_name": "",
    "model_sha256": "",
    "input_label": "",
    "input_sha256": "",
    "infer_ms": math.nan,
    "harness": "",
    "repeat": 0,
    "exit_status": 0,
    "complete": True,
}


def tensor_key(op: str, output_index: int) -> str:
    """The alignment key of a tensor: `<op name>:<output index>`."""
    return f"{op}:{output_index}"


def partial_path(path: Path) -> Path:
    """Where a file is written before it is complete; renamed over `path` at the end."""
    return path.with_name(f".{path.name}.partial")


class DumpWriter:
    """Writes one HDF5 dump tensor by tensor; the file appears under its name only when closed.

    Use as a context manager: leaving the block by an exception deletes the partial file and leaves
    any existing file at `path` untouched.
    """

    def __init__(self, path: Path | str, attrs: dict[str, Any], *, compression: str | None = None,
                 expected_bytes: int = 0) -> None:
        self.path = Path(path)
        self._expected_bytes = expected_bytes  # for the "space needed" of a full-disk message
        self._partial = partial_path(self.path)
        self._compression = compression
        self._rows: list[dict[str, Any]] = []
        self._attrs = {**ROOT_DEFAULTS, **attrs}
        with writing(self.path):
            self._file = h5py.File(self._partial, "w")
        self._tensors = self._file.create_group("tensors")
        self._closed = False

    def __enter__(self) -> "DumpWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.close()
            except (OSError, RuntimeError) as err:
                self._fail(err)
        else:
            self.abort()
            if isinstance(exc, (OSError, RuntimeError)):
                self._fail(exc)

    def _fail(self, err: BaseException) -> None:
        """A full disk or read-only target becomes its one-line error (the partial file is gone)."""
        self.abort()
        error = as_write_error(err, self.path, self._expected_bytes)
        if error is not None:
            raise error from None

    def add_tensor(self, meta: dict[str, Any], array: np.ndarray) -> TensorStats:
        """Store one tensor and its stats row. `meta` carries the raw-dump tensor fields."""
        order = int(meta["order"])
        key = tensor_key(meta["op"], int(meta.get("output_index", 0)))
        self._create_dataset(self._tensors, str(order), array,
                             {"key": key, "name": str(meta.get("name", key)), "op": str(meta["op"])})
        stats = tensor_stats(array)
        self._rows.append(_layer_row(meta, key, array, stats))
        return stats

    def add_input(self, name: str, array: np.ndarray, sha256: str = "") -> None:
        group = self._file.require_group("inputs")
        self._create_dataset(group, str(len(group)), array, {"name": name, "sha256": sha256})

    def set_log(self, stderr: str) -> None:
        self._file.require_group("log").create_dataset("stderr", data=stderr, dtype=_STR)

    def update_attrs(self, attrs: dict[str, Any]) -> None:
        self._attrs.update(attrs)

    def close(self) -> Path:
        """Write the layer table and attributes, then atomically move the file into place."""
        if self._closed:
            return self.path
        self._write_layers()
        self._write_attrs()
        self._file.close()
        self._closed = True
        os.replace(self._partial, self.path)
        return self.path

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._file.close()
            except (OSError, RuntimeError):
                pass  # closing flushes; on a full disk that fails again, and the file is discarded anyway
            finally:
                self._partial.unlink(missing_ok=True)

    def _create_dataset(self, group: h5py.Group, name: str, array: np.ndarray, attrs: dict[str, str]) -> None:
        """One dataset and its string attributes. Uncompressed tensors go through h5py's low-level
        API (a few C calls): the high-level one spent ~0.7 ms per tensor in Python, which dominated
        writing a model with thousands of small layers."""
        array = np.ascontiguousarray(array) if array.ndim else np.asarray(array)  # 0-d stays 0-d
        if self._compression and array.size > 0 and array.ndim > 0:
            ds = group.create_dataset(name, data=array, chunks=True, compression=self._compression)
            for key, value in attrs.items():
                ds.attrs[key] = value
            return
        space = h5py.h5s.create_simple(array.shape) if array.ndim else h5py.h5s.create(h5py.h5s.SCALAR)
        dsid = h5py.h5d.create(group.id, name.encode(), _h5_type(array.dtype), space)
        if array.size:
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, array)
        for key, value in attrs.items():
            aid = h5py.h5a.create(dsid, key.encode(), _h5_type(_STR), _SCALAR)
            aid.write(np.array(value, dtype=_STR))

    def _write_layers(self) -> None:
        table = np.zeros(len(self._rows), dtype=np.dtype(LAYER_COLUMNS))
        for column, _ in LAYER_COLUMNS:
            table[column] = [row[column] for row in self._rows]
        self._file.create_dataset("layers", data=table)

    def _write_attrs(self) -> None:
        attrs = self._file.attrs
        attrs["layerdiff_format"] = FORMAT_NAME
        attrs["format_version"] = FORMAT_VERSION
        attrs["tool_version"] = __version__
        attrs["created"] = utc_now()
        provenance = dict(self._attrs.pop("provenance", {}) or {})
        for key, value in self._attrs.items():
            attrs[key] = _attr_value(value)
            provenance.setdefault(key, value)
        attrs["provenance"] = json.dumps(provenance, default=str, sort_keys=True)


_SCALAR = h5py.h5s.create(h5py.h5s.SCALAR)
_H5_TYPES: dict[np.dtype, Any] = {}


def _h5_type(dtype: np.dtype) -> Any:
    """The HDF5 type h5py itself would write for `dtype` (cached: building one costs ~50 us)."""
    if dtype not in _H5_TYPES:
        _H5_TYPES[dtype] = h5py.h5t.py_create(dtype, logical=True)
    return _H5_TYPES[dtype]


def _attr_value(value: Any) -> Any:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value
    if value is None:
        return ""
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value, default=str)
    return str(value)


def _layer_row(meta: dict[str, Any], key: str, array: np.ndarray, stats: TensorStats) -> dict[str, Any]:
    time_ms = meta.get("time_ms")
    return {
        "order": int(meta["order"]),
        "key": key,
        "op": str(meta["op"]),
        "op_type": str(meta.get("op_type", "")),
        "output_index": int(meta.get("output_index", 0)),
        "name": str(meta.get("name", key)),
        "inputs": json.dumps(list(meta.get("inputs", []))),
        "shape": json.dumps([int(d) for d in array.shape]),
        "dtype": str(array.dtype),
        "layout": str(meta.get("layout", "")),
        "memory": str(meta.get("memory", "host")),
        "time_ms": math.nan if time_ms is None else float(time_ms),
        **stats.as_dict(),
    }


class TensorBuffer:
    """Reusable memory for reading one tensor at a time (grows to the largest tensor read)."""

    def __init__(self) -> None:
        self._raw = np.empty(0, dtype=np.uint8)

    def view(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if self._raw.size < nbytes:
            self._raw = np.empty(nbytes, dtype=np.uint8)
        return self._raw[:nbytes].view(dtype).reshape(shape)


class DumpFile:
    """Read access to one HDF5 dump; opening reads only attributes, tensors load on demand."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self._file = h5py.File(self.path, "r")
        except FileNotFoundError:
            raise DumpFormatError(f"{self.path}: no such file") from None
        except OSError as err:
            raise DumpFormatError(f"{self.path}: not a readable HDF5 file ({_short(err)})") from None
        try:
            self._check_format()
        except Exception:
            self._file.close()
            raise
        _small_metadata_cache(self._file)
        self._layers: "pd.DataFrame | None" = None
        self._fast = _FastReader(self._file)
        self._declared: dict[int, tuple[str, str]] | None = None

    def __enter__(self) -> "DumpFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._fast.close()
        self._file.close()

    def _check_format(self) -> None:
        attrs = self._file.attrs
        fmt = _as_str(attrs.get("layerdiff_format", ""))
        if fmt != FORMAT_NAME:
            raise DumpFormatError(f"{self.path}: not a layerdiff dump (no layerdiff_format='dump' attribute)")
        raw_version = attrs.get("format_version", 0)
        try:
            version = int(raw_version)
        except (TypeError, ValueError):
            raise DumpFormatError(f"{self.path}: format_version {raw_version!r} is not an integer") from None
        if version > FORMAT_VERSION:
            raise DumpFormatError(
                f"{self.path}: dump format version {version} is newer than this layerdiff reads "
                f"({FORMAT_VERSION}); upgrade layerdiff"
            )
        layers = local_dataset(self._file, "layers", self.path, "/layers")
        self._tensors = local_group(self._file, "tensors", self.path, "/tensors")
        if layers is None or self._tensors is None:
            raise DumpFormatError(f"{self.path}: dump lacks its /layers table or /tensors group (file truncated?)")
        self._bounded(layers, "/layers")

    @property
    def attrs(self) -> dict[str, Any]:
        """Root attributes as plain Python values, with defaults for ones an older writer omitted."""
        out = dict(ROOT_DEFAULTS)
        for key, value in self._file.attrs.items():
            out[key] = _plain(value)
        return out

    @property
    def provenance(self) -> dict[str, Any]:
        raw = _as_str(self._file.attrs.get("provenance", "{}"))
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise DumpFormatError(f"{self.path}: provenance attribute is not valid JSON") from None
        return value if isinstance(value, dict) else {}

    @property
    def complete(self) -> bool:
        return bool(self.attrs.get("complete", True))

    @property
    def layers(self) -> "pd.DataFrame":
        """The per-tensor table (one row per tensor, execution order), strings decoded."""
        if self._layers is None:
            self._layers = _read_layers(self._file["layers"], self.path)
            for order, shape in zip(self._layers["order"], self._layers["shape"]):
                _check_shape_cell(shape, f"{self.path}: /layers row {order}")
        return self._layers

    def tensor(self, order: int, buffer: "TensorBuffer | None" = None) -> np.ndarray:
        """One tensor by execution order, refusing sizes no real layer has before allocating.

        With a `buffer`, the tensor is read into memory the buffer reuses across calls (the view
        returned is valid until the buffer's next read): streaming a dump then costs no page faults.
        """
        if buffer is not None:
            fast = self._fast.read(int(order), self._table_shape(int(order)), buffer)
            if fast is not None:
                return fast
        ds = self._dataset(order)
        try:
            if buffer is not None and ds.size > 0 and ds.chunks is None and ds.compression is None:
                out = buffer.view(ds.shape, ds.dtype)
                ds.read_direct(out)
                return out
            return ds[()]
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
            raise DumpFormatError(f"{self.path}: tensor {order} is unreadable ({_short(err)})") from None

    def _table_shape(self, order: int) -> tuple[tuple[int, ...], str] | None:
        """(shape, dtype) the /layers table declares for `order`, or None when it does not parse."""
        if self._declared is None:
            layers = self.layers
            self._declared = dict(zip((int(o) for o in layers["order"]), zip(layers["shape"], layers["dtype"])))
        entry = self._declared.get(order)
        if entry is None:
            return None
        try:
            shape = tuple(int(d) for d in json.loads(entry[0]))
        except (ValueError, TypeError):
            return None
        return shape, entry[1]

    def sample(self, order: int, count: int) -> np.ndarray:
        """About `count` elements of a tensor's flat view at evenly spread positions, as float64.

        Plots need a few thousand points of a layer; materialising a 64M-element layer as float64 to
        pick them would cost seconds and several times the layer in memory. Contiguous datasets are
        read in a few hundred short blocks at fixed, evenly spaced flat offsets (the same offsets for
        any two tensors of the same size, so a reference and a run stay paired element by element);
        other layouts are read one chunk at a time.
        """
        ds = self._dataset(order)
        n = int(ds.size)
        if n <= count:
            return np.asarray(ds[()], dtype=np.float64).reshape(-1)
        blocks = min(count, 256)
        per_block = max(1, count // blocks)
        starts = np.linspace(0, n - per_block, blocks).astype(np.int64)
        try:
            picked = self._fast.blocks(ds, starts, per_block)
            if picked is None:
                picked = _blocks_by_chunks(ds, starts, per_block)
        except (OSError, RuntimeError, ValueError, TypeError) as err:
            raise DumpFormatError(f"{self.path}: tensor {order} is unreadable ({_short(err)})") from None
        return picked.astype(np.float64)

    def _dataset(self, order: int) -> h5py.Dataset:
        name = str(int(order))
        where = f"/tensors/{name}"
        if self._tensors.get(name, getlink=True) is None:
            raise DumpFormatError(f"{self.path}: tensor {order} is listed but missing from /tensors")
        ds = local_dataset(self._tensors, name, self.path, where)
        if ds is None or ds.dtype.kind not in "fiub":
            raise DumpFormatError(f"{self.path}: tensor {order} is not a numeric dataset")
        return self._bounded(ds, f"{where} (layer {_as_str(ds.attrs.get('key', name))})")

    def _bounded(self, ds: h5py.Dataset, where: str) -> h5py.Dataset:
        """`ds`, once its declared size is known to fit the limit and the bytes the file stores."""
        nbytes = check_tensor_bytes(ds.shape, ds.dtype.itemsize, f"{self.path}: {where} {tuple(ds.shape)}")
        if _implausibly_sparse(ds, nbytes):
            raise DumpFormatError(
                f"{self.path}: {where} declares {human_bytes(nbytes)} but stores only "
                f"{human_bytes(ds.id.get_storage_size())} (truncated or crafted file)"
            )
        return ds

    def tensor_by_key(self, key: str) -> np.ndarray:
        rows = self.layers.index[self.layers["key"] == key]
        if len(rows) == 0:
            raise DumpFormatError(f"{self.path}: no layer {key!r}")
        return self.tensor(int(self.layers.loc[rows[0], "order"]))

    def inputs(self) -> Iterator[tuple[str, np.ndarray]]:
        """The model inputs the run was fed (checked like tensors: local, numeric, bounded)."""
        group = local_group(self._file, "inputs", self.path, "/inputs")
        if group is None:
            return
        for name in sorted(group, key=_input_order):
            where = f"/inputs/{name}"
            ds = local_dataset(group, name, self.path, where)
            if ds is None or ds.dtype.kind not in "fiub":
                raise DumpFormatError(f"{self.path}: {where} is not a numeric dataset")
            self._bounded(ds, where)
            try:
                yield _as_str(ds.attrs.get("name", name)), ds[()]
            except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
                raise DumpFormatError(f"{self.path}: {where} is unreadable ({_short(err)})") from None

    def stderr(self) -> str:
        group = local_group(self._file, "log", self.path, "/log")
        ds = None if group is None else local_dataset(group, "stderr", self.path, "/log/stderr")
        if ds is None:
            return ""
        if ds.shape != () or ds.dtype.kind not in "OSU" or ds.id.get_storage_size() > MAX_LOG_BYTES:
            raise DumpFormatError(f"{self.path}: /log/stderr is not a text of at most {human_bytes(MAX_LOG_BYTES)}")
        try:
            return _as_str(ds[()])
        except (OSError, RuntimeError, ValueError, TypeError) as err:
            raise DumpFormatError(f"{self.path}: /log/stderr is unreadable ({_short(err)})") from None


MAX_LOG_BYTES = 64 << 20


def _input_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def _check_shape_cell(cell: str, where: str) -> None:
    try:
        shape = json.loads(cell)
    except ValueError:
        raise DumpFormatError(f"{where}: shape {cell[:40]!r} is not a JSON list") from None
    if not isinstance(shape, list):
        raise DumpFormatError(f"{where}: shape {cell[:40]!r} is not a JSON list")
    checked_numel(shape, where)


def _small_metadata_cache(file: h5py.File) -> None:
    """Cap HDF5's metadata cache at 2 MiB. Its default grows to 32 MiB per file, and an analysis
    visits each dataset once, so the cache only added ~40 MB of RSS per dump of 10,000 layers."""
    try:
        config = file.id.get_mdc_config()
        config.set_initial_size, config.initial_size = True, 1 << 20
        config.min_size, config.max_size = 1 << 20, 2 << 20
        config.incr_mode = config.flash_incr_mode = 0
        file.id.set_mdc_config(config)
    except (AttributeError, RuntimeError, ValueError):
        pass  # an h5py without the call: the default cache is only bigger


class _FastReader:
    """Reads contiguous, uncompressed tensors with one dataset open and one `pread` each.

    h5py's high-level access costs several lookups per tensor (group, name, shape, dtype, layout),
    which at 10,000 small layers was most of an analysis. A contiguous dataset's bytes sit at one
    file offset, so after one low-level open the read is a plain `pread` into the reused buffer.
    The /layers table's shape is trusted only when the dataset's type equals the declared dtype and
    its stored byte count equals shape x itemsize; anything else (chunked, compressed, external
    storage, links, other types, sizes that do not add up) returns None and takes the checked h5py path.
    """

    def __init__(self, file: h5py.File) -> None:
        group = file.get("tensors")
        self._group = group.id if isinstance(group, h5py.Group) else None
        self._filename = file.filename
        self._fd: int | None = None
        self._types: dict[str, tuple[np.dtype, Any] | None] = {}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, order: int, declared: tuple[tuple[int, ...], str] | None,
             buffer: "TensorBuffer") -> np.ndarray | None:
        if declared is None or self._group is None:
            return None
        shape, dtype_name = declared
        kind = self._type(dtype_name)
        if kind is None:
            return None
        dtype, type_id = kind
        name = str(order).encode()
        try:
            if self._group.links.get_info(name).type != h5py.h5l.TYPE_HARD:
                return None  # links are refused on the checked path (analyzer.h5guard)
            dsid = h5py.h5d.open(self._group, name)
            offset = dsid.get_offset()
            nbytes = math.prod(shape) * dtype.itemsize
            if (offset is None or nbytes == 0 or nbytes > MAX_TENSOR_BYTES or dsid.get_storage_size() != nbytes
                    or not dsid.get_type().equal(type_id)):
                return None
            out = buffer.view(shape, dtype)
            return out if self._pread(out, offset) else None
        except (KeyError, OSError, RuntimeError, ValueError, TypeError):
            return None

    def blocks(self, ds: h5py.Dataset, starts: np.ndarray, length: int) -> np.ndarray | None:
        """`length` elements at each flat start, for a contiguous dataset of a plain type (else None)."""
        offset = ds.id.get_offset()
        dtype = ds.dtype
        if offset is None or dtype.kind not in "fiub" or ds.id.get_storage_size() != ds.size * dtype.itemsize:
            return None
        out = np.empty((len(starts), length), dtype=dtype)
        for row, start in zip(out, starts):
            if not self._pread(row, offset + int(start) * dtype.itemsize):
                return None
        return out.reshape(-1)

    def _pread(self, out: np.ndarray, offset: int) -> bool:
        if self._fd is None:
            self._fd = os.open(self._filename, os.O_RDONLY)
        view = memoryview(out.reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:done + (1 << 30)]], offset + done)
            if got <= 0:
                return False
            done += got
        return True

    def _type(self, name: str) -> tuple[np.dtype, Any] | None:
        if name not in self._types:
            try:
                dtype = np.dtype(name)
                self._types[name] = (dtype, h5py.h5t.py_create(dtype)) if dtype.kind in "fiub" else None
            except (TypeError, ValueError):
                self._types[name] = None
        return self._types[name]


def _blocks_by_chunks(ds: h5py.Dataset, starts: np.ndarray, length: int) -> np.ndarray:
    """The same flat blocks as `_FastReader.blocks`, for chunked or compressed datasets: the tensor
    is read one slab along its first non-unit axis at a time (bounded memory), never whole."""
    if ds.ndim == 0:
        return np.asarray(ds[()]).reshape(-1)
    axis = next((i for i, d in enumerate(ds.shape) if d > 1), ds.ndim - 1)
    per_row = int(np.prod(ds.shape[axis + 1:], dtype=np.int64))
    rows_per_read = max(1, (16 << 20) // max(1, per_row * ds.dtype.itemsize))
    wanted = (starts[:, None] + np.arange(length)[None, :]).reshape(-1)
    out = np.empty(wanted.size, dtype=ds.dtype)
    for first in range(0, ds.shape[axis], rows_per_read):
        lo, hi = first * per_row, min(ds.shape[axis], first + rows_per_read) * per_row
        hit = (wanted >= lo) & (wanted < hi)
        if hit.any():
            slab = ds[(0,) * axis + (slice(first, first + rows_per_read),)].reshape(-1)
            out[hit] = slab[wanted[hit] - lo]
    return out


def _implausibly_sparse(ds: h5py.Dataset, nbytes: int) -> bool:
    """A dataset declaring far more bytes than it stores (beyond any compression ratio) is a trap:
    reading it would allocate the declared size. Real dumps store what they declare."""
    if nbytes < (64 << 20):
        return False
    try:
        stored = ds.id.get_storage_size()
    except (OSError, RuntimeError, ValueError):
        return True
    return stored * 1100 < nbytes


def _read_layers(ds: h5py.Dataset, path: Path) -> "pd.DataFrame":
    import pandas as pd

    try:
        table = ds[()]
    except (OSError, RuntimeError, KeyError, ValueError) as err:
        raise DumpFormatError(f"{path}: /layers table is unreadable ({_short(err)})") from None
    names = table.dtype.names or ()
    missing = [c for c, _ in LAYER_COLUMNS if c not in names]
    if missing:
        raise DumpFormatError(f"{path}: /layers table lacks columns {', '.join(missing)}")
    frame = pd.DataFrame({c: table[c] for c, _ in LAYER_COLUMNS})
    for column in _STRING_COLUMNS:
        frame[column] = _decoded(frame[column])
    return frame


def _decoded(cells: Any) -> list[str]:
    """A string column's cells as str, equal cells sharing one object: op types, dtypes, layouts and
    shapes repeat across layers, and a str per cell was ~40 MB at 50,000 layers."""
    seen: dict[Any, str] = {}
    out = []
    for cell in cells:
        if not isinstance(cell, (bytes, str)):
            out.append(_as_str(cell))
            continue
        text = seen.get(cell)
        if text is None:
            text = seen[cell] = _as_str(cell)
        out.append(text)
    return out


def _as_str(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _as_str(value.item())
    return str(value)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _short(err: BaseException) -> str:
    return str(err).splitlines()[0][:160] if str(err) else type(err).__name__
