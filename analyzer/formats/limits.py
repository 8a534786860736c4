"""Size limits for data from elsewhere, checked before anything is allocated.

A file can declare (or decompress to) far more than it holds. Every reader asks these limits first,
so one crafted dump cannot take the machine's memory: the default per-layer limit is a share of this
machine's RAM (25%), and each limit can be raised or lowered with an environment variable.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Iterable

import numpy as np

from layerdiff.errors import DumpFormatError, LayerdiffError, UsageError

RAM_SHARE = 0.25


def total_ram() -> int:
    """Physical memory of the host in bytes (8 GiB when the OS will not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def env_bytes(name: str, default: int) -> int:
    """A byte limit from the environment (plain integer, or with a K/M/G/T suffix), else `default`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse_bytes(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r}: expected a byte count such as 2G, 512M or 1048576") from None


def parse_bytes(text: str) -> int:
    """'2G' -> 2147483648; refuses negative, non-finite and unparsable values."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    body = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = body[-1:] if body[-1:] in units and body[-1:] else ""
    number = float(body[: len(body) - len(unit)])
    if not math.isfinite(number) or number < 0:
        raise ValueError(text)
    return int(number * units[unit])


def human_bytes(nbytes: float) -> str:
    """A size for messages, precise enough that a value and its limit never print alike."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} bytes"


MAX_TENSOR_BYTES = env_bytes("LAYERDIFF_MAX_TENSOR_BYTES", int(total_ram() * RAM_SHARE))
# Parsing JSON holds about 3.5x the file in Python objects: a quarter of the layer limit keeps its peak under it.
MAX_JSON_BYTES = env_bytes("LAYERDIFF_MAX_JSON_BYTES", MAX_TENSOR_BYTES // 4)
MAX_EXTRACT_BYTES = env_bytes("LAYERDIFF_MAX_EXTRACT_BYTES", 4 * MAX_TENSOR_BYTES)
# ... and at most this many times the archive's own size (float tensors deflate 1-3x; a bomb 1000x),
# never under EXTRACT_FLOOR_BYTES, so a small archive of sparse activations still opens.
MAX_EXTRACT_RATIO = env_bytes("LAYERDIFF_MAX_EXTRACT_RATIO", 100)
EXTRACT_FLOOR_BYTES = 1 << 30


def extract_limit(archive_bytes: int) -> int:
    """Bytes an archive of `archive_bytes` may extract to: proportional to it, within the absolute cap."""
    return min(MAX_EXTRACT_BYTES, max(EXTRACT_FLOOR_BYTES, MAX_EXTRACT_RATIO * archive_bytes))
MAX_DIM_PRODUCT = 1 << 62
# One HDF5 attribute (provenance and friends are a few KiB): read only after its size is known.
MAX_ATTR_BYTES = env_bytes("LAYERDIFF_MAX_ATTR_BYTES", 16 << 20)


def checked_numel(shape: Iterable, where: str) -> int:
    """Elements of a declared shape; refuses non-integer, negative, infinite or overflowing dims."""
    dims = list(shape)
    numel = 1
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise DumpFormatError(f"{where}: invalid shape {_short_shape(dims)} (dimensions must be integers)")
        dim = int(dim)
        if dim < 0:
            raise DumpFormatError(f"{where}: invalid shape {_short_shape(dims)} (negative dimension)")
        numel *= max(dim, 1)
        if numel > MAX_DIM_PRODUCT:
            raise DumpFormatError(f"{where}: invalid shape {_short_shape(dims)} (element count overflows)")
    return 0 if any(int(d) == 0 for d in dims) else numel


def check_tensor_bytes(shape: Iterable, itemsize: int, where: str, limit: int | None = None) -> int:
    """Bytes a declared tensor needs; refuses it before allocation when over the per-layer limit."""
    limit = MAX_TENSOR_BYTES if limit is None else limit
    numel = checked_numel(shape, where)
    nbytes = numel * int(itemsize)
    if nbytes > limit:
        raise DumpFormatError(
            f"{where}: declares {numel} elements ({human_bytes(nbytes)}), over the {human_bytes(limit)} per-layer limit "
            "(set LAYERDIFF_MAX_TENSOR_BYTES to allow it)"
        )
    return nbytes


def _short_shape(dims: list) -> str:
    text = str([d for d in dims[:8]])
    return text if len(dims) <= 8 else text[:-1] + ", ...]"


MAX_JSON_DEPTH = 100  # nesting levels; real layerdiff JSON (and every format it imports) nests under 10
_DEPTH_SCAN_BYTES = 1 << 20  # longer texts rely on the parser's own recursion guard (same message)
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def load_json(text: str | bytes, where: str, error: type[LayerdiffError] = DumpFormatError) -> Any:
    """`json.loads` for untrusted text: one line (`error`, naming `where`) for invalid JSON and for
    nesting deeper than MAX_JSON_DEPTH, where the parser alone would raise RecursionError (at about
    1,000 levels, fewer when called deep in a stack) with a traceback."""
    if _nested_deeper(text, MAX_JSON_DEPTH):
        raise error(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep; the file is damaged: regenerate it")
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep; the file is damaged: regenerate it") from None
    except (ValueError, TypeError) as err:
        detail = f"line {err.lineno}: {err.msg}" if isinstance(err, json.JSONDecodeError) else str(err)[:120]
        raise error(f"{where}: not valid JSON ({detail})") from None


def _nested_deeper(text: str | bytes, limit: int) -> bool:
    """Whether brackets outside strings nest deeper than `limit`: free for texts with few brackets
    (every /layers cell), a regex scan for short ones, left to the parser for long ones."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if len(text) > _DEPTH_SCAN_BYTES or text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for token in _JSON_TOKENS.finditer(text):
        mark = token.group()
        if mark in ("[", "{"):
            depth += 1
            if depth > limit:
                return True
        elif mark in ("]", "}"):
            depth -= 1
    return False


def check_plain_file(path: "os.PathLike[str] | str", error: type[LayerdiffError] = DumpFormatError,
                     *, follow: bool = False) -> os.stat_result:
    """The stat of a regular file, refusing what a reader must not open: inside a folder a symbolic
    link (`tensors.bin -> /etc/passwd` would land in the output), and anywhere a FIFO, device or
    socket (opening a FIFO waits forever for a writer). `follow`: a path the user named themselves."""
    import stat

    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror or err})") from None
    if stat.S_ISLNK(st.st_mode):
        raise error(f"{path}: a symbolic link inside a dump folder is not followed; copy the file it points to in its place")
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise error(f"{path}: {kind}, not a file; give a regular file")
    return st
