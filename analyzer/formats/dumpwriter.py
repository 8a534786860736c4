"""Writing an HDF5 dump: `DumpWriter`, tensor by tensor, the file appearing only when complete."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from layerdiff.analyzer import __version__
from layerdiff.analyzer.formats.diskspace import (SpaceGuard, as_write_error, hdf5_write_failed, is_no_space,
                                                  keep_unreleased, note_hdf5_write_failure,
                                                  quiet_hdf5_release_failures, writing)
from layerdiff.analyzer.formats.dumpformat import FORMAT_MINOR, FORMAT_NAME, FORMAT_VERSION, LAYER_COLUMNS, ROOT_DEFAULTS, STRING_DTYPE, partial_path, tensor_key
from layerdiff.analyzer.formats.tensorstats import TensorStats, tensor_stats
from layerdiff.analyzer.formats.timestamps import utc_now

if TYPE_CHECKING:
    from layerdiff.analyzer.formats.sketchformat import TensorSummary


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
        self._space = SpaceGuard(self.path, expected_bytes)
        quiet_hdf5_release_failures()
        with writing(self.path):
            self._space.reserve(0)
            self._file = h5py.File(self._partial, "w")
        self._groups: dict[str, Any] = {}  # low-level ids of the groups made so far, by name
        self._held: list[tuple[int, "TensorSummary"]] = []  # summaries of tensors held whole, written at close
        self._held_bytes = 0
        self._tensors = self._group("tensors")
        self._closed = False

    def __enter__(self) -> "DumpWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.close()
            except (OSError, RuntimeError) as err:
                self._fail(err)
                raise
        else:
            self.abort()
            if isinstance(exc, (OSError, RuntimeError)):
                self._fail(exc)

    def _fail(self, err: BaseException) -> None:
        """A full disk or read-only target becomes its one-line error (the partial file is gone).

        A refusal of our own space check (`checked`) left HDF5 intact; a write HDF5 itself saw fail
        did not, and the process must then end without the library's exit clean-up."""
        checked = getattr(err, "checked", False)
        if not checked and is_no_space(err):
            note_hdf5_write_failure()
        self.abort()
        if checked:  # the free space said once the partial file is gone
            raise self._space.error(err.need) from None
        error = as_write_error(err, self.path, max(self._expected_bytes, self._space.written))
        if error is not None:
            raise error from None

    def add_tensor(self, meta: dict[str, Any], array: np.ndarray) -> TensorStats:
        """Store one tensor and its stats row. `meta` carries the raw-dump tensor fields."""
        order = int(meta["order"])
        key = tensor_key(meta["op"], int(meta.get("output_index", 0)))
        self._create_dataset(self._tensors, str(order), array, {})  # key, name and op: its /layers row
        stats = tensor_stats(array)
        self._rows.append(_layer_row(meta, key, array, stats))
        return stats

    def add_estimated(self, meta: dict[str, Any], summary: "TensorSummary") -> None:
        """A tensor left on the device, known by its summary alone (a sketch-first collection): its /layers row
        (statistics from the summary) and `/summaries/<order>` (sketch and sample), no `/tensors/<order>`."""
        order = int(meta["order"])
        key = tensor_key(meta["op"], int(meta.get("output_index", 0)))
        self.add_summary(order, summary, key)
        shape = tuple(int(d) for d in meta["shape"])
        self._rows.append(_layer_row(meta, key, _Declared(shape, summary.dtype), summary_stats(summary)))

    def add_summary(self, order: int, summary: "TensorSummary", key: str = "") -> None:
        """`/summaries/<order>`: a tensor's sketch and sample (FORMATS.md §2); without `/tensors/<order>` the
        tensor is estimated, beside it the summary spares a sketch-first comparison from sketching it again."""
        self._check_space(summary.sketch.nbytes + summary.sample.nbytes, len(key or summary.name))
        group = h5py.h5g.create(self._group("summaries"), str(int(order)).encode())
        self._create_dataset(group, "sketch", summary.sketch, {}, compress=False)
        self._create_dataset(group, "sample", summary.sample, {}, compress=False)
        _write_attr(group, "key", key or summary.name)

    def hold_summary(self, order: int, summary: "TensorSummary") -> None:
        """The summary of a tensor held whole (it spares a later sketch-first comparison sketching the tensor):
        kept until the file closes and written with the others in five `/summaries/held_*` datasets
        (FORMATS.md §2), where a group and two datasets per tensor cost more than converting a small tensor.
        Beyond `HELD_SUMMARY_BYTES` buffered (memory stays bounded), the rest go to `/summaries/<order>`."""
        from layerdiff.analyzer.formats.sketchformat import BUCKETS

        sketch, sample = np.asarray(summary.sketch), np.asarray(summary.sample)
        if (self._held_bytes + sketch.nbytes + sample.nbytes > HELD_SUMMARY_BYTES or sketch.shape != (BUCKETS,)
                or sketch.dtype != np.float64 or sample.ndim != 1 or sample.dtype.kind not in "fiu"):
            self.add_summary(order, summary)
            return
        self._held.append((int(order), summary))
        self._held_bytes += sketch.nbytes + sample.nbytes

    def add_input(self, name: str, array: np.ndarray, sha256: str = "") -> None:
        group = self._group("inputs")
        self._create_dataset(group, str(group.get_num_objs()), array, {"name": name, "sha256": sha256})

    def add_fed_input(self, name: str, array: np.ndarray, layout: str, axes: tuple[int, ...]) -> None:
        """An input as the engine received it (read back after feeding): `/inputs_fed/<i>`."""
        group = self._group("inputs_fed")
        self._create_dataset(group, str(group.get_num_objs()), array,
                             {"name": name, "layout": layout, "axes": json.dumps([int(a) for a in axes])})

    def add_plain_output(self, key: str, name: str, array: np.ndarray) -> None:
        """One output of the plain run (the model run without observation, FORMATS.md §2 `/plain_outputs`)."""
        group = self._group("plain_outputs")
        self._create_dataset(group, str(group.get_num_objs()), array, {"key": key, "name": name})

    def set_log(self, stderr: str) -> None:
        self._check_space(len(stderr.encode("utf-8", "replace")), 0)
        self._create_dataset(self._group("log"), "stderr", np.array(stderr, dtype=STRING_DTYPE), {}, compress=False)

    def update_attrs(self, attrs: dict[str, Any]) -> None:
        self._attrs.update(attrs)

    def close(self) -> Path:
        """Write the layer table and attributes, then atomically move the file into place."""
        if self._closed:
            return self.path
        self._write_held_summaries()
        self._write_layers()
        self._write_attrs()
        self._space.before_close()  # a flush that fails inside HDF5 crashes the library (SIGSEGV)
        self._file.close()
        self._closed = True
        os.replace(self._partial, self.path)
        return self.path

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                if hdf5_write_failed():  # after a failed write the library cannot close the file safely:
                    keep_unreleased(self._file)  # it is left to the process's end (exit_now_if_hdf5_failed)
                else:
                    self._file.close()
            except (OSError, RuntimeError):
                pass  # closing flushes; on a full disk that fails again, and the file is discarded anyway
            finally:
                self._partial.unlink(missing_ok=True)

    def _group(self, name: str) -> Any:
        """The low-level id of the root's group `name`, made on first use."""
        if name not in self._groups:
            self._groups[name] = h5py.h5g.create(self._file.id, name.encode())
        return self._groups[name]

    def _create_dataset(self, group: Any, name: str, array: np.ndarray, attrs: dict[str, str], *,
                        compress: bool = True) -> None:
        """One dataset of the low-level `group` and its string attributes. Uncompressed data goes through
        h5py's low-level API (a few C calls): the high-level one spent ~0.4-0.7 ms per dataset in Python,
        which dominated writing a model with thousands of small layers, and a data set's many small runs."""
        array = np.ascontiguousarray(array) if array.ndim else np.asarray(array)  # 0-d stays 0-d
        self._check_space(array.nbytes, sum(len(v) for v in attrs.values()) + len(name))
        if compress and self._compression and array.size > 0 and array.ndim > 0:
            ds = h5py.Group(group).create_dataset(name, data=array, chunks=True, compression=self._compression)
            for key, value in attrs.items():
                ds.attrs[key] = value
            return
        space = h5py.h5s.create_simple(array.shape) if array.ndim else h5py.h5s.create(h5py.h5s.SCALAR)
        dsid = h5py.h5d.create(group, name.encode(), _h5_type(array.dtype), space)
        if array.size:
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, array)
        for key, value in attrs.items():
            _write_attr(dsid, key, value)

    def _check_space(self, raw: int, strings: int) -> None:
        """Refuse before HDF5 writes, while the file can still be closed (see SpaceGuard)."""
        try:
            self._space.reserve(raw, strings)
        except OSError as err:
            err.checked, err.need = True, raw  # ours, not HDF5's: the library is intact
            raise

    def _write_held_summaries(self) -> None:
        """`/summaries/held_*`: the held tensors' orders, sketches (one row each), and samples as their bytes
        one after another (offsets and dtype names beside them: every dtype kept exactly)."""
        if not self._held:
            return
        group = self._group("summaries")
        samples = [np.ascontiguousarray(summary.sample) for _, summary in self._held]
        offsets = np.zeros(len(samples) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([sample.nbytes for sample in samples])
        data = {
            "held_orders": np.array([order for order, _ in self._held], dtype=np.int64),
            "held_sketches": np.stack([summary.sketch for _, summary in self._held]).astype(np.float64, copy=False),
            "held_samples": np.frombuffer(b"".join(sample.tobytes() for sample in samples), dtype=np.uint8),
            "held_sample_offsets": offsets,
            "held_sample_dtypes": np.array([sample.dtype.name for sample in samples], dtype=STRING_DTYPE),
        }
        for name, array in data.items():
            self._create_dataset(group, name, array, {}, compress=False)
        self._held = []

    def _write_layers(self) -> None:
        table = np.zeros(len(self._rows), dtype=np.dtype(LAYER_COLUMNS))
        self._check_space(table.nbytes, 0)
        for column, _ in LAYER_COLUMNS:
            table[column] = [row[column] for row in self._rows]
        self._create_dataset(self._file.id, "layers", table, {}, compress=False)

    def _write_attrs(self) -> None:
        """The root attributes, each written once (an attribute written twice costs a delete)."""
        own = {"layerdiff_format": FORMAT_NAME, "format_version": FORMAT_VERSION, "format_minor": FORMAT_MINOR}
        attrs: dict[str, Any] = {**own, "tool_version": __version__, "created": utc_now()}
        provenance = dict(self._attrs.pop("provenance", {}) or {})
        for key, value in self._attrs.items():
            if key not in own:  # a file re-written (relabelled, imported) is of this writer's format, not its source's
                attrs[key] = _attr_value(value)
            provenance.setdefault(key, value)
        attrs["provenance"] = json.dumps(provenance, default=str, sort_keys=True)
        root = h5py.h5g.open(self._file.id, b"/")
        for key, value in attrs.items():
            _write_attr(root, key, value)


HELD_SUMMARY_BYTES = 32 << 20  # summaries of tensors held whole buffered until the file closes, at most
_SCALAR = h5py.h5s.create(h5py.h5s.SCALAR)
_H5_TYPES: dict[np.dtype, Any] = {}


def _h5_type(dtype: np.dtype) -> Any:
    """The HDF5 type h5py itself would write for `dtype` (cached: building one costs ~50 us)."""
    if dtype not in _H5_TYPES:
        _H5_TYPES[dtype] = h5py.h5t.py_create(dtype, logical=True)
    return _H5_TYPES[dtype]


def _write_attr(obj: Any, key: str, value: Any) -> None:
    """One scalar attribute of the low-level object `obj`, typed as h5py's `attrs[key] = value` types it (a str
    is a UTF-8 variable-length string, a bool h5py's boolean enum), in three C calls instead of h5py's ~0.15 ms."""
    if isinstance(value, str):
        data = np.array(value, dtype=STRING_DTYPE)
    else:
        data = np.asarray(value)
        if data.ndim or data.dtype.kind not in "biuf":
            h5py.AttributeManager(h5py.Group(obj) if isinstance(obj, h5py.h5g.GroupID) else h5py.Dataset(obj))[key] = value
            return
    aid = h5py.h5a.create(obj, key.encode(), _h5_type(data.dtype), _SCALAR)
    aid.write(data)


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


class _Declared:
    """Shape and dtype of a tensor that is not here (what a /layers row needs of an array)."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, np.dtype(dtype)


def summary_stats(summary: "TensorSummary") -> TensorStats:
    """The /layers statistics of a tensor from its summary (mean and std from the float64 sums)."""
    s = summary.stats
    finite = s["numel"] - s["n_nan"] - s["n_posinf"] - s["n_neginf"]
    mean = s["sum"] / finite if finite else math.nan
    std = math.sqrt(max(s["sumsq"] / finite - mean * mean, 0.0)) if finite else math.nan
    return TensorStats(numel=s["numel"], min=s["min"], max=s["max"], mean=mean, std=std,
                       **{k: s[k] for k in ("n_nan", "n_posinf", "n_neginf", "n_zero", "n_fp16_overflow",
                                            "n_fp16_underflow", "n_fp16_saturated")})


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


def add_pulled_tensors(path: Path | str, tensors: list[tuple[dict[str, Any], np.ndarray]], attrs: dict[str, Any]) -> Path:
    """Put tensors pulled since `path` was written into it: each one's `/tensors/<order>` beside the summary it
    was estimated from (kept: the summary of a whole tensor spares sketching it), its /layers row from the tensor
    itself, and the root attributes in `attrs` (`bytes_pulled`, `tensors_pulled`). A sketch-first collection's
    later rounds: rewriting the whole file for a few tensors cost more than the analysis of them.

    Works on a copy renamed over the file at the end: an interrupted update leaves the file as it was."""
    import shutil

    path = Path(path)
    partial = partial_path(path)
    SpaceGuard(path, path.stat().st_size + sum(a.nbytes for _m, a in tensors)).reserve(0)
    shutil.copyfile(path, partial)
    try:
        with writing(path), h5py.File(partial, "r+") as file:
            table = file["layers"][()]
            rows = {int(o): i for i, o in enumerate(table["order"].tolist())}
            group = file.require_group("tensors")
            for meta, array in tensors:
                order = int(meta["order"])
                key = tensor_key(meta["op"], int(meta.get("output_index", 0)))
                if str(order) in group:
                    continue
                ds = group.create_dataset(str(order), data=np.ascontiguousarray(array) if array.ndim else array)
                for name, value in {"key": key, "name": str(meta.get("name", key)), "op": str(meta["op"])}.items():
                    ds.attrs[name] = value
                if order in rows:
                    row = _layer_row(meta, key, array, tensor_stats(array))
                    for column, _ in LAYER_COLUMNS:
                        table[column][rows[order]] = row[column]
            file["layers"][...] = table
            provenance = json.loads(str(file.attrs.get("provenance", "{}")) or "{}")
            for key, value in attrs.items():
                file.attrs[key] = _attr_value(value)
                provenance[key] = value
            file.attrs["provenance"] = json.dumps(provenance, default=str, sort_keys=True)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
