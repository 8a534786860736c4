"""Paddle-Lite's precision profiler dumps (a library built with `--with_precision_profile=ON`).

Layout, from Paddle-Lite's lite/core/profile/precision_profiler.h (v2.13): every run writes into one
directory, `/tmp/PaddleLite_<date>/` (Android: `/storage/emulated/0/PaddleLite_<date>/`):
- `precision_summary.log`: a header block ("Detailed Precision Profiler Summary" and a column line),
  then one line per op output in runtime order, six whitespace-separated fields:
  `<op_type>:<target>/<precision>/<layout>  <var>_<k>:<target>/<precision>/<layout>  {d0,d1,...}
  <mean> <std_deviation> <ave_grow_rate>` (`unused` for a tensor never initialised). `<k>` counts
  the times the variable was written so far (memory reuse and repeated runs append blocks);
- with `PADDLELITE_PRECISION_WRITE_TO_FILE=1`, one `<var>_<k>.txt` per line (`/` in names made `_`):
  line i is `[i] <value>` printed with `%f` (6 decimals; OpenCL tensors converted to float NCHW).
Shapes come from the summary's dims. The last write of each variable keeps the plain Paddle name
(the value Paddle's golden and Paddle-Lite's GetTensor hold after the run); earlier writes keep `_k`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layerdiff.analyzer.importers.common import MAX_TEXT_BYTES, ForeignDump, Layer
from layerdiff.errors import DumpFormatError

PROFILER_FORMAT = "paddle-lite-profiler"
SUMMARY = "precision_summary.log"
HEADER = "Detailed Precision Profiler Summary"
MAX_SUMMARY_BYTES = 256 << 20
_PLACE = r"(\w+)/(\w+)/(\w+)"
_KERNEL = re.compile(rf"^([A-Za-z0-9_]+):{_PLACE}$")
_OUTPUT = re.compile(rf"^(.+):{_PLACE}$")
_DIMS = re.compile(r"^\{(-?\d+(?:,-?\d+)*)?\}$")
DTYPES = {"float": "float32", "float16": "float32", "double": "float64", "int32_t": "int32", "int64_t": "int64",
          "int8_t": "int8", "int16_t": "int16", "uint8_t": "uint8", "bool": "uint8"}


@dataclass
class SummaryLine:
    op_type: str
    kernel_place: tuple[str, str, str]
    written: str  # the name as logged: `<var>_<k>`
    var: str
    place: tuple[str, str, str]
    dims: tuple[int, ...]
    initialised: bool
    line: int


def summary_path(path: Path) -> Path | None:
    """The summary log of a profiler dump given as its directory or as the log itself."""
    candidate = path / SUMMARY if path.is_dir() else path
    if not candidate.is_file() or candidate.is_symlink():
        return None
    try:
        with open(candidate, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return None
    return candidate if HEADER.encode() in head else None


def detect_paddle_profiler(path: Path) -> bool:
    return summary_path(path) is not None


def parse_summary(path: Path) -> tuple[list[SummaryLine], int, list[str]]:
    """The lines of the last run in the log, how many runs it holds, and lines that could not be read."""
    size = path.stat().st_size
    if size > MAX_SUMMARY_BYTES:
        raise DumpFormatError(f"{path}: {size} bytes, more than any precision summary ({MAX_SUMMARY_BYTES})")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DumpFormatError(f"{path}: not a Paddle-Lite precision summary (non-text byte at offset {err.start})") from None
    blocks: list[list[SummaryLine]] = []
    bad: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if HEADER in raw:
            blocks.append([])
            continue
        fields = raw.split()
        if not fields or fields[0] == "operator:(kernel_info)" or not blocks:
            continue
        parsed = _summary_line(fields, number)
        if parsed is None:
            bad.append(f"{path}:{number}: not a summary line ({raw.strip()[:80]!r})")
        else:
            blocks[-1].append(parsed)
    if not blocks:
        raise DumpFormatError(f"{path}: no '{HEADER}' header; not a Paddle-Lite precision summary")
    return blocks[-1], len(blocks), bad


def _summary_line(fields: list[str], number: int) -> SummaryLine | None:
    if len(fields) != 6:
        return None
    kernel, output, dims = _KERNEL.match(fields[0]), _OUTPUT.match(fields[1]), _DIMS.match(fields[2])
    if not (kernel and output and dims):
        return None
    written = output.group(1)
    var, sep, count = written.rpartition("_")
    if not sep or not count.isdigit() or not var:
        return None
    shape = tuple(int(d) for d in dims.group(1).split(",")) if dims.group(1) else ()
    if any(d < 0 for d in shape):
        return None
    return SummaryLine(kernel.group(1), kernel.group(2, 3, 4), written, var, output.group(2, 3, 4), shape,
                       fields[3] != "unused", number)


def read_paddle_profiler(path: Path) -> ForeignDump:
    summary = summary_path(path)
    if summary is None:
        raise DumpFormatError(f"{path}: no {SUMMARY} with a precision profiler header")
    lines, runs, bad = parse_summary(summary)
    if not lines:
        raise DumpFormatError(f"{summary}: the last run in the log lists no op output")
    directory = summary.parent
    dump = ForeignDump(source=path, format=PROFILER_FORMAT, attrs=_attrs(lines))
    dump.problems.extend(bad)
    if runs > 1:
        dump.problems.append(f"{summary}: holds {runs} runs; the last one imported")
    dump.provenance.update({"summary": str(summary), "runs_in_log": runs,
                            "text_precision": "%f: 6 decimals (Paddle-Lite's write_tensorfile)"})
    last = {line.var: line.written for line in lines}
    found = 0
    for line in lines:
        tensor_file = directory / (line.written.replace("/", "_") + ".txt")
        name = line.var if last[line.var] == line.written else line.written
        if not tensor_file.is_file() or tensor_file.is_symlink():
            why = "never initialised" if not line.initialised else "no tensor file (run with PADDLELITE_PRECISION_WRITE_TO_FILE=1)"
            dump.problems.append(f"{summary}:{line.line}: {line.written}: {why}; skipped")
            continue
        found += 1
        dump.layers.append(Layer(op=name, output_index=0, name=name, op_type=line.op_type,
                                 layout="NCHW" if len(line.dims) == 4 else "", where=str(tensor_file),
                                 load=_loader(tensor_file, line)))
    if not found:
        raise DumpFormatError(f"{directory}: no tensor files beside {SUMMARY}; re-run with PADDLELITE_PRECISION_WRITE_TO_FILE=1 "
                              "so the profiler writes each output's values")
    return dump


def _attrs(lines: list[SummaryLine]) -> dict:
    targets = {line.kernel_place[0] for line in lines}
    backend = "opencl" if "opencl" in targets else "cpu"
    fp16 = any(line.place[1] == "float16" or line.kernel_place[1] == "float16" for line in lines)
    return {"engine": "paddle-lite", "backend_actual": backend, "precision_effective": "fp16" if fp16 else "fp32",
            "harness": "Paddle-Lite precision profiler"}


def _loader(tensor_file: Path, line: SummaryLine):
    def load() -> np.ndarray:
        values = read_value_lines(tensor_file)
        expected = math.prod(line.dims)
        if values.size != expected:
            raise DumpFormatError(f"{tensor_file}: {values.size} values but the summary says {list(line.dims)} ({expected})")
        return values.reshape(line.dims).astype(DTYPES.get(line.place[1], "float32"), copy=False)

    return load


def read_value_lines(path: Path) -> np.ndarray:
    """`[i] value` lines, i counting from 0 without gaps (float64: %f of an int64 keeps its digits)."""
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise DumpFormatError(f"{path}: {size} bytes of text, over the {MAX_TEXT_BYTES} byte limit")
    lines = path.read_bytes().splitlines()
    tokens = [line.split() for line in lines]
    bad = next((i for i, t in enumerate(tokens) if len(t) != 2 or t[0] != b"[%d]" % i), None)
    if bad is not None:
        raise DumpFormatError(f"{path}:{bad + 1}: expected '[{bad}] <value>', found {lines[bad][:60]!r}")
    try:
        return np.array([t[1] for t in tokens]).astype(np.float64) if tokens else np.zeros(0)
    except ValueError:
        number = next(i for i, t in enumerate(tokens) if not _is_number(t[1]))
        raise DumpFormatError(f"{path}:{number + 1}: {tokens[number][1][:40]!r} is not a number") from None


def _is_number(token: bytes) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False
