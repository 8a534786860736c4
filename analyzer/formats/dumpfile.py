"""The HDF5 dump: the one contract between the collector and the analyzer (analyzer/FORMATS.md §2).

Everything that writes or reads a `.h5` dump goes through `DumpWriter` / `DumpFile`, so the format
has one definition: the layout in `layerdiff.analyzer.formats.dumpformat`, writing in `layerdiff.analyzer.formats.dumpwriter`, fast
tensor reads in `layerdiff.analyzer.formats.tensorread`, and here `DumpFile`, the checked reader. Callers import all of
them from this module.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from layerdiff.analyzer.formats.dumpformat import (FORMAT_NAME, FORMAT_VERSION, LAYER_COLUMNS, ROOT_DEFAULTS,  # noqa: F401 (re-exported)
                                 STRING_COLUMNS, partial_path, tensor_key)
from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.formats.h5guard import local_dataset, local_group
from layerdiff.analyzer.formats.limits import MAX_ATTR_BYTES, MAX_JSON_DEPTH, check_plain_file, check_tensor_bytes, checked_numel, human_bytes, load_json
from layerdiff.analyzer.formats.tensorread import (FastReader, TensorBuffer, blocks_by_chunks,  # noqa: F401 (re-exported)
                                 implausibly_sparse, small_metadata_cache)
from layerdiff.analyzer.formats.timestamps import utc_now  # noqa: F401  (re-exported: callers import it from here)

if TYPE_CHECKING:  # pandas costs ~0.5 s to import: engine children write dumps without it
    import h5py
    import pandas as pd

    from layerdiff.analyzer.formats.dumpwriter import DumpWriter  # noqa: F401
    from layerdiff.analyzer.formats.sketchformat import TensorSummary


def __getattr__(name: str) -> Any:
    """`DumpWriter`, re-exported on first use: the writer loads h5py, and a reader built from a stored
    header (DumpHeader) never needs it."""
    if name == "DumpWriter":
        from layerdiff.analyzer.formats.dumpwriter import DumpWriter

        return DumpWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MAX_HELD_SUMMARIES = 10_000_000  # rows of /summaries/held_orders read into memory, at most


@dataclass
class DumpHeader:
    """What reading a dump learnt without its tensors: the root attributes as `DumpFile.attrs` gives them,
    the checked /layers table, and the file offset of each tensor found contiguous, whole and of the type and
    shape the table declares. Kept for the file's identity (runs/dumpheaders.py), it lets a later analysis
    of the same file, a re-judged one above all, work without opening it in HDF5 at all."""

    attrs: dict[str, Any]
    layers: "pd.DataFrame"
    offsets: dict[int, int] = field(default_factory=dict)
    input_shapes: list[tuple[str, tuple[int, ...]]] | None = None  # (name, shape) of each model input; None: unknown


class DumpFile:
    """Read access to one HDF5 dump; opening reads only attributes, tensors load on demand.

    Given the `DumpHeader` an earlier reading of this very file left, the file is opened in HDF5 only
    when something the header does not hold is asked for (a tensor at an unknown offset, the inputs, the
    summaries): a re-judged analysis reads attributes and tables from the header and at most a few
    tensors by offset, and never loads h5py."""

    def __init__(self, path: Path | str, header: DumpHeader | None = None) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise DumpFormatError(f"{self.path}: no such file")
        if check_plain_file(self.path, follow=True).st_size == 0:
            raise DumpFormatError(f"{self.path}: an empty file (0 bytes), not a dump; the run that wrote it was cut short")
        self._h5: "h5py.File | None" = None
        self._fast_reader: FastReader | None = None
        self._layers: "pd.DataFrame | None" = None
        self._declared: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._estimated: frozenset[int] | None = None
        self._summaries_stored: frozenset[int] | None = None
        self._held: dict[int, int] | None = None  # order -> row of /summaries/held_* (tensors held whole)
        self._stats_rows: dict[int, int] | None = None
        self._stats_columns: dict[str, list] = {}
        self._attrs: dict[str, Any] | None = None
        self._provenance: dict[str, Any] | None = None
        self._offsets: dict[int, int] = {}
        self._input_shapes: list[tuple[str, tuple[int, ...]]] | None = None
        self.from_header = header is not None  # attributes and tables from a stored header, not read now
        if header is None:
            self._open()
        else:
            self._attrs, self._layers, self._offsets = dict(header.attrs), header.layers, dict(header.offsets)
            self._input_shapes = header.input_shapes

    def _open(self) -> None:
        import h5py

        try:
            self._h5 = h5py.File(self.path, "r")
        except FileNotFoundError:
            raise DumpFormatError(f"{self.path}: no such file") from None
        except OSError as err:
            raise DumpFormatError(f"{self.path}: not a readable HDF5 file ({_short(err)})") from None
        try:
            self._check_format()
        except Exception:
            self._h5.close()
            self._h5 = None
            raise
        small_metadata_cache(self._h5)
        if self._fast_reader is not None:
            self._fast_reader.close()
        self._fast_reader = FastReader(str(self.path), self._h5)

    @property
    def _file(self) -> "h5py.File":
        """The dump open in HDF5, opened (and its format checked) on first use when a header stood in for it."""
        if self._h5 is None:
            self._open()
        return self._h5

    @property
    def _fast(self) -> FastReader:
        if self._fast_reader is None:
            self._fast_reader = FastReader(str(self.path))  # reads at the header's offsets only, until opened
        return self._fast_reader

    @property
    def _tensors(self) -> "h5py.Group":
        self._file  # noqa: B018 - opening checks the format and finds /tensors
        return self._tensors_group

    def header(self) -> DumpHeader:
        """What this reading learnt, for `DumpFile(path, header)` on the same file later (its /layers read)."""
        offsets = dict(self._offsets)
        if self._fast_reader is not None:
            offsets.update(self._fast_reader.offsets)
        try:
            shapes = list(self.input_shapes())
        except DumpFormatError:
            shapes = None  # asked again from the file, where the problem is reported
        return DumpHeader(self.attrs, self.layers, offsets, shapes)

    def __enter__(self) -> "DumpFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._fast_reader is not None:
            self._fast_reader.close()
        if self._h5 is not None:
            self._h5.close()

    def _check_format(self) -> None:
        self._check_attribute_bytes()
        attrs = self._h5.attrs
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
        layers = local_dataset(self._h5, "layers", self.path, "/layers")
        self._tensors_group = local_group(self._h5, "tensors", self.path, "/tensors")
        if layers is None or self._tensors_group is None:
            raise DumpFormatError(f"{self.path}: dump lacks its /layers table or /tensors group (file truncated?)")
        self._bounded(layers, "/layers")

    def _check_attribute_bytes(self) -> None:
        """HDF5 reads every root attribute whole when their names are listed: their total size, which
        the object header states, is checked first (a 256 MB unused attribute took analyze from 97 to 880 MB)."""
        import h5py

        info = h5py.h5o.get_info(self._h5.id)
        size = int(info.meta_size.attr.heap_size) + int(info.hdr.space.total)
        if size > MAX_ATTR_BYTES:
            raise DumpFormatError(f"{self.path}: its root attributes hold {human_bytes(size)}, over the "
                                  f"{human_bytes(MAX_ATTR_BYTES)} a dump's attributes may hold (set LAYERDIFF_MAX_ATTR_BYTES to allow it)")

    @property
    def attrs(self) -> dict[str, Any]:
        """Root attributes as plain Python values, with defaults for ones an older writer omitted (a copy:
        the file is open read-only, so they are read once; the judge asks for `complete` per pair and
        finding, and every read went through each attribute of the file again)."""
        if self._attrs is None:
            out = dict(ROOT_DEFAULTS)
            for key, value in self._file.attrs.items():
                out[key] = _plain(value)
            self._attrs = out
        return dict(self._attrs)

    @property
    def provenance(self) -> dict[str, Any]:
        """The `provenance` attribute parsed (once: the judge and the report ask for it per finding)."""
        if self._provenance is None:
            raw = _as_str(self._attrs_or_file().get("provenance", "{}"))
            value = load_json(raw, f"{self.path}: provenance attribute")
            self._provenance = value if isinstance(value, dict) else {}
        return self._provenance

    def _attrs_or_file(self) -> dict[str, Any]:
        return self._attrs if self._attrs is not None else self.attrs

    @property
    def complete(self) -> bool:
        return bool(self.attrs.get("complete", True))

    @property
    def layers(self) -> "pd.DataFrame":
        """The per-tensor table (one row per tensor, execution order), strings decoded."""
        if self._layers is None:
            self._layers = _read_layers(self._file["layers"], self.path)
            where, checked = f"{self.path}: /layers row ", set()  # a shape cell passes or fails whatever its row
            for order, shape, inputs in zip(self._layers["order"].tolist(), self._layers["shape"].tolist(),
                                            self._layers["inputs"].tolist()):
                if shape not in checked:
                    _check_shape_cell(shape, f"{where}{order}")
                    checked.add(shape)
                _check_inputs_cell(inputs, f"{where}{order} inputs")
        return self._layers

    def tensor(self, order: int, buffer: "TensorBuffer | None" = None) -> np.ndarray:
        """One tensor by execution order, refusing sizes no real layer has before allocating.

        With a `buffer`, the tensor is read into memory the buffer reuses across calls (the view
        returned is valid until the buffer's next read): streaming a dump then costs no page faults.
        """
        own = buffer or TensorBuffer()  # without a buffer: memory of the caller's own, as h5py would give
        known = self._at_known_offset(int(order), own)
        if known is None:
            known = self._fast.read(int(order), self._table_shape(int(order)), own)
        if known is not None:
            return known if buffer is not None or known.flags.writeable else known.copy()
        ds = self._dataset(order)
        self._note_offset(int(order), ds)
        try:
            if buffer is not None and ds.size > 0 and ds.chunks is None and ds.compression is None:
                out = buffer.view(ds.shape, ds.dtype)
                ds.read_direct(out)
                return out
            return ds[()]
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
            raise DumpFormatError(f"{self.path}: tensor {order} is unreadable ({_short(err)})") from None

    def _at_known_offset(self, order: int, buffer: TensorBuffer) -> np.ndarray | None:
        """A tensor read at the offset the header recorded (its type and shape were checked then), or None."""
        if order not in self._offsets or self._h5 is not None:
            return None
        declared = self._table_shape(order)
        if declared is None:
            return None
        try:
            return self._fast.read_at(self._offsets[order], declared[0], np.dtype(declared[1]), buffer)
        except (OSError, ValueError, TypeError):
            return None

    def declared_nbytes(self, order: int) -> int | None:
        """The bytes the /layers table declares for a tensor (shape x dtype), None when it does not say: what
        a caller that keeps only small tensors can skip without reading a byte."""
        declared = self._table_shape(int(order))
        if declared is None:
            return None
        try:
            return math.prod(declared[0]) * np.dtype(declared[1]).itemsize
        except (TypeError, ValueError):
            return None

    def _table_shape(self, order: int) -> tuple[tuple[int, ...], str] | None:
        """(shape, dtype) the /layers table declares for `order`, or None when it does not parse.

        Looked up in arrays (sorted orders, and the table's own shape/dtype cells): a dict of
        tuples per layer held 7 MB at 50,000 layers, a twentieth of the whole analysis's heap."""
        if self._declared is None:
            layers = self.layers
            orders = layers["order"].to_numpy(dtype=np.int64)
            rows = np.argsort(orders, kind="stable")
            self._declared = (orders[rows], rows, layers["shape"].to_numpy(), layers["dtype"].to_numpy())
        sorted_orders, rows, shapes, dtypes = self._declared
        at = int(np.searchsorted(sorted_orders, order))
        if at >= sorted_orders.size or sorted_orders[at] != order:
            return None
        row = int(rows[at])
        try:
            shape = tuple(int(d) for d in _shape_cell(shapes[row]))
        except (ValueError, TypeError):  # not a list (None), or not integers
            return None
        return shape, dtypes[row]

    def sample(self, order: int, count: int) -> np.ndarray:
        """About `count` elements of a tensor's flat view at evenly spread positions, as float64.

        Plots need a few thousand points of a layer; materialising a 64M-element layer as float64 to
        pick them would cost seconds and several times the layer in memory. Contiguous datasets are
        read in a few hundred short blocks at fixed, evenly spaced flat offsets (the same offsets for
        any two tensors of the same size, so a reference and a run stay paired element by element);
        other layouts are read one chunk at a time.
        """
        if int(order) in self._offsets and self._h5 is None:
            picked = self._sample_at_offset(int(order), count)
            if picked is not None:
                return picked
        ds = self._dataset(order)
        self._note_offset(int(order), ds)
        n = int(ds.size)
        if n <= count:
            return np.asarray(ds[()], dtype=np.float64).reshape(-1)
        starts, per_block = _sample_blocks(n, count)
        try:
            picked = self._fast.blocks(ds, starts, per_block)
            if picked is None:
                picked = blocks_by_chunks(ds, starts, per_block)
        except (OSError, RuntimeError, ValueError, TypeError) as err:
            raise DumpFormatError(f"{self.path}: tensor {order} is unreadable ({_short(err)})") from None
        return picked.astype(np.float64)

    def _note_offset(self, order: int, ds: "h5py.Dataset") -> None:
        """Remember where a sampled tensor's bytes start when it is contiguous, whole and what the /layers
        table declares (as `FastReader.read` checks): the next analysis samples it by offset."""
        try:
            declared = self._table_shape(order)
            offset = ds.id.get_offset()
            if (declared is not None and tuple(ds.shape) == tuple(declared[0]) and ds.dtype == np.dtype(declared[1])
                    and offset is not None and ds.id.get_storage_size() == ds.size * ds.dtype.itemsize):
                self._fast.offsets[order] = int(offset)
        except (OSError, RuntimeError, ValueError, TypeError):
            pass

    @property
    def learnt(self) -> bool:
        """Whether this reading knows more than the header it started from (offsets of tensors it read)."""
        return not self.from_header or bool(self._fast_reader and set(self._fast_reader.offsets) - set(self._offsets))

    def _sample_at_offset(self, order: int, count: int) -> np.ndarray | None:
        """`sample` of a tensor the header located: the same positions, read by offset without HDF5."""
        declared = self._table_shape(order)
        if declared is None:
            return None
        shape, dtype = declared[0], np.dtype(declared[1])
        n = math.prod(shape)
        try:
            if n <= count:
                whole = self._fast.read_at(self._offsets[order], shape, dtype, TensorBuffer())
                return None if whole is None else np.asarray(whole, dtype=np.float64).reshape(-1)
            picked = self._fast.blocks_at(self._offsets[order], dtype, *_sample_blocks(n, count))
        except (OSError, ValueError, TypeError):
            return None
        return None if picked is None else picked.astype(np.float64)

    def _dataset(self, order: int) -> h5py.Dataset:
        name = str(int(order))
        where = f"/tensors/{name}"
        if self._tensors.get(name, getlink=True) is None:
            raise DumpFormatError(f"{self.path}: tensor {order} is listed but missing from /tensors")
        ds = local_dataset(self._tensors, name, self.path, where)
        if ds is None or ds.dtype.kind not in "fiub":
            raise DumpFormatError(f"{self.path}: tensor {order} is not a numeric dataset")
        if ds.shape is None:
            raise DumpFormatError(f"{self.path}: {where} holds no data (an empty dataspace); re-collect the run")
        return self._bounded(ds, f"{where} (layer {_as_str(ds.attrs.get('key', name))})")

    def _bounded(self, ds: h5py.Dataset, where: str) -> h5py.Dataset:
        """`ds`, once its declared size is known to fit the limit and the bytes the file stores."""
        nbytes = check_tensor_bytes(ds.shape, ds.dtype.itemsize, f"{self.path}: {where} {tuple(ds.shape)}")
        if implausibly_sparse(ds, nbytes):
            raise DumpFormatError(
                f"{self.path}: {where} declares {human_bytes(nbytes)} but stores only "
                f"{human_bytes(ds.id.get_storage_size())} (truncated or crafted file)"
            )
        return ds

    @property
    def estimated_orders(self) -> frozenset[int]:
        """Orders of the tensors this file knows by their summary alone (`/summaries/<order>`, FORMATS.md §2):
        a sketch-first collection left them on the device."""
        if self._estimated is None:
            self._estimated = frozenset(self._summarised - self._tensor_names())
        return self._estimated

    @property
    def _summarised(self) -> frozenset[int]:
        """Orders with a stored summary (estimated tensors, and tensors held whole whose summary was kept)."""
        import h5py

        group = self._file.get("summaries", getlink=False) if "summaries" in self._file else None
        names = list(group) if isinstance(group, h5py.Group) else []
        return frozenset(int(name) for name in names if name.isdigit()) | frozenset(self._held_rows())

    def _held_rows(self) -> dict[int, int]:
        """Order -> row of the summaries packed in `/summaries/held_*` (FORMATS.md §2; none in older files)."""
        if self._held is None:
            group = local_group(self._file, "summaries", self.path, "/summaries") if "summaries" in self._file else None
            orders = local_dataset(group, "held_orders", self.path, "/summaries/held_orders") \
                if group is not None and "held_orders" in group else None
            if orders is None:
                self._held = {}
            elif orders.ndim != 1 or orders.dtype.kind not in "iu" or orders.shape[0] > MAX_HELD_SUMMARIES:
                raise DumpFormatError(f"{self.path}: /summaries/held_orders is not a list of tensor orders")
            else:
                self._held = {int(order): row for row, order in enumerate(orders[()].tolist())}
        return self._held

    def _stored_summaries(self) -> frozenset[int]:
        if self._summaries_stored is None:
            self._summaries_stored = self._summarised
        return self._summaries_stored

    def _tensor_names(self) -> set[int]:
        return {int(name) for name in self._tensors if name.isdigit()}

    def summary(self, order: int) -> "TensorSummary":
        """A tensor's summary (FORMATS.md §3): stored for an estimated tensor; for a tensor held whole, its
        sketch and sample computed once per file version (a refining collection asks again each round)."""
        from layerdiff.analyzer.formats.sketchformat import BUCKETS, SAMPLE, TensorSummary, cached_sketch

        order = int(order)
        if self._stats_rows is None:  # plain lists: a pandas row lookup per layer cost more than the estimate
            self._stats_rows = {int(o): i for i, o in enumerate(self.layers["order"].tolist())}
            self._stats_columns = {c: self.layers[c].tolist() for c in (*SUMMARY_STAT_COLUMNS, "name")}
        if order not in self._stats_rows:
            raise DumpFormatError(f"{self.path}: no layer with order {order}")
        at = self._stats_rows[order]
        row = {c: values[at] for c, values in self._stats_columns.items()}
        stats, name = _summary_stats(row), str(row["name"])
        if order not in self.estimated_orders and order not in self._stored_summaries():
            return cached_sketch(self.path, order, name, stats, lambda: self.tensor(order))
        if order in self._held_rows() and str(order) not in self._file["summaries"]:
            return self._held_summary(order, name, stats)
        where = f"{self.path}: /summaries/{order}"
        group = self._file["summaries"][str(order)]
        sketch_ds = local_dataset(group, "sketch", self.path, f"/summaries/{order}/sketch")
        sample_ds = local_dataset(group, "sample", self.path, f"/summaries/{order}/sample")
        if sketch_ds is None or sample_ds is None or sketch_ds.shape != (BUCKETS,) or sketch_ds.dtype != np.float64:
            raise DumpFormatError(f"{where}: needs a sketch of {BUCKETS} float64 and a sample")
        if sample_ds.shape != (min(stats["numel"], SAMPLE),) or sample_ds.dtype.kind not in "fiu":
            raise DumpFormatError(f"{where}: the sample holds {sample_ds.shape} values for {stats['numel']} elements")
        return TensorSummary(order, name, stats, sketch_ds[()], sample_ds[()], sample_ds.dtype.name)

    def _held_summary(self, order: int, name: str, stats: dict) -> "TensorSummary":
        """A held tensor's summary from `/summaries/held_*`: its sketch row and its sample's bytes, checked
        like a `/summaries/<order>` group (a file is untrusted: every offset and dtype is checked)."""
        from layerdiff.analyzer.formats.sketchformat import BUCKETS, SAMPLE, TensorSummary

        where = f"{self.path}: /summaries/held_*"
        group = self._file["summaries"]
        parts = {name_: local_dataset(group, name_, self.path, f"/summaries/{name_}")
                 for name_ in ("held_sketches", "held_samples", "held_sample_offsets", "held_sample_dtypes")}
        if any(ds is None for ds in parts.values()):
            raise DumpFormatError(f"{where}: held_orders needs held_sketches, held_samples, held_sample_offsets "
                                  "and held_sample_dtypes beside it")
        row, count = self._held_rows()[order], len(self._held_rows())
        sketches, samples, offsets, dtypes = (parts[k] for k in ("held_sketches", "held_samples",
                                                                   "held_sample_offsets", "held_sample_dtypes"))
        if sketches.shape != (count, BUCKETS) or sketches.dtype != np.float64 or offsets.shape != (count + 1,) \
                or offsets.dtype.kind not in "iu" or dtypes.shape != (count,) or samples.ndim != 1 \
                or samples.dtype != np.uint8:
            raise DumpFormatError(f"{where}: needs {count} sketches of {BUCKETS} float64, {count + 1} offsets, "
                                  f"{count} dtype names and the samples' bytes")
        start, end = (int(v) for v in offsets[row:row + 2])
        try:
            dtype = np.dtype(_as_str(dtypes[row]))
        except (TypeError, ValueError):
            dtype = None
        expected = min(stats["numel"], SAMPLE)
        if dtype is None or dtype.kind not in "fiu" or not 0 <= start <= end <= samples.shape[0] \
                or end - start != expected * dtype.itemsize:
            raise DumpFormatError(f"{where}: the sample of tensor {order} is not {expected} values of a numeric "
                                  "dtype inside held_samples")
        sample = np.frombuffer(samples[start:end].tobytes(), dtype=dtype)
        return TensorSummary(order, name, stats, sketches[row], sample, dtype.name)

    def tensor_by_key(self, key: str) -> np.ndarray:
        rows = self.layers.index[self.layers["key"] == key]
        if len(rows) == 0:
            raise DumpFormatError(f"{self.path}: no layer {key!r}")
        return self.tensor(int(self.layers.loc[rows[0], "order"]))

    def inputs(self) -> Iterator[tuple[str, np.ndarray]]:
        """The model inputs the run was fed (checked like tensors: local, numeric, bounded)."""
        for where, name, ds in self._input_datasets():
            try:
                yield name, ds[()]
            except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
                raise DumpFormatError(f"{self.path}: {where} is unreadable ({_short(err)})") from None

    def input_shapes(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """(name, shape) of each model input, in `inputs`' order, without reading their values: the
        judge needs an input's height and width, not its pixels."""
        if self._input_shapes is not None:
            yield from self._input_shapes
            return
        for _, name, ds in self._input_datasets():
            yield name, tuple(int(d) for d in ds.shape)

    def _input_datasets(self) -> Iterator[tuple[str, str, Any]]:
        """(path, input name, dataset) of each `/inputs` entry in input order, checked local, numeric and
        bounded before anything reads it."""
        group = local_group(self._file, "inputs", self.path, "/inputs")
        if group is None:
            return
        for name in sorted(group, key=_input_order):
            where = f"/inputs/{name}"
            ds = local_dataset(group, name, self.path, where)
            if ds is None or ds.dtype.kind not in "fiub":
                raise DumpFormatError(f"{self.path}: {where} is not a numeric dataset")
            self._bounded(ds, where)
            yield where, _as_str(ds.attrs.get("name", name)), ds

    def inputs_fed(self) -> Iterator[tuple[str, np.ndarray, str, tuple[int, ...]]]:
        """(name, array, layout, axes) of each input as the engine received it (`/inputs_fed`, read back
        from the engine's own input tensor after feeding); nothing for a dump that recorded none."""
        group = local_group(self._file, "inputs_fed", self.path, "/inputs_fed")
        if group is None:
            return
        for name in sorted(group, key=_input_order):
            where = f"/inputs_fed/{name}"
            ds = self._numeric(group, name, where)
            try:
                axes = tuple(int(a) for a in json.loads(_as_str(ds.attrs.get("axes", "[]"))))
                yield _as_str(ds.attrs.get("name", name)), ds[()], _as_str(ds.attrs.get("layout", "")), axes
            except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
                raise DumpFormatError(f"{self.path}: {where} is unreadable ({_short(err)})") from None

    def plain_outputs(self) -> dict[str, np.ndarray]:
        """The plain run's outputs by layer key (`/plain_outputs`, FORMATS.md §2): the model run as an app
        runs it, no tensor observed; {} when the producer stored none."""
        group = local_group(self._file, "plain_outputs", self.path, "/plain_outputs")
        out: dict[str, np.ndarray] = {}
        for name in sorted(group or (), key=_input_order):
            where = f"/plain_outputs/{name}"
            ds = self._numeric(group, name, where)
            try:
                out[_as_str(ds.attrs.get("key", name))] = ds[()]
            except (OSError, RuntimeError, KeyError, ValueError, TypeError) as err:
                raise DumpFormatError(f"{self.path}: {where} is unreadable ({_short(err)})") from None
        return out

    def _numeric(self, group, name: str, where: str):
        """A local numeric dataset of `group`, bounded like every tensor, or DumpFormatError."""
        ds = local_dataset(group, name, self.path, where)
        if ds is None or ds.dtype.kind not in "fiub":
            raise DumpFormatError(f"{self.path}: {where} is not a numeric dataset")
        self._bounded(ds, where)
        return ds

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


SUMMARY_STAT_COLUMNS = ("numel", "n_nan", "n_posinf", "n_neginf", "n_zero", "n_fp16_overflow", "n_fp16_underflow",
                        "n_fp16_saturated", "min", "max", "mean", "std")


def _sample_blocks(n: int, count: int) -> tuple[np.ndarray, int]:
    """The flat starts and block length `DumpFile.sample` reads about `count` of `n` elements at."""
    blocks = min(count, 256)
    per_block = max(1, count // blocks)
    return np.linspace(0, n - per_block, blocks).astype(np.int64), per_block


def _summary_stats(row: Any) -> dict[str, Any]:
    """A summary's exact statistics from a /layers row: sums back from the float64 mean and std."""
    counts = {k: int(row[k]) for k in ("numel", "n_nan", "n_posinf", "n_neginf", "n_zero", "n_fp16_overflow",
                                       "n_fp16_underflow", "n_fp16_saturated")}
    finite = counts["numel"] - counts["n_nan"] - counts["n_posinf"] - counts["n_neginf"]
    mean, std = float(row["mean"]), float(row["std"])
    known = finite > 0 and math.isfinite(mean) and math.isfinite(std * std + mean * mean)  # squares within float64
    return {**counts, "min": float(row["min"]), "max": float(row["max"]),
            "sum": mean * finite if known else 0.0, "sumsq": finite * (std * std + mean * mean) if known else 0.0}


def _input_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 62, name)


def _check_shape_cell(cell: str, where: str) -> None:
    shape = _shape_cell(cell)
    if shape is None:
        raise DumpFormatError(f"{where}: shape {str(cell)[:40]!r} is not a JSON list")
    checked_numel(list(shape), where)


def _check_inputs_cell(cell: str, where: str) -> None:
    """Every reader of an inputs cell (alignment, isolate) parses it and treats bad JSON as no edges;
    nesting is what would break them (a RecursionError), so only a cell with that many brackets is parsed here."""
    if cell.count("[") + cell.count("{") > MAX_JSON_DEPTH:
        load_json(cell, where)


@functools.lru_cache(maxsize=4096)
def _shape_cell(cell: str) -> tuple | None:
    """A /layers shape cell parsed (None: not a JSON list). Layers share a few shapes, and every cell
    was parsed twice (checked on load, read before each tensor): ~8 us each, 0.06 s at 2,000 layers."""
    try:
        value = load_json(cell, "shape")
    except (DumpFormatError, TypeError):
        return None
    return tuple(value) if isinstance(value, list) else None


def _read_layers(ds: h5py.Dataset, path: Path) -> "pd.DataFrame":
    import pandas as pd

    try:
        table = ds[()]
    except (OSError, RuntimeError, KeyError, ValueError) as err:
        raise DumpFormatError(f"{path}: /layers table is unreadable ({_short(err)})") from None
    if table.ndim != 1:
        raise DumpFormatError(f"{path}: /layers table has {table.ndim} dimensions, not one row per tensor "
                              "(a crafted or damaged file); re-collect or re-import the run")
    names = table.dtype.names or ()
    missing = [c for c, _ in LAYER_COLUMNS if c not in names]
    if missing:
        raise DumpFormatError(f"{path}: /layers table lacks columns {', '.join(missing)}")
    _check_number_columns(table, path)
    _check_order_column(table["order"], path)
    frame = pd.DataFrame({c: table[c] for c, _ in LAYER_COLUMNS})
    for column in STRING_COLUMNS:
        frame[column] = _decoded(frame[column])
    return frame


def _check_number_columns(table: np.ndarray, path: Path) -> None:
    """Counts and statistics must be numbers of their kind: a text `min` or a NaN in an integer count
    would break the first chart or sum that reads them, far from the file that holds them."""
    for column, kind in LAYER_COLUMNS:
        wanted = {np.int64: "iu", np.float64: "iuf"}.get(kind)
        have = table.dtype[column]
        if wanted is not None and have.kind not in wanted:
            what = "integers" if kind is np.int64 else "numbers"
            raise DumpFormatError(f"{path}: /layers column {column!r} holds {have} values, not {what} "
                                  "(a crafted or damaged file); re-collect or re-import the run")


def _check_order_column(orders: np.ndarray, path: Path) -> None:
    """Each row's `order` names its tensor (/tensors/<order>): a repeated order (or a fractional one,
    refused with the other number columns) would read one layer's tensor as another's and judge a
    tensor the run never computed there."""
    unique, counts = np.unique(orders, return_counts=True)
    if len(unique) != len(orders):
        raise DumpFormatError(f"{path}: /layers lists order {int(unique[counts > 1][0])} more than once "
                              "(a crafted or damaged file); re-collect or re-import the run")


def _decoded(cells: Any) -> list[str]:
    """A string column's cells as str, equal cells sharing one object: op types, dtypes, layouts and
    shapes repeat across layers, and a str per cell was ~40 MB at 50,000 layers."""
    seen: dict[Any, str] = {}
    out = []
    for cell in cells.tolist() if hasattr(cells, "tolist") else cells:  # Python objects in one call, not per cell
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
    if isinstance(value, np.ndarray):
        # An attribute the format declares scalar but a crafted file stores as an array: a plain list
        # (text decoded) keeps it printable and JSON-safe instead of breaking every truth test on it.
        return [_plain(item) for item in value.reshape(-1).tolist()] if value.shape != () else _plain(value.item())
    return value


def _short(err: BaseException) -> str:
    return str(err).splitlines()[0][:160] if str(err) else type(err).__name__
