"""The raw dump a harness writes (analyzer/FORMATS.md §1): reader, Python writer, and conversion to HDF5.

Raw dumps come from phones, from the host engines and from colleagues' `adb pull`s, so the reader
treats them as untrusted: every offset, length and shape is checked against the file before a byte
is allocated, and a dump cut short (no footer, a half-written last line) still yields every tensor
that was completely written.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from layerdiff.analyzer.formats.timestamps import utc_now
from layerdiff.errors import DumpFormatError, Interrupted
from layerdiff.analyzer.formats.limits import check_plain_file

RAW_FORMAT = "layerdiff-raw"
RAW_VERSION = 1
MANIFEST = "manifest.jsonl"
TENSORS = "tensors.bin"
PLAIN_DIR = "plain"  # the plain run's outputs: a raw dump inside the observed run's (collector/engines/plainrun.py)
MAX_ELEMENTS = 1 << 40
MAX_TENSOR_BYTES = 8 << 30  # one layer larger than this is a lying manifest, not a real tensor
MAX_MANIFEST_BYTES = 256 << 20  # ~1M tensor lines: more than any model has layers
DTYPES = {
    "float32": "<f4",
    "float16": "<f2",
    "float64": "<f8",
    "int8": "i1",
    "uint8": "u1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
}


@dataclass
class RawTensor:
    """One validated tensor line of a manifest."""

    order: int
    op: str
    op_type: str
    output_index: int
    name: str
    inputs: list[str]
    shape: tuple[int, ...]
    dtype: str
    layout: str
    offset: int
    nbytes: int
    memory: str = "host"
    time_ms: float | None = None

    def meta(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "op": self.op,
            "op_type": self.op_type,
            "output_index": self.output_index,
            "name": self.name,
            "inputs": self.inputs,
            "layout": self.layout,
            "memory": self.memory,
            "time_ms": self.time_ms,
        }


@dataclass
class FedInput:
    """One `input_fed` record: an input as the engine holds it after feeding, read back from the
    engine's own input tensor. `axes` maps the given array onto these bytes: fed = given.transpose(axes)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str
    axes: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass
class RawDump:
    """A parsed raw dump directory; tensors are read lazily from `tensors.bin`."""

    path: Path
    header: dict[str, Any]
    tensors: list[RawTensor]
    footer: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)

    truncated: bool = False
    fed: list["FedInput"] = field(default_factory=list)  # `input_fed` records: what the engine received
    _open: Any = field(default=None, repr=False, compare=False)  # tensors.bin while `opened()`

    @property
    def complete(self) -> bool:
        return self.footer is not None and self.footer.get("status", "ok") == "ok" and not self.truncated

    def read(self, tensor: RawTensor) -> np.ndarray:
        count = int(np.prod(tensor.shape, dtype=np.int64)) if tensor.shape else 1
        if self._open is not None:
            self._open.seek(0)
            array = np.fromfile(self._open, dtype=np.dtype(DTYPES[tensor.dtype]), count=count, offset=tensor.offset)
        else:
            check_plain_file(self.path / TENSORS)
            with open(self.path / TENSORS, "rb") as fh:
                array = np.fromfile(fh, dtype=np.dtype(DTYPES[tensor.dtype]), count=count, offset=tensor.offset)
        if array.size != count:
            raise DumpFormatError(f"{self.path / TENSORS}: tensor {tensor.name!r} is truncated at offset {tensor.offset}")
        return array.reshape(tensor.shape)

    @contextlib.contextmanager
    def opened(self) -> Iterator["RawDump"]:
        """`tensors.bin` checked and opened once for every `read` inside the block (a conversion reads each
        tensor in turn: opening and checking the file per tensor cost as much as reading a small one)."""
        if self._open is not None or not os.path.lexists(self.path / TENSORS):
            yield self
            return
        check_plain_file(self.path / TENSORS)
        with open(self.path / TENSORS, "rb") as fh:
            self._open = fh
            try:
                yield self
            finally:
                self._open = None

    def read_fed(self, fed: FedInput) -> np.ndarray:
        """The bytes an engine received for one input (an `input_fed` record)."""
        return self.read(RawTensor(0, fed.name, "", 0, fed.name, [], fed.shape, fed.dtype, fed.layout,
                                   fed.offset, fed.nbytes))

    def iter_arrays(self) -> Iterator[tuple[RawTensor, np.ndarray]]:
        for tensor in self.tensors:
            yield tensor, self.read(tensor)


def read_raw_dump(path: Path | str) -> RawDump:
    """Parse and validate a raw dump directory; raises `DumpFormatError` naming file and line."""
    root = Path(path)
    manifest = root / MANIFEST
    if not manifest.is_file():
        raise DumpFormatError(f"{root}: not a raw dump directory (no {MANIFEST})")
    check_plain_file(manifest)
    data_size = check_plain_file(root / TENSORS).st_size if os.path.lexists(root / TENSORS) else 0
    lines = _manifest_lines(manifest)
    if not lines:
        raise DumpFormatError(f"{manifest}: empty manifest (the harness died before writing its header)")
    header = _parse_header(manifest, lines[0][1])
    tensors: list[RawTensor] = []
    footer = None
    problems: list[str] = []
    truncated = False
    fed_inputs: list[FedInput] = []
    for lineno, record in lines[1:]:
        kind = record.get("record")
        if kind == "tensor" and not truncated:
            tensor = _parse_tensor(manifest, lineno, record)
            if tensors and tensor.order <= tensors[-1].order:
                raise DumpFormatError(f"{manifest}:{lineno}: tensor order {tensor.order} is not increasing")
            if tensors and tensor.offset < tensors[-1].offset + tensors[-1].nbytes:
                # tensors are written back to back: an overlap would read one layer's bytes as another's
                raise DumpFormatError(f"{manifest}:{lineno}: layer {tensor.op!r} starts at byte {tensor.offset}, "
                                      f"inside the bytes of the tensor before it (which end at "
                                      f"{tensors[-1].offset + tensors[-1].nbytes})")
            if tensor.offset + tensor.nbytes > data_size and tensor.nbytes <= MAX_TENSOR_BYTES:
                # tensors.bin cut short (a pull or a disk that died): keep every tensor before the cut
                truncated = True
                problems.append(f"{root / TENSORS} ends at byte {data_size}, inside layer {tensor.op!r} "
                                f"({manifest.name}:{lineno}); the {len(tensors)} tensors before it are kept")
                continue
            tensors.append(tensor)
        elif kind == "input_fed" and not truncated:
            fed = _parse_fed(manifest, lineno, record)
            if fed.offset + fed.nbytes <= data_size:
                fed_inputs.append(fed)
        elif kind == "footer":
            footer = record
    claimed = footer.get("tensors") if footer is not None else None
    if isinstance(claimed, int) and not isinstance(claimed, bool) and claimed != len(tensors) and not truncated:
        # the harness counted other tensor lines than the manifest holds: lines were lost or added by hand
        truncated = True
        problems.append(f"{manifest}: the footer counts {claimed} tensors but the manifest lists {len(tensors)}; "
                        f"the {len(tensors)} listed are kept and the run is marked incomplete")
    if footer is None:
        last = tensors[-1].op if tensors else "(none)"
        problems.append(f"no footer: the harness stopped after {len(tensors)} tensors, last op {last!r}")
    return RawDump(root, header, tensors, footer, problems, truncated, fed_inputs)


def _parse_fed(manifest: Path, lineno: int, rec: dict[str, Any]) -> FedInput:
    """An `input_fed` line, checked like a tensor line (extent, dtype) plus its axes (a permutation)."""
    where = f"{manifest}:{lineno}"
    try:
        shape = tuple(int(d) for d in rec["shape"])
        fed = FedInput(name=str(rec["name"]), shape=shape, dtype=str(rec["dtype"]), layout=str(rec.get("layout", "")),
                       axes=tuple(int(a) for a in rec.get("axes", range(len(shape)))),
                       offset=int(rec["offset"]), nbytes=int(rec["nbytes"]))
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise DumpFormatError(f"{where}: malformed input_fed line ({type(err).__name__}: {err})") from None
    if sorted(fed.axes) != list(range(len(shape))):
        raise DumpFormatError(f"{where}: input {fed.name!r}: axes {list(fed.axes)} is not a permutation of its "
                              f"{len(shape)} dimensions")
    _check_extent(where, RawTensor(0, f"input {fed.name}", "", 0, fed.name, [], shape, fed.dtype, fed.layout,
                                   fed.offset, fed.nbytes))
    return fed


def _manifest_lines(manifest: Path) -> list[tuple[int, dict[str, Any]]]:
    if manifest.stat().st_size > MAX_MANIFEST_BYTES:
        raise DumpFormatError(f"{manifest}: {manifest.stat().st_size} bytes is larger than any real manifest")
    text = manifest.read_bytes()
    raw_lines = text.split(b"\n")
    complete_lines = raw_lines if text.endswith(b"\n") else raw_lines[:-1]  # drop a half-written tail
    out = []
    for number, raw in enumerate(complete_lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):  # bad JSON, bad UTF-8, absurd nesting or huge integers
            raise DumpFormatError(f"{manifest}:{number}: not valid JSON") from None
        if not isinstance(record, dict):
            raise DumpFormatError(f"{manifest}:{number}: expected a JSON object")
        out.append((number, record))
    return out


def _parse_header(manifest: Path, header: dict[str, Any]) -> dict[str, Any]:
    if header.get("record") != "header" or header.get("format") != RAW_FORMAT:
        raise DumpFormatError(f"{manifest}:1: not a layerdiff raw dump header (format != {RAW_FORMAT!r})")
    version = header.get("format_version")
    if not isinstance(version, int) or version > RAW_VERSION:
        raise DumpFormatError(
            f"{manifest}:1: raw format version {version!r} is not supported (this layerdiff reads {RAW_VERSION})"
        )
    return header


def _check_field_types(where: str, rec: dict[str, Any]) -> None:
    """Refuse a tensor line whose fields have another JSON type than FORMATS.md gives them: `str()` and
    `int()` would otherwise turn `"inputs": "t0"` into the edges `t`, `0`, `true` into a dimension 1
    and `{"x": 1}` into an op name, and the run would be aligned on a graph no engine wrote."""
    def bad(field: str, expected: str) -> DumpFormatError:
        return DumpFormatError(f"{where}: tensor field {field!r} must be {expected}, not {json.dumps(rec[field])[:60]}")

    for field in ("order", "offset", "nbytes", "output_index"):
        if field in rec and (isinstance(rec[field], bool) or not isinstance(rec[field], int)):
            raise bad(field, "an integer")
    for field in ("op", "op_type", "name", "dtype", "layout", "memory"):
        if field in rec and not isinstance(rec[field], str):
            raise bad(field, "a string")
    if "shape" in rec and not (isinstance(rec["shape"], list)
                               and all(isinstance(d, int) and not isinstance(d, bool) for d in rec["shape"])):
        raise bad("shape", "a list of integers")
    if "inputs" in rec and not (isinstance(rec["inputs"], list) and all(isinstance(x, str) for x in rec["inputs"])):
        raise bad("inputs", "a list of tensor names")


def _parse_tensor(manifest: Path, lineno: int, rec: dict[str, Any]) -> RawTensor:
    where = f"{manifest}:{lineno}"
    _check_field_types(where, rec)
    try:
        shape = tuple(int(d) for d in rec["shape"])
        dtype = str(rec["dtype"])
        offset, nbytes = int(rec["offset"]), int(rec["nbytes"])
        tensor = RawTensor(
            order=int(rec["order"]),
            op=str(rec["op"]),
            op_type=str(rec.get("op_type", "")),
            output_index=int(rec.get("output_index", 0)),
            name=str(rec.get("name", rec["op"])),
            inputs=[str(x) for x in rec.get("inputs", [])],
            shape=shape,
            dtype=dtype,
            layout=str(rec.get("layout", "")),
            offset=offset,
            nbytes=nbytes,
            memory=str(rec.get("memory", "host")),
            time_ms=None if rec.get("time_ms") is None else float(rec["time_ms"]),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise DumpFormatError(f"{where}: malformed tensor line ({type(err).__name__}: {err})") from None
    _check_extent(where, tensor)
    return tensor


def _check_extent(where: str, t: RawTensor) -> None:
    if t.dtype not in DTYPES:
        raise DumpFormatError(f"{where}: layer {t.op!r} has unsupported dtype {t.dtype!r}")
    if any(d < 0 for d in t.shape):
        raise DumpFormatError(f"{where}: layer {t.op!r} has a negative dimension in shape {list(t.shape)}")
    numel = math.prod(t.shape)
    if numel > MAX_ELEMENTS:
        raise DumpFormatError(f"{where}: layer {t.op!r} declares {numel} elements, more than any real tensor")
    if numel * np.dtype(DTYPES[t.dtype]).itemsize != t.nbytes:
        raise DumpFormatError(f"{where}: layer {t.op!r}: nbytes {t.nbytes} does not match shape {list(t.shape)} x {t.dtype}")
    if t.offset < 0:
        raise DumpFormatError(f"{where}: layer {t.op!r} has a negative offset {t.offset}")
    if t.nbytes > MAX_TENSOR_BYTES:
        raise DumpFormatError(f"{where}: layer {t.op!r} declares {t.nbytes} bytes, more than any real tensor")


class RawDumpWriter:
    """Writes a raw dump the way the C++ harness does: bytes first, then the manifest line, flushed."""

    def __init__(self, path: Path | str, header: dict[str, Any], *, summary: bool = True) -> None:
        """`summary`: also write the tensor summary (FORMATS.md §3) a sketch-first collection reads."""
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        if any(self.path.iterdir()):
            raise DumpFormatError(f"{self.path}: output directory is not empty")
        self._data = open(self.path / TENSORS, "wb")
        self._manifest = open(self.path / MANIFEST, "w", encoding="utf-8")
        self._offset = 0
        self._count = 0
        from layerdiff.analyzer.formats.sketchformat import SummaryWriter

        self._summary = SummaryWriter(self.path) if summary else None  # what a sketch-first collection pulls instead of tensors.bin
        full = {"record": "header", "format": RAW_FORMAT, "format_version": RAW_VERSION, "started": utc_now()}
        self._write_line({**full, **header})

    def add(
        self,
        *,
        op: str,
        op_type: str,
        array: np.ndarray,
        output_index: int = 0,
        name: str | None = None,
        inputs: list[str] | None = None,
        layout: str = "",
        memory: str = "host",
        time_ms: float | None = None,
    ) -> None:
        array = np.asarray(array, order="C")  # a 0-d tensor stays 0-d
        dtype = array.dtype.name
        if dtype not in DTYPES:
            array, dtype = array.astype(np.float32), "float32"
        self._data.write(np.asarray(array.astype(DTYPES[dtype], copy=False), order="C").data)  # no copy: layers are big
        self._data.flush()
        line = {
            "record": "tensor",
            "order": self._count,
            "op": op,
            "op_type": op_type,
            "output_index": output_index,
            "name": name if name is not None else f"{op}:{output_index}",
            "inputs": list(inputs or []),
            "shape": [int(d) for d in array.shape],
            "dtype": dtype,
            "layout": layout,
            "offset": self._offset,
            "nbytes": int(array.nbytes),
            "memory": memory,
        }
        if time_ms is not None:
            line["time_ms"] = time_ms
        self._write_line(line)
        if self._summary is not None:
            self._summary.add(self._count, line["name"], array)
        self._offset += int(array.nbytes)
        self._count += 1

    def add_fed(self, *, name: str, array: np.ndarray, layout: str, axes: tuple[int, ...] | None = None) -> None:
        """Record what the engine received for input `name`, read back from its own input tensor after
        feeding (FORMATS.md §1 `input_fed`): bytes in `tensors.bin`, then the line."""
        array = np.asarray(array, order="C")
        dtype = array.dtype.name if array.dtype.name in DTYPES else "float32"
        data = np.asarray(array.astype(DTYPES[dtype], copy=False), order="C")
        self._data.write(data.data)
        self._data.flush()
        self._write_line({"record": "input_fed", "name": name, "shape": [int(d) for d in array.shape], "dtype": dtype,
                          "layout": layout, "axes": list(axes) if axes is not None else list(range(array.ndim)),
                          "offset": self._offset, "nbytes": int(data.nbytes)})
        self._offset += int(data.nbytes)

    def close(self, *, infer_ms: float, status: str = "ok", extra: dict[str, Any] | None = None) -> None:
        footer = {"record": "footer", "tensors": self._count, "bytes": self._offset, "infer_ms": infer_ms, **(extra or {})}
        self._write_line({**footer, "finished": utc_now(), "status": status})
        if self._summary is not None:
            self._summary.close()
        self._data.close()
        self._manifest.close()

    def _write_line(self, record: dict[str, Any]) -> None:
        self._manifest.write(json.dumps(record) + "\n")
        self._manifest.flush()


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def combined_sha256(parts: list[str]) -> str:
    """One digest for several files or tensors: the sha256 of their sha256s, in order."""
    if len(parts) == 1:
        return parts[0]
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def _entries(value: Any) -> list[dict]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _number(value: Any, kind: type, default: Any) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        return default


def header_provenance(header: dict[str, Any]) -> dict[str, Any]:
    """Root attributes that follow from a raw header alone (FORMATS.md §2); odd types degrade to defaults."""
    models = _entries(header.get("model"))
    inputs = _entries(header.get("inputs"))
    actual = header.get("backends_actual") or []
    return {
        "engine": str(header.get("engine", "")),
        "engine_version": str(header.get("engine_version", "")),
        "backend_requested": str(header.get("backend_requested", "")),
        "backend_actual": "+".join(map(str, actual)) if isinstance(actual, list) else str(actual),
        "precision_requested": str(header.get("precision_requested", "")),
        "precision_effective": str(header.get("precision_effective", "")),
        "threads": _number(header.get("threads", 0) or 0, int, 0),
        "model_name": Path(str(models[0].get("file", ""))).name if models else "",
        "model_sha256": combined_sha256([str(m.get("sha256", "")) for m in models]) if models else "",
        "input_sha256": combined_sha256([str(i.get("sha256", "")) for i in inputs]) if inputs else "",
        "harness": str(header.get("harness", "")),
        "repeat": _number(header.get("repeat", 0) or 0, int, 0),
        "outputs": _names_json(header.get("outputs")),
    }


def _names_json(value: Any) -> str:
    """A header's list of output names as the HDF5 attribute stores it ('' when absent or not a list of strings)."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return ""
    return json.dumps(value)


def convert_raw_dump(
    raw: Path | str | RawDump,
    out_path: Path | str,
    *,
    attrs: dict[str, Any] | None = None,
    inputs: list[tuple[str, np.ndarray]] | None = None,
    stderr: str = "",
    exit_status: int = 0,
    compression: str | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Path:
    """Stream a raw dump into one HDF5 dump, tensor by tensor (memory bounded by the largest tensor).

    A dump without a footer, or from a harness that exited non-zero, becomes an HDF5 marked
    incomplete with every tensor that was written. `cancel` is asked between tensors: when it says
    stop, the partial file is removed and `Interrupted` raised (so no thread is left inside HDF5).
    """
    dump = raw if isinstance(raw, RawDump) else read_raw_dump(raw)
    header = dump.header
    footer = dump.footer or {}
    merged = {
        **header_provenance(header),
        "infer_ms": _number(footer.get("infer_ms", math.nan), float, math.nan),
        "complete": dump.complete and exit_status == 0,
        "exit_status": int(exit_status),
        **(attrs or {}),
    }
    if "input_fed_check" not in merged and dump.fed:
        merged["input_fed_check"] = fed_check(dump, inputs or [])
    provenance = dict(merged.pop("provenance", {}) or {})
    provenance.update({"raw_header": header, "raw_footer": dump.footer, "raw_problems": dump.problems})
    merged["provenance"] = provenance
    from layerdiff.analyzer.formats.dumpwriter import DumpWriter  # h5py loads only where HDF5 is written, not in engine children

    expected = (sum(t.nbytes for t in dump.tensors) + sum(a.nbytes for _, a in inputs or [])
                + sum(f.nbytes for f in dump.fed))
    pulled, summaries = _sketched_parts(dump)
    whole_summaries = summaries or _whole_summaries(dump)  # kept: a sketch-first run compares with them
    if summaries is not None:
        merged.update(pulled_facts(dump, pulled))
    with dump.opened(), DumpWriter(out_path, merged, compression=compression, expected_bytes=expected) as writer:
        for tensor in dump.tensors:
            if cancel is not None and cancel():
                raise Interrupted(f"{out_path}: conversion stopped on request")
            meta = {**tensor.meta(), "op": tensor.op, "shape": list(tensor.shape)}
            if summaries is not None and tensor.order not in pulled and tensor.order in summaries.tensors:
                writer.add_estimated(meta, summaries.tensors[tensor.order])
            elif summaries is None or tensor.order in pulled:
                writer.add_tensor(meta, dump.read(tensor))
                if whole_summaries is not None and tensor.order in whole_summaries.tensors:
                    writer.hold_summary(tensor.order, whole_summaries.tensors[tensor.order])
        for name, array in inputs or []:
            writer.add_input(name, array, _array_sha256(array))
        for fed in dump.fed:
            writer.add_fed_input(fed.name, dump.read_fed(fed), fed.layout, fed.axes)
        for tensor, array in _plain_outputs(dump, merged["provenance"]["raw_problems"]):
            writer.add_plain_output(f"{tensor.op}:{tensor.output_index}", tensor.name, array)
        if stderr:
            writer.set_log(stderr)
    return Path(out_path)


PULLED = "pulled.json"  # (collector) a sketch-first pull: which tensors' bytes are in the local tensors.bin


def _sketched_parts(dump: RawDump) -> tuple[set[int], Any]:
    """(orders pulled, summaries) of a sketch-first pull; (all, None) for a dump pulled whole. A tensor with
    neither its bytes nor a summary is left out (a harness that died between the two), with a problem line."""
    if not (dump.path / PULLED).is_file():
        return set(), None
    from layerdiff.analyzer.formats.sketchformat import read_summaries

    record = _pulled_record(dump.path)
    orders = record.get("orders")
    if not isinstance(orders, list) or not all(isinstance(o, int) and not isinstance(o, bool) for o in orders):
        raise DumpFormatError(f"{dump.path / PULLED}: 'orders' must be a list of tensor orders")
    summaries = read_summaries(dump.path)
    missing = [t.op for t in dump.tensors if t.order not in orders and t.order not in summaries.tensors]
    if missing:
        dump.problems.append(f"{dump.path}: {len(missing)} tensors have neither bytes nor a summary (first: "
                             f"{missing[0]!r}); they are left out")
    return set(orders), summaries


HELD_MIN_ELEMENTS = 1 << 16  # a tensor held whole keeps its harness's summary only beyond this many elements


def _whole_summaries(dump: RawDump):
    """The summaries a harness wrote beside a dump pulled whole (None when it wrote none, or they do not read:
    they only spare a later sketch-first comparison the work of sketching this run's tensors). A tensor of at
    most HELD_MIN_ELEMENTS is left out: sketched from the file when a comparison asks (~0.4 ms at the bound,
    once per file), it costs less than storing its summary costs every conversion of a small model's run."""
    from layerdiff.analyzer.formats.sketchformat import has_summary, read_summaries

    if not any(_numel(t.shape) > HELD_MIN_ELEMENTS for t in dump.tensors) or not has_summary(dump.path):
        return None
    try:
        summaries = read_summaries(dump.path, small=False)
    except DumpFormatError:
        return None
    summaries.tensors = {order: summary for order, summary in summaries.tensors.items()
                         if summary.stats["numel"] > HELD_MIN_ELEMENTS}
    return summaries


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def _pulled_record(root: Path) -> dict[str, Any]:
    """`pulled.json` as a dict; anything else is one line naming the file."""
    try:
        record = json.loads((root / PULLED).read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise DumpFormatError(f"{root / PULLED}: unreadable ({type(err).__name__}); collect the run again") from None
    if not isinstance(record, dict) or isinstance(record.get("bytes_pulled", 0), bool) \
            or not isinstance(record.get("bytes_pulled", 0), int):
        raise DumpFormatError(f"{root / PULLED}: expected an object with 'orders' and an integer 'bytes_pulled'")
    return record


def pulled_facts(dump: RawDump, pulled: set[int]) -> dict[str, Any]:
    """Root attributes of a sketch-first run: how many bytes came over the link, of how many the dump holds."""
    record = _pulled_record(dump.path)
    total = sum(t.nbytes for t in dump.tensors)
    return {"sketch_first": True, "bytes_pulled": int(record.get("bytes_pulled", 0)), "dump_bytes": int(total),
            "tensors_pulled": len(pulled)}


def fed_check(dump: RawDump, inputs: list[tuple[str, np.ndarray]]) -> str:
    """`equal`, '' (nothing read back) or one line naming the input the engine received differently."""
    from layerdiff.analyzer.formats.fedinputs import check_fed, expected_inputs

    fed = [(f.name, dump.read_fed(f), f.axes, f.layout) for f in dump.fed]
    given = expected_inputs(dict(inputs), {f.name: f.layout for f in dump.fed}, dump.header)
    return check_fed(given, fed, str(dump.header.get("precision_effective") or ""))


def _plain_outputs(dump: RawDump, problems: list[str]) -> Iterator[tuple[RawTensor, np.ndarray]]:
    """The plain run's outputs a harness stored beside the dump (none when it stored none); a plain
    dump that does not read is one problem line, never a lost run."""
    where = dump.path / PLAIN_DIR
    if not (where / MANIFEST).is_file():
        return
    try:
        plain = read_raw_dump(where)
        arrays = [(t, plain.read(t)) for t in plain.tensors]
    except (DumpFormatError, OSError) as err:
        problems.append(f"{where}: the plain run's outputs are unreadable ({err}); only the observed outputs are judged")
        return
    yield from arrays


def _array_sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
