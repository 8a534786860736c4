"""The tensor summary a harness writes beside a raw dump (analyzer/FORMATS.md §3): the contract, a writer, a reader.

Why it exists: pulling a whole dump from a phone over USB costs far more than computing, while the
tensors are written, three things that let the analyzer estimate every layer's error without the bytes:
- exact cheap statistics (min, max, NaN/Inf/zero counts, fp16 range counts, sum and sum of squares);
- a linear count-sketch: `BUCKETS` float64 sums of +-x[i] into a bucket chosen by a hash of the element
  index `i`. Linear means S(a) - S(b) = S(a - b), so two runs' sketches give an estimate of the squared
  L2 norm of their difference, hence the relative L2 error, with a known spread;
- a shared-position sample: `SAMPLE` elements at positions that depend only on the seed and the element
  count, so two runs of one model sample the same elements (the allclose share, zero collapse and
  saturation, which no linear sketch can give).

The hash and the positions are defined bit for bit here and in FORMATS.md, so the C++ harness
(device_scripts/harness/src/sketch.cpp) and this writer assign the same bucket and sign to every element
on every device. Readers treat the file as untrusted: every offset and count is checked before use.
"""
from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from layerdiff.errors import DumpFormatError

SUMMARY_FORMAT = "layerdiff-summary"
SUMMARY_VERSION = 1
SUMMARY_LINES = "summary.jsonl"
SUMMARY_DATA = "summary.bin"
BUCKETS = 1024  # k: the estimate of a squared norm has a relative spread of sqrt(2 / k), ~4.4%
SAMPLE = 4096  # shared positions per tensor; every element when a tensor has no more
SEED = 0x6C61796572646966  # "layerdif": the one seed every harness uses, recorded in the summary header
HASH = "splitmix64"
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MUL1 = 0xBF58476D1CE4E5B9
MUL2 = 0x94D049BB133111EB
FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.103515625e-05
CHUNK = 1 << 20  # elements per pass: bounded scratch for any tensor size
CACHE_MAX = 1 << 22  # element indices whose bucket and sign are kept (4M: 12 MB)
MAX_SUMMARY_LINES_BYTES = 256 << 20
STAT_FIELDS = ("numel", "n_nan", "n_posinf", "n_neginf", "n_zero", "n_fp16_overflow", "n_fp16_underflow",
               "n_fp16_saturated")
FLOAT_FIELDS = ("min", "max", "sum", "sumsq")
DTYPES = {
    "float32": "<f4", "float16": "<f2", "float64": "<f8", "int8": "i1", "uint8": "u1",
    "int16": "<i2", "int32": "<i4", "int64": "<i8",
}


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 of each uint64 (wrapping arithmetic): z = x + GOLDEN; z = (z ^ z>>30) * MUL1;
    z = (z ^ z>>27) * MUL2; z ^ z>>31."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MUL1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MUL2)
        return z ^ (z >> np.uint64(31))


def mix64_int(x: int) -> int:
    """The same function on one Python integer (for the sample's base)."""
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MUL1) & MASK64
    z = ((z ^ (z >> 27)) * MUL2) & MASK64
    return z ^ (z >> 31)


def element_hashes(start: int, stop: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """Bucket (low 10 bits of mix64(seed + i)) and sign (-1 when bit 63 is set) of elements start..stop-1."""
    with np.errstate(over="ignore"):
        index = np.arange(start, stop, dtype=np.uint64) + np.uint64(seed)
    h = mix64(index)
    bucket = (h & np.uint64(BUCKETS - 1)).astype(np.intp)
    sign = np.where((h >> np.uint64(63)) != 0, -1.0, 1.0)
    return bucket, sign


class _HashCache:
    """Buckets and signs of the first element indices: they depend on the index alone, so every
    tensor reuses them (the hash costs more than the sums)."""

    def __init__(self) -> None:
        self.seed = SEED
        self.bucket = np.empty(0, dtype=np.intp)
        self.sign = np.empty(0, dtype=np.float64)

    def get(self, start: int, stop: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        if seed != self.seed or stop > CACHE_MAX:
            return element_hashes(start, stop, seed)
        if stop > self.bucket.size:
            size = min(CACHE_MAX, max(stop, 2 * self.bucket.size))
            self.bucket, self.sign = element_hashes(0, size, seed)
        return self.bucket[start:stop], self.sign[start:stop]


_CACHE = _HashCache()


def sample_positions(numel: int, seed: int = SEED, count: int = SAMPLE) -> np.ndarray:
    """The shared positions of a tensor of `numel` elements, increasing: every element when numel <= count;
    else one per stratum j (elements floor(j*n/count) .. floor((j+1)*n/count) - 1), at
    lo_j + mix64(base + j) mod (hi_j - lo_j) with base = mix64(~seed ^ numel)."""
    if numel <= count:
        return np.arange(numel, dtype=np.int64)
    j = np.arange(count + 1, dtype=np.uint64)
    bounds = (j * np.uint64(numel)) // np.uint64(count)  # j*n < 2^53 for n < 2^40
    lo, hi = bounds[:-1], bounds[1:]
    base = mix64_int((~seed & MASK64) ^ numel)
    with np.errstate(over="ignore"):
        h = mix64(j[:-1] + np.uint64(base))
    return (lo + h % (hi - lo)).astype(np.int64)


@dataclass
class TensorSummary:
    """One tensor's summary: exact statistics, the count-sketch and the shared-position sample."""

    order: int
    name: str
    stats: dict[str, Any]
    sketch: np.ndarray  # BUCKETS float64
    sample: np.ndarray  # the values at sample_positions(numel), in the tensor's dtype
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return int(self.stats["numel"])

    @property
    def exact_sample(self) -> bool:
        """Whether the sample holds every element (small tensors)."""
        return self.sample.size == self.numel


def summarize(array: np.ndarray, order: int = 0, name: str = "", seed: int = SEED) -> TensorSummary:
    """The summary of one tensor, as every harness computes it while writing it (flat, row-major)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    sketch = np.zeros(BUCKETS, dtype=np.float64)
    totals = _Totals()
    for start in range(0, flat.size, CHUNK):
        values = flat[start:start + CHUNK].astype(np.float64)
        totals.add(values)
        if not totals.clean:
            values[~np.isfinite(values)] = 0.0  # a NaN or Inf would swamp its bucket: the stats count them
        bucket, sign = _CACHE.get(start, start + values.size, seed)
        sketch += np.bincount(bucket, weights=values * sign, minlength=BUCKETS)
    positions = sample_positions(flat.size, seed)
    dtype = flat.dtype.name if flat.dtype.name in DTYPES else "float32"
    sample = flat[positions].astype(DTYPES[dtype])
    return TensorSummary(order, name, totals.stats(flat.size), sketch, sample, dtype)


def sketch_and_sample(array: np.ndarray, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """The count-sketch and the shared-position sample alone (the statistics are known elsewhere)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    sketch = np.zeros(BUCKETS, dtype=np.float64)
    for start in range(0, flat.size, CHUNK):
        values = flat[start:start + CHUNK].astype(np.float64)
        finite = np.isfinite(values)
        if not finite.all():
            values[~finite] = 0.0
        bucket, sign = _CACHE.get(start, start + values.size, seed)
        sketch += np.bincount(bucket, weights=values * sign, minlength=BUCKETS)
    return sketch, flat[sample_positions(flat.size, seed)].copy()


_SKETCHES: "OrderedDict[tuple, TensorSummary]" = OrderedDict()
SKETCH_CACHE_ENTRIES = 4096  # ~40 KB each at most: a few hundred MB for the largest models


def cached_sketch(path: Path, order: int, name: str, stats: dict[str, Any], read) -> TensorSummary:
    """The summary of a tensor held whole in the file at `path` (`read()` gives it), computed once per file
    version: a sketch-first collection re-analyses against the same golden every round."""
    try:
        st = os.stat(path)
        key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size, int(order))
    except OSError:
        key = None
    if key is not None and key in _SKETCHES:
        _SKETCHES.move_to_end(key)
        return _SKETCHES[key]
    array = read()
    sketch, sample = sketch_and_sample(array)
    dtype = array.dtype.name if array.dtype.name in DTYPES else "float32"
    summary = TensorSummary(int(order), name, stats, sketch, sample.astype(DTYPES[dtype]), dtype)
    if key is not None:
        _SKETCHES[key] = summary
        while len(_SKETCHES) > SKETCH_CACHE_ENTRIES:
            _SKETCHES.popitem(last=False)
    return summary


class _Totals:
    """Exact statistics over chunks (float64 sums of the finite values)."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(STAT_FIELDS[1:], 0)
        self.lo, self.hi, self.sum, self.sumsq = math.inf, -math.inf, 0.0, 0.0
        self.clean = True

    def add(self, values: np.ndarray) -> None:
        finite = np.isfinite(values)
        self.clean = bool(finite.all())
        if not self.clean:
            self.counts["n_nan"] += int(np.isnan(values).sum())
            self.counts["n_posinf"] += int((values == np.inf).sum())
            self.counts["n_neginf"] += int((values == -np.inf).sum())
            values = values[finite]
        if values.size == 0:
            return
        self.lo, self.hi = min(self.lo, float(values.min())), max(self.hi, float(values.max()))
        self.sum += float(values.sum())
        self.sumsq += float(np.dot(values, values))
        mags = np.abs(values)
        zeros = int(np.count_nonzero(mags == 0))
        self.counts["n_zero"] += zeros
        self.counts["n_fp16_overflow"] += int(np.count_nonzero(mags > FP16_MAX))
        self.counts["n_fp16_saturated"] += int(np.count_nonzero(mags == FP16_MAX))
        self.counts["n_fp16_underflow"] += int(np.count_nonzero(mags < FP16_MIN_NORMAL)) - zeros

    def stats(self, numel: int) -> dict[str, Any]:
        empty = self.lo > self.hi
        return {"numel": numel, **self.counts, "min": math.nan if empty else self.lo,
                "max": math.nan if empty else self.hi, "sum": self.sum, "sumsq": self.sumsq}


class SummaryWriter:
    """Writes `summary.jsonl` + `summary.bin` beside a raw dump, one tensor at a time (bytes first, then
    the line that points at them, flushed: a harness that dies leaves every summary it finished)."""

    def __init__(self, directory: Path | str, seed: int = SEED) -> None:
        self.path = Path(directory)
        self.seed = seed
        self._data = open(self.path / SUMMARY_DATA, "wb")
        self._lines = open(self.path / SUMMARY_LINES, "w", encoding="utf-8")
        self._offset = 0
        self._line({"record": "header", "format": SUMMARY_FORMAT, "format_version": SUMMARY_VERSION, "hash": HASH,
                    "seed": seed, "buckets": BUCKETS, "sample": SAMPLE})

    def add(self, order: int, name: str, array: np.ndarray) -> TensorSummary:
        summary = summarize(array, order, name, self.seed)
        sample = np.ascontiguousarray(summary.sample)
        sketch = b"" if summary.exact_sample else summary.sketch.astype("<f8").tobytes()  # the sample is the tensor
        self._data.write(sketch)
        self._data.write(sample.tobytes())
        self._data.flush()
        line = {"record": "tensor", "order": order, "name": name, "offset": self._offset, "dtype": summary.dtype,
                "sample_count": int(sample.size), **{k: summary.stats[k] for k in STAT_FIELDS},
                **{k: _json_float(summary.stats[k]) for k in FLOAT_FIELDS}}
        self._line(line)
        self._offset += len(sketch) + sample.nbytes
        return summary

    def close(self) -> None:
        self._data.close()
        self._lines.close()

    def _line(self, record: dict[str, Any]) -> None:
        self._lines.write(json.dumps(record, allow_nan=False) + "\n")
        self._lines.flush()


def _json_float(value: float) -> float | None:
    """Finite floats as numbers; NaN and infinities as null (JSON has neither)."""
    return value if math.isfinite(value) else None


@dataclass
class Summaries:
    """A parsed summary file: per tensor order, its summary (sketch and sample read at once: they are small)."""

    path: Path
    seed: int
    tensors: dict[int, TensorSummary] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def by_name(self) -> dict[str, TensorSummary]:
        return {s.name: s for s in self.tensors.values()}


def has_summary(directory: Path | str) -> bool:
    return (Path(directory) / SUMMARY_LINES).is_file()


def read_summaries(directory: Path | str, *, small: bool = True) -> Summaries:
    """Parse and check `summary.jsonl` + `summary.bin`; a bad file raises `DumpFormatError` naming file and line.
    A line cut short (a harness that died) is dropped; its tensor simply has no summary. `small=False` leaves
    out the tensors whose sample is the whole tensor (their sketch is computed from it: worth it only for a
    tensor left on the device)."""
    root = Path(directory)
    lines_path, data_path = root / SUMMARY_LINES, root / SUMMARY_DATA
    if not lines_path.is_file():
        raise DumpFormatError(f"{root}: no {SUMMARY_LINES} (the harness wrote no summary; collect with --full)")
    if lines_path.stat().st_size > MAX_SUMMARY_LINES_BYTES:
        raise DumpFormatError(f"{lines_path}: {lines_path.stat().st_size} bytes is larger than any real summary")
    data = data_path.read_bytes() if data_path.is_file() else b""
    text = lines_path.read_bytes()
    raw_lines = text.split(b"\n")
    records = [(n, raw) for n, raw in enumerate(raw_lines if text.endswith(b"\n") else raw_lines[:-1], 1) if raw.strip()]
    if not records:
        raise DumpFormatError(f"{lines_path}: empty (the harness died before writing its header)")
    header = _json_line(lines_path, *records[0])
    seed = _check_header(lines_path, header)
    result = Summaries(root, seed)
    for number, raw in records[1:]:
        record = _json_line(lines_path, number, raw)
        if record.get("record") == "tensor":
            if not small and _whole_sample(record):
                continue
            summary = _parse_tensor(f"{lines_path}:{number}", record, data)
            if summary is None:
                result.problems.append(f"{lines_path}:{number}: its bytes lie past the end of {SUMMARY_DATA}; skipped")
                continue
            result.tensors[summary.order] = summary
    return result


def _whole_sample(record: dict[str, Any]) -> bool:
    """A tensor line whose sample holds every element (numel <= SAMPLE)."""
    numel = record.get("numel")
    return isinstance(numel, int) and not isinstance(numel, bool) and 0 <= numel <= SAMPLE


def _json_line(path: Path, number: int, raw: bytes) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):
        raise DumpFormatError(f"{path}:{number}: not valid JSON") from None
    if not isinstance(record, dict):
        raise DumpFormatError(f"{path}:{number}: expected a JSON object")
    return record


def _check_header(path: Path, header: dict[str, Any]) -> int:
    if header.get("record") != "header" or header.get("format") != SUMMARY_FORMAT:
        raise DumpFormatError(f"{path}:1: not a layerdiff summary header (format != {SUMMARY_FORMAT!r})")
    version = header.get("format_version")
    if not isinstance(version, int) or version > SUMMARY_VERSION:
        raise DumpFormatError(f"{path}:1: summary format version {version!r} is not supported "
                              f"(this layerdiff reads {SUMMARY_VERSION})")
    if header.get("hash") != HASH or header.get("buckets") != BUCKETS or header.get("sample") != SAMPLE:
        raise DumpFormatError(f"{path}:1: summary made with hash {header.get('hash')!r}, {header.get('buckets')!r} "
                              f"buckets and {header.get('sample')!r} samples; this layerdiff reads {HASH}, "
                              f"{BUCKETS} and {SAMPLE}")
    seed = header.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MASK64:
        raise DumpFormatError(f"{path}:1: seed {seed!r} is not a 64-bit unsigned integer")
    return seed


def _parse_tensor(where: str, rec: dict[str, Any], data: bytes) -> TensorSummary | None:
    """One tensor line, checked against FORMATS.md's types and the data file's size."""
    ints = ("order", "offset", "sample_count", *STAT_FIELDS)
    for key in ints:
        if isinstance(rec.get(key), bool) or not isinstance(rec.get(key), int) or rec[key] < 0:
            raise DumpFormatError(f"{where}: summary field {key!r} must be a non-negative integer")
    for key in FLOAT_FIELDS:
        if rec.get(key) is not None and (isinstance(rec[key], bool) or not isinstance(rec[key], (int, float))):
            raise DumpFormatError(f"{where}: summary field {key!r} must be a number or null")
    dtype, name = rec.get("dtype"), rec.get("name")
    if dtype not in DTYPES or not isinstance(name, str):
        raise DumpFormatError(f"{where}: summary needs a string name and a dtype of {sorted(DTYPES)}")
    expected = min(rec["numel"], SAMPLE)
    if rec["sample_count"] != expected:
        raise DumpFormatError(f"{where}: sample_count {rec['sample_count']} for {rec['numel']} elements "
                              f"(the format gives {expected})")
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    whole = rec["numel"] <= SAMPLE  # the sample is the tensor: no sketch was written
    sketch_bytes = 0 if whole else BUCKETS * 8
    end = rec["offset"] + sketch_bytes + rec["sample_count"] * itemsize
    if end > len(data):
        return None
    sample = np.frombuffer(data, dtype=DTYPES[dtype], count=rec["sample_count"], offset=rec["offset"] + sketch_bytes).copy()
    stats = {k: int(rec[k]) for k in STAT_FIELDS}
    stats.update({k: _read_float(rec.get(k), k) for k in FLOAT_FIELDS})
    if whole:
        return TensorSummary(int(rec["order"]), name, stats, summarize(sample).sketch, sample, dtype)
    sketch = np.frombuffer(data, dtype="<f8", count=BUCKETS, offset=rec["offset"]).astype(np.float64)
    return TensorSummary(int(rec["order"]), name, stats, sketch, sample, dtype)


def _read_float(value: Any, key: str) -> float:
    """null min/max mean no finite value (NaN); a null sum overflowed float64 (infinite)."""
    if value is None:
        return math.nan if key in ("min", "max") else math.inf
    return float(value)


def summary_bytes(directory: Path | str) -> int:
    """Bytes of the summary files (what a sketch-first pull moves for them)."""
    root = Path(directory)
    return sum(os.path.getsize(root / f) for f in (SUMMARY_LINES, SUMMARY_DATA) if (root / f).is_file())
