"""Reading tensors fast from an HDF5 dump: a reusable buffer, one `pread` per contiguous tensor
(a read-only memory map for big ones), sampled blocks of big layers, and a small HDF5 metadata
cache (see `layerdiff.analyzer.formats.dumpfile.DumpFile`)."""
from __future__ import annotations

import math
import mmap
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from layerdiff.analyzer.formats.limits import MAX_TENSOR_BYTES

if TYPE_CHECKING:  # h5py is imported where a file is opened: a reader built from a stored header opens none
    import h5py

# From this size a contiguous tensor is mapped instead of copied: copying 256 MB from the page cache
# into a buffer took as long as all the metrics of the layer, and a first read faulted the buffer in.
MAP_MIN_BYTES = 16 << 20
SPAN_READ_BYTES = 8 << 20  # sampled blocks within this many bytes are read as one span (one system call)


class TensorBuffer:
    """Reusable memory for reading one tensor at a time (grows to the largest tensor read)."""

    def __init__(self) -> None:
        self._raw = np.empty(0, dtype=np.uint8)

    def view(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if self._raw.size < nbytes:
            self._raw = np.empty(nbytes, dtype=np.uint8)
        return self._raw[:nbytes].view(dtype).reshape(shape)


def small_metadata_cache(file: h5py.File) -> None:
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


class FastReader:
    """Reads contiguous, uncompressed tensors with one dataset open and one `pread` each.

    h5py's high-level access costs several lookups per tensor (group, name, shape, dtype, layout),
    which at 10,000 small layers was most of an analysis. A contiguous dataset's bytes sit at one
    file offset, so after one low-level open the read is a plain `pread` into the reused buffer.
    The /layers table's shape is trusted only when the dataset's type equals the declared dtype and
    its stored byte count equals shape x itemsize; anything else (chunked, compressed, external
    storage, links, other types, sizes that do not add up) returns None and takes the checked h5py path.
    """

    def __init__(self, filename: str, file: "h5py.File | None" = None) -> None:
        """`file`: the dump open in h5py, for `read` (which opens each dataset); without it, only the reads
        at offsets known from an earlier opening (`read_at`, `blocks_at`) are possible."""
        self._group = None
        if file is not None:
            import h5py

            group = file.get("tensors")
            self._group = group.id if isinstance(group, h5py.Group) else None
        self._filename = filename
        self._fd: int | None = None
        self._types: dict[str, tuple[np.dtype, Any] | None] = {}
        self.offsets: dict[int, int] = {}  # order -> file offset of each tensor `read` found contiguous and whole

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
            import h5py

            if self._group.links.get_info(name).type != h5py.h5l.TYPE_HARD:
                return None  # links are refused on the checked path (layerdiff.analyzer.formats.h5guard)
            dsid = h5py.h5d.open(self._group, name)
            offset = dsid.get_offset()
            nbytes = math.prod(shape) * dtype.itemsize
            if (offset is None or nbytes == 0 or nbytes > MAX_TENSOR_BYTES or dsid.get_storage_size() != nbytes
                    or not dsid.get_type().equal(type_id)):
                return None
            values = self.read_at(offset, shape, dtype, buffer)
        except (KeyError, OSError, RuntimeError, ValueError, TypeError):
            return None
        if values is not None:
            self.offsets[order] = offset
        return values

    def read_at(self, offset: int, shape: tuple[int, ...], dtype: np.dtype, buffer: "TensorBuffer") -> np.ndarray | None:
        """The tensor of `shape` and `dtype` whose bytes start at `offset` (mapped when big), None when the
        file is shorter: for tensors `read` has checked, in this opening or one a stored header recorded."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0 or nbytes > MAX_TENSOR_BYTES:
            return None
        if nbytes >= MAP_MIN_BYTES:
            return self._map(offset, nbytes, dtype, shape)
        out = buffer.view(shape, dtype)
        return out if self._pread(out, offset) else None

    def blocks(self, ds: h5py.Dataset, starts: np.ndarray, length: int) -> np.ndarray | None:
        """`length` elements at each flat start, for a contiguous dataset of a plain type (else None)."""
        offset = ds.id.get_offset()
        dtype = ds.dtype
        if offset is None or dtype.kind not in "fiub" or ds.id.get_storage_size() != ds.size * dtype.itemsize:
            return None
        return self.blocks_at(offset, dtype, starts, length)

    def blocks_at(self, offset: int, dtype: np.dtype, starts: np.ndarray, length: int) -> np.ndarray | None:
        """`blocks` of the contiguous tensor whose bytes start at `offset` (None when the file is shorter).

        Blocks that lie within `SPAN_READ_BYTES` (ascending starts) come from one read of that span: a read
        per block was a few hundred system calls for a tensor of a few MB."""
        first, end = int(starts[0]), int(starts[-1]) + length
        if len(starts) > 1 and (end - first) * dtype.itemsize <= SPAN_READ_BYTES and bool((starts[1:] >= starts[:-1]).all()):
            span = np.empty(end - first, dtype=dtype)
            if not self._pread(span, offset + first * dtype.itemsize):
                return None
            return span[(starts - first)[:, None] + np.arange(length)].reshape(-1)
        out = np.empty((len(starts), length), dtype=dtype)
        for row, start in zip(out, starts):
            if not self._pread(row, offset + int(start) * dtype.itemsize):
                return None
        return out.reshape(-1)

    def _map(self, offset: int, nbytes: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
        """A read-only view of the tensor's bytes in the page cache, unmapped when the view is freed.

        Only bytes the file really holds are mapped (a short file takes the checked path, as a short
        read would). Dumps are written under a temporary name and renamed when complete, so a dump
        being analyzed is not being written; a file cut short by someone else while mapped would
        stop the process (SIGBUS) where a read would have failed."""
        fd = self._open()
        if os.fstat(fd).st_size < offset + nbytes:
            return None
        base = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, nbytes + offset - base, offset=base, access=mmap.ACCESS_READ)
        return np.frombuffer(mapped, dtype=dtype, count=math.prod(shape), offset=offset - base).reshape(shape)

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._filename, os.O_RDONLY)
        return self._fd

    def _pread(self, out: np.ndarray, offset: int) -> bool:
        self._open()
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
                import h5py

                self._types[name] = (dtype, h5py.h5t.py_create(dtype)) if dtype.kind in "fiub" else None
            except (TypeError, ValueError):
                self._types[name] = None
        return self._types[name]


def blocks_by_chunks(ds: h5py.Dataset, starts: np.ndarray, length: int) -> np.ndarray:
    """The same flat blocks as `FastReader.blocks`, for chunked or compressed datasets: the tensor
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


def implausibly_sparse(ds: h5py.Dataset, nbytes: int) -> bool:
    """A dataset declaring far more bytes than it stores (beyond any compression ratio) is a trap:
    reading it would allocate the declared size. Real dumps store what they declare."""
    if nbytes < (64 << 20):
        return False
    try:
        stored = ds.id.get_storage_size()
    except (OSError, RuntimeError, ValueError):
        return True
    return stored * 1100 < nbytes
