"""MNN's own per-op text dumps (MNNV2Basic.out / ModuleBasic.out with runMask & 1).

Layout, from MNN's tools/cpp sources: the tool runs in a working directory and writes
- `output/<op>_<i>` for output i of every op ('/' in op names replaced by '_'; no extension):
  one text row per slice of the last dimension, each value followed by a tab; floats printed
  with the C++ stream default of 6 significant digits; 1-D tensors one value per row;
- `output/Input_<op>_<i>` for op inputs (ModuleBasic always; MNNV2Basic with runMask & 2);
- the final outputs as `output.txt`, `output/<name>.txt` or `output/<repeat>_<i>.txt`;
- an order file listing every file path in the order written: `.order` (MNNV2Basic) or
  `order.txt` (ModuleBasic), in the working directory.
There is no shape file: shapes come from a saved console log (see mnn_log), a `shapes.json`
(`{"<file name or op name>": [dims]}`), else the tensor is stored flat.
Paths in the order file are never opened: only their base names are matched against the plain
files that really are in `output/`, so an order file cannot point outside the dump.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.importers.common import MAX_TEXT_BYTES, ForeignDump, Layer, apply_order, read_order_file
from layerdiff.analyzer.importers.mnn_log import MnnLog, logged_shape, parse_mnn_log
from layerdiff.analyzer.importers.mnnnames import split_mnn_file_name

MNN_FORMAT = "mnn-text"
ORDER_FILES = (".order", "order.txt")
LOG_NAMES = ("stdout.txt", "log.txt", "stdout", "console.txt")
CHUNK_TOKENS = 1 << 20
MAX_ENTRIES_SCANNED = 100_000
_NUMBER = re.compile(rb"[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|nan|-?inf|NAN|-?INF|-?nan)")


def locate(path: Path) -> tuple[Path, Path] | None:
    """(working directory, output directory) of an MNN dump, or None; found by content, not by names.

    A colleague's dump often arrives renamed: the working directory, the `output/` folder, or both,
    with `.order` inside the output folder or beside it. So a directory is an MNN dump when it (or one
    of its sub-directories) holds op files whose content is MNN's numeric text; the working
    directory is wherever the order file is.
    """
    if not path.is_dir() or path.is_symlink():
        return None
    if (path / "output").is_dir() and any(_is_op_dump(p) for p in _children(path / "output")):
        return path, path / "output"  # MNN's own layout: a damaged file is reported, not a reason to skip
    if _has_dump_files(path):
        if not _has_order_file(path) and _has_order_file(path.parent):
            return path.parent, path
        return path, path
    if _has_order_file(path):
        subs = [d for d in _children(path) if d.is_dir() and not d.is_symlink() and _has_dump_files(d)]
        if len(subs) == 1:
            return path, subs[0]
    return None


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())[:MAX_ENTRIES_SCANNED]
    except OSError:
        return []


def _has_order_file(directory: Path) -> bool:
    return any((directory / n).is_file() for n in ORDER_FILES)


def detect_mnn_text(path: Path) -> bool:
    return locate(path) is not None


def _has_dump_files(directory: Path) -> bool:
    """Op files named `<op>_<i>` whose first bytes are MNN's numeric text (tab-separated numbers)."""
    dumps = [p for p in _children(directory) if _is_op_dump(p)]
    return bool(dumps) and _numeric_text(dumps[0])


def _numeric_text(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    words = head.split()[:-1] if len(head) == 256 else head.split()  # the last word may be cut
    return all(_NUMBER.fullmatch(w) for w in words)


def _is_op_dump(p: Path) -> bool:
    return p.is_file() and not p.is_symlink() and p.suffix != ".txt" and "_" in p.name and p.name[-1].isdigit()


def read_mnn_text(path: Path, order_file: Path | None = None, shapes_file: Path | None = None,
                  include_inputs: bool = False) -> ForeignDump:
    where = locate(path)
    if where is None:
        raise DumpFormatError(f"{path}: not an MNN dump directory (no output/<op>_<i> files)")
    root, out_dir = where
    dump = ForeignDump(source=path, format=MNN_FORMAT, attrs={"engine": "mnn", "precision_effective": ""})
    files, skipped = _dump_files(out_dir, include_inputs, dump)
    names = _ordered(root, files, order_file, dump)
    log, shapes = _shape_sources(root, out_dir, shapes_file, dump)
    dump.attrs.update(log.attrs)
    dump.provenance.update({"skipped_files": skipped, "text_precision": "6 significant digits (C++ stream default)"})
    for stem in names:
        dump.layers.append(_layer(files[stem], stem, log, shapes))
    return dump


def _dump_files(out_dir: Path, include_inputs: bool, dump: ForeignDump) -> tuple[dict[str, Path], dict[str, int]]:
    files: dict[str, Path] = {}
    skipped = {"inputs": 0, "final_outputs": 0, "symlinks": 0}
    for p in out_dir.iterdir():
        if p.is_symlink():
            skipped["symlinks"] += 1
            dump.problems.append(f"{p}: symbolic link ignored (a dump holds plain files)")
        elif p.suffix == ".txt":
            skipped["final_outputs"] += 1
        elif p.name.startswith("Input_") and not include_inputs:
            skipped["inputs"] += 1
        elif _is_op_dump(p):
            files[p.name] = p
    return files, skipped


def _ordered(root: Path, files: dict[str, Path], order_file: Path | None, dump: ForeignDump) -> list[str]:
    by_time = sorted(files, key=lambda n: (files[n].stat().st_mtime_ns, n))
    order_path = Path(order_file) if order_file else next((root / n for n in ORDER_FILES if (root / n).is_file()), None)
    if order_path is None:
        dump.provenance["order_source"] = "file modification time (no .order / order.txt)"
        dump.problems.append(f"{root}: no .order or order.txt file; layers ordered by file time")
        return by_time
    if not order_path.is_file():
        raise DumpFormatError(f"{order_path}: order file not found")
    dump.provenance["order_source"] = str(order_path)
    dump.attrs["harness"] = "MNN ModuleBasic" if order_path.name == "order.txt" else "MNN MNNV2Basic"
    listed = [Path(line.replace("\\", "/")).name for line in read_order_file(order_path)]
    return apply_order(by_time, [n for n in listed if n in files], str(order_path), dump.problems)


def _shape_sources(root: Path, out_dir: Path, shapes_file: Path | None, dump: ForeignDump) -> tuple[MnnLog, dict]:
    log = MnnLog()
    logs = [root / n for n in LOG_NAMES if (root / n).is_file()] + sorted(root.glob("*.log"))
    for candidate in logs:
        if candidate.is_file() and not candidate.is_symlink():
            parsed = parse_mnn_log(candidate)
            log.tensors.update(parsed.tensors)
            log.attrs.update(parsed.attrs)
            dump.provenance.setdefault("shape_sources", []).append(str(candidate))
    shapes: dict = {}
    candidates = [Path(shapes_file)] if shapes_file else [root / "shapes.json", out_dir / "shapes.json"]
    for candidate in candidates:
        if candidate.is_file():
            shapes = _read_shapes_json(candidate)
            dump.provenance.setdefault("shape_sources", []).append(str(candidate))
            break
    return log, shapes


def _read_shapes_json(path: Path) -> dict[str, tuple[int, ...]]:
    try:
        if path.stat().st_size > (64 << 20):
            raise DumpFormatError(f"{path}: shape file too large")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):  # bad JSON or UTF-8, integers with too many digits, nesting
        raise DumpFormatError(f"{path}: not valid JSON (expected {{\"<layer>\": [dims]}})") from None
    if not isinstance(data, dict):
        raise DumpFormatError(f"{path}: expected a JSON object mapping layer names to shapes")
    out = {}
    for name, dims in data.items():
        if isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            out[str(name)] = tuple(dims)
    return out


def _layer(path: Path, stem: str, log: MnnLog, shapes: dict) -> Layer:
    entry = log.tensors.get(stem)
    op, index = (entry.op, entry.output_index) if entry else split_mnn_file_name(stem)

    def load() -> np.ndarray:
        flat, width = read_text_tensor(path)
        return _shaped(flat, width, stem, op, index, entry, shapes, path)

    return Layer(op=op, output_index=index, name=stem, load=load, where=str(path))


def _shaped(flat, width, stem, op, index, entry, shapes, path) -> np.ndarray:
    declared = shapes.get(stem) or shapes.get(f"{op}:{index}") or (shapes.get(op) if index == 0 else None)
    if declared is not None:
        if int(np.prod(declared, dtype=np.int64)) != flat.size:
            raise DumpFormatError(f"{path}: {flat.size} values but the shape file says {list(declared)}")
        return flat.reshape(declared)
    if entry is not None:
        fitted = logged_shape(entry, width, flat.size)
        if fitted is not None:
            return flat.reshape(fitted[0])
    return flat


def read_text_tensor(path: Path) -> tuple[np.ndarray, int]:
    """(flat float32 values, row width) of one MNN text dump; ragged rows are an error."""
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise DumpFormatError(f"{path}: {size} bytes of text, over the {MAX_TEXT_BYTES} byte limit")
    try:
        text = path.read_bytes().decode("ascii")
    except UnicodeDecodeError as err:
        raise DumpFormatError(f"{path}: not a text dump (non-ASCII byte at offset {err.start})") from None
    lines = text.split("\n")
    if lines and lines[-1].strip() == "":
        lines.pop()
    if not lines:
        return np.zeros(0, dtype=np.float32), 1
    width = _row_width(lines[0])
    parts: list[np.ndarray] = []
    batch: list[str] = []
    for number, line in enumerate(lines, start=1):
        row = line.rstrip("\r").rstrip("\t").split("\t")
        if len(row) != width or (width and row[0] == ""):
            raise DumpFormatError(f"{path}:{number}: {len(row)} values in this row, {width} in row 1 (ragged rows)")
        batch.extend(row)
        if len(batch) >= CHUNK_TOKENS:
            parts.append(_to_float(batch, path, number))
            batch = []
    if batch:
        parts.append(_to_float(batch, path, len(lines)))
    return (np.concatenate(parts) if len(parts) > 1 else parts[0]), width


def _row_width(first: str) -> int:
    return len(first.rstrip("\r").rstrip("\t").split("\t"))


def _to_float(tokens: list[str], path: Path, last_line: int) -> np.ndarray:
    try:
        return np.array(tokens).astype(np.float32)
    except ValueError:
        bad = next((t for t in tokens if not _is_number(t)), "?")
        raise DumpFormatError(f"{path}: value {bad[:40]!r} before line {last_line + 1} is not a number") from None


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False
