"""What every importer shares: size limits, array checks, and writing a foreign dump as HDF5.

Foreign files are untrusted. Importers never unpickle, refuse object/string dtypes, and check every
declared size against the bytes really present before allocating. A problem with one layer skips
that layer (recorded in `problems` and in the file's provenance); a problem with the file raises
`DumpFormatError` naming it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from layerdiff.analyzer.formats.dumpfile import ROOT_DEFAULTS, DumpWriter
from layerdiff.errors import EXIT_USAGE, DumpFormatError, UsageError
from layerdiff.analyzer.importers.optypes import op_type_from_name, op_types_from_onnx
from layerdiff.analyzer.formats.limits import MAX_TENSOR_BYTES, check_tensor_bytes, env_bytes

MAX_TEXT_BYTES = env_bytes("LAYERDIFF_MAX_TEXT_BYTES", 4 * MAX_TENSOR_BYTES)
MAX_LAYERS = 1_000_000
MAX_DIM = 1 << 40  # bound on the product of non-zero dims: keeps even empty arrays' shapes within numpy's range
RESERVED_ATTRS = {"layerdiff_format", "format_version", "tool_version", "created", "provenance"}

# Stored dtypes (FORMATS.md); others are widened to the nearest one that holds every value.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_KEEP = {"float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64"}
_WIDEN = {"bool": "uint8", "uint16": "int32", "uint32": "int64", "uint64": "float64"}


@dataclass
class Layer:
    """One tensor of a foreign dump, loaded only when written (memory bounded by one tensor)."""

    op: str
    output_index: int
    name: str
    load: Callable[[], np.ndarray]
    op_type: str = ""
    layout: str = ""
    time_ms: float | None = None
    where: str = ""  # file (and member) the tensor comes from, for error messages


@dataclass
class ForeignDump:
    """A parsed foreign dump: root attributes, layers in execution order, problems found so far."""

    source: Path
    format: str
    attrs: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    layers: list[Layer] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)  # release what the loaders hold open

    def close(self) -> None:
        for close in self.closers:
            close()
        self.closers.clear()


def checked_array(array: np.ndarray, where: str) -> np.ndarray:
    """A copy-free view of `array` in a stored dtype; refuses object, string and complex data."""
    kind = array.dtype.kind
    if array.dtype.hasobject or kind in "OUSVMmc" or array.dtype.names:
        raise DumpFormatError(f"{where}: unsupported element type {array.dtype} (numeric tensors only)")
    name = array.dtype.newbyteorder("=").name if array.dtype.byteorder not in "=|" else array.dtype.name
    if name in _WIDEN:
        return array.astype(_WIDEN[name])
    if name not in _KEEP:
        raise DumpFormatError(f"{where}: unsupported element type {array.dtype}")
    if not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


def check_declared_size(shape: tuple[int, ...], itemsize: int, available: int, where: str) -> int:
    """Bytes a declared shape needs; refuses it before allocation if the data cannot hold it."""
    if any((not isinstance(d, int)) or d < 0 for d in shape) or math.prod(max(d, 1) for d in shape) > MAX_DIM:
        raise DumpFormatError(f"{where}: invalid shape {list(shape)[:8]}")
    numel = math.prod(shape)
    nbytes = check_tensor_bytes(shape, itemsize, where)
    if nbytes > available:
        raise DumpFormatError(f"{where}: declares {numel} elements ({nbytes} bytes) but only {available} bytes follow (truncated?)")
    return nbytes


# The names a user types for the attributes the analysis pairs and labels runs by.
SET_ALIASES = {"backend": "backend_requested", "precision": "precision_requested", "device": "device_model",
               "model": "model_name", "input": "input_label"}


def settable_keys() -> list[str]:
    """Attribute names `--set` accepts (the HDF5 root attributes a foreign dump can lack)."""
    return [k for k in ROOT_DEFAULTS if k not in RESERVED_ATTRS]


def parse_set_options(items: list[str] | None) -> dict[str, Any]:
    """`["backend=opencl", "threads=4"]` -> attributes, typed like the HDF5 root attributes.

    The short names users type (`backend`, `precision`, `device`, `model`, `input`) stand for
    the attributes they mean (`backend_requested`, ...). A key that is neither is refused (exit 2,
    before anything is written): it used to be stored as an attribute nothing reads, so a typo
    (`--set backend=vulkan` before aliases existed) silently changed nothing."""
    out: dict[str, Any] = {}
    known = settable_keys()
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected key=value, e.g. --set backend=opencl")
        if key in RESERVED_ATTRS:
            raise UsageError(f"--set {key}: this attribute is written by layerdiff itself and cannot be set")
        key = SET_ALIASES.get(key.lower(), key)
        if key not in known:
            aliases = ", ".join(f"{a} (= {k})" for a, k in SET_ALIASES.items())
            raise UsageError(f"--set {key}: unknown key; use one of {aliases}, or {', '.join(known)}",
                             exit_code=EXIT_USAGE)
        out[key] = _typed_value(key, value.strip())
    return out


def _typed_value(key: str, value: str) -> Any:
    default = ROOT_DEFAULTS.get(key)
    try:
        if isinstance(default, bool):
            if value.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                raise ValueError(value)
            return value.lower() in {"true", "1", "yes"}
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        kind = {bool: "true or false", int: "an integer", float: "a number"}[type(default)]
        raise UsageError(f"--set {key}={value}: {key} must be {kind}") from None
    return value


def write_dump(dump: ForeignDump, out: Path, attrs: dict[str, Any] | None = None) -> list[str]:
    """Write a foreign dump as one HDF5 (temporary name, renamed when complete); returns problems.

    A layer that cannot be read is skipped with a problem line; a dump with no readable layer
    at all is refused, so an empty HDF5 never pretends to be a run. What the loaders hold open
    (an archive) is released at the end.
    """
    try:
        return _write_dump(dump, out, attrs)
    finally:
        dump.close()


def _write_dump(dump: ForeignDump, out: Path, attrs: dict[str, Any] | None) -> list[str]:
    if len(dump.layers) > MAX_LAYERS:
        raise DumpFormatError(f"{dump.source}: {len(dump.layers)} tensors, more than any real model has")
    problems = list(dump.problems)
    written = 0
    merged = {key: clean_text(v) if isinstance(v, str) else v for key, v in {**dump.attrs, **(attrs or {})}.items()}
    provenance = {
        **dump.provenance,
        "import_format": dump.format,
        "import_source": str(dump.source),
        "import_user_attrs": dict(attrs or {}),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    types = op_types_from_onnx(Path(dump.source)) if any(not layer.op_type for layer in dump.layers) else {}
    with DumpWriter(out, merged) as writer:
        for layer in dump.layers:
            layer.op_type = layer.op_type or types.get(layer.name) or types.get(layer.op) or op_type_from_name(layer.op)
            array = _load_layer(layer, problems)
            if array is None:
                continue
            meta = {"order": written, "op": clean_text(layer.op), "output_index": layer.output_index,
                    "name": clean_text(layer.name), "op_type": clean_text(layer.op_type), "layout": clean_text(layer.layout),
                    "time_ms": layer.time_ms, "memory": "host"}
            writer.add_tensor(meta, array)
            written += 1
        if written == 0:
            detail = f" ({problems[0]})" if problems else ""
            raise DumpFormatError(f"{dump.source}: no readable layer in this {dump.format} dump{detail}")
        writer.update_attrs({"provenance": {**provenance, "import_problems": problems}})
    return problems


def clean_text(text: str) -> str:
    """Text HDF5 can store: NULs and lone surrogates (invalid UTF-8 read back by h5py, JSON escapes) replaced."""
    if not isinstance(text, str):
        return str(text)
    return _UNSTORABLE.sub("\ufffd", text)


def _load_layer(layer: Layer, problems: list[str]) -> np.ndarray | None:
    try:
        return checked_array(np.asarray(layer.load()), layer.where or layer.name)
    except DumpFormatError as err:
        problems.append(f"{err} (layer {layer.name!r} skipped)")
        return None


def natural_key(text: str) -> list[Any]:
    """Sort key that puts `layer2` before `layer10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def read_order_file(path: Path, max_bytes: int = 64 << 20) -> list[str]:
    """Names, one per line (blank lines and `#` comments ignored)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise DumpFormatError(f"{path}: order file is {size} bytes, more than any real layer list")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DumpFormatError(f"{path}: order file is not UTF-8 text") from None
    except OSError as err:
        raise DumpFormatError(f"{path}: cannot read order file ({err.strerror or err})") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def apply_order(names: list[str], order: list[str], where: str, problems: list[str]) -> list[str]:
    """`names` re-ordered by an order list; unknown entries noted, unlisted names kept at the end."""
    known = set(names)
    seen: set[str] = set()
    ordered: list[str] = []
    missing = 0
    for name in order:
        if name in known and name not in seen:
            ordered.append(name)
            seen.add(name)
        elif name not in known:
            missing += 1
    if missing:
        problems.append(f"{where}: {missing} name(s) in the order list have no tensor")
    rest = [n for n in names if n not in seen]
    if rest and order:
        problems.append(f"{where}: {len(rest)} tensor(s) not in the order list were put at the end")
    return ordered + rest
