"""A layerdiff HDF5 dump from elsewhere: validated before use, re-written when relabelled.

HDF5 from outside can be truncated, corrupt, or crafted to declare datasets far larger than the
file (chunked storage need not exist on disk). Before any tensor is read, every dataset's declared
size is compared with the bytes it really stores; reading then goes through `DumpFile`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.formats.h5guard import check_whole_file
from layerdiff.analyzer.formats.limits import check_tensor_bytes, human_bytes
from layerdiff.analyzer.importers.common import ForeignDump, Layer

H5_FORMAT = "layerdiff-h5"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# What h5py raises for a damaged file: HDF5 errors surface as OSError, RuntimeError (e.g. link
# iteration failed), KeyError (unreadable object), ValueError/TypeError (nonsense attribute values).
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)
MAX_COMPRESSION_RATIO = 2048  # gzip tops out near 1030:1 on all-zero data
_SLACK = 1 << 20


def detect_h5(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        return fh.read(8) == HDF5_SIGNATURE


def validate_h5(path: Path) -> None:
    """Refuse an HDF5 dump that points outside itself or whose datasets declare more than it stores.

    Every dataset counts, wherever it is (/layers, /tensors, /inputs, /log and anything else)."""
    try:
        with h5py.File(path, "r") as fh:
            check_whole_file(fh, path)
            datasets: list[tuple[str, h5py.Dataset]] = []
            fh.visititems(lambda name, item: datasets.append((name, item)) if isinstance(item, h5py.Dataset) else None)
            for name, ds in datasets:
                _check_dataset(ds, path, f"/{name}")
    except H5_ERRORS as err:
        raise DumpFormatError(f"{path}: not a readable HDF5 file ({_short(err)})") from None


def _check_dataset(ds: h5py.Dataset, path: Path, where: str) -> None:
    nbytes = check_tensor_bytes(ds.shape, ds.dtype.itemsize, f"{path}: {where}")
    stored = ds.id.get_storage_size()
    filtered = bool(ds.compression) or bool(ds.id.get_create_plist().get_nfilters())
    limit = stored * MAX_COMPRESSION_RATIO + _SLACK if filtered else stored + (0 if ds.chunks else _SLACK)
    if nbytes > limit and not _is_compact_or_fill(ds, nbytes):
        raise DumpFormatError(f"{path}: {where} declares {human_bytes(nbytes)} but stores {human_bytes(stored)} (truncated or crafted file)")


def _is_compact_or_fill(ds: h5py.Dataset, nbytes: int) -> bool:
    """Tiny datasets may live in the object header (compact layout) with no separate storage."""
    return nbytes <= 64 << 10 and ds.id.get_create_plist().get_layout() == h5py.h5d.COMPACT


def read_h5(path: Path) -> ForeignDump:
    """The dump as a ForeignDump, so relabelling re-writes it through the common writer."""
    validate_h5(path)
    dump_file = open_dump(path)
    try:
        attrs = {k: v for k, v in dump_file.attrs.items() if k not in {"layerdiff_format", "format_version", "tool_version", "created", "provenance"}}
        provenance = dump_file.provenance
        layers = dump_file.layers
    except H5_ERRORS as err:
        dump_file.close()
        raise DumpFormatError(f"{path}: damaged layerdiff dump ({type(err).__name__}: {_short(err)})") from None
    dump = ForeignDump(source=path, format=H5_FORMAT, attrs=attrs, provenance={"original": provenance})
    for row in layers.itertuples(index=False):
        dump.layers.append(Layer(op=row.op, output_index=int(row.output_index), name=row.name,
                                 load=_loader(path, int(row.order)), op_type=row.op_type, layout=row.layout,
                                 time_ms=None if np.isnan(row.time_ms) else float(row.time_ms), where=f"{path}: tensor {row.order}"))
    dump_file.close()
    return dump


def open_dump(path: Path) -> DumpFile:
    """DumpFile with attribute damage (e.g. a non-integer format_version) reported as one line."""
    try:
        return DumpFile(path)
    except H5_ERRORS as err:
        raise DumpFormatError(f"{path}: damaged layerdiff dump attributes ({type(err).__name__}: {_short(err)})") from None


def _loader(path: Path, order: int):
    def load() -> np.ndarray:
        with open_dump(path) as dump_file:
            try:
                return dump_file.tensor(order)
            except H5_ERRORS as err:
                raise DumpFormatError(f"{path}: tensor {order} is damaged ({_short(err)})") from None

    return load


def check_readable(path: Path) -> dict[str, Any]:
    """Validate a dump used as it is (no relabelling): datasets, attributes and layer table."""
    validate_h5(path)
    with open_dump(path) as dump_file:
        try:
            _ = dump_file.layers
            return dump_file.attrs
        except H5_ERRORS as err:
            raise DumpFormatError(f"{path}: damaged /layers table ({type(err).__name__}: {_short(err)})") from None


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:160] if text else type(err).__name__
