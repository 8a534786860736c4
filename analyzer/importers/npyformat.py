"""Reading `.npy` payloads (files, `.npz` members, Polygraphy's base64 blobs) without trusting them.

`np.load` allocates whatever the header declares before reading, and for zip members it allocates
the whole array up front. Here the header is parsed with numpy's own parser (`numpy.lib.format`,
which uses `ast.literal_eval`, never pickle), the declared size is checked against the bytes that
really follow, and only then are exactly those bytes read.
"""
from __future__ import annotations

import io
import tokenize
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npformat

from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.importers.common import check_declared_size, checked_array

MAX_HEADER = 10_000


def read_npy(stream: BinaryIO, total_bytes: int, where: str) -> np.ndarray:
    """One array from an `.npy` stream holding `total_bytes` bytes in all."""
    try:
        version = npformat.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(stream, max_header_size=MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npformat.read_array_header_2_0(stream, max_header_size=MAX_HEADER)
        else:
            raise DumpFormatError(f"{where}: unsupported .npy version {version}")
    except (ValueError, EOFError, SyntaxError, TypeError, tokenize.TokenError, RecursionError) as err:
        raise DumpFormatError(f"{where}: not a valid .npy array ({_first_line(err)})") from None
    if dtype.hasobject:
        raise DumpFormatError(f"{where}: holds Python objects (pickled data is never loaded)")
    checked_array(np.empty(0, dtype=dtype), where)  # refuse string/complex/structured before reading
    available = total_bytes - stream.tell()
    nbytes = check_declared_size(tuple(shape), dtype.itemsize, available, where)
    array = _read_exactly(stream, nbytes, where).view(dtype)
    if fortran:
        return array.reshape(shape[::-1]).transpose()
    return array.reshape(shape)


def read_npy_bytes(data: bytes, where: str) -> np.ndarray:
    return read_npy(io.BytesIO(data), len(data), where)


def _read_exactly(stream: BinaryIO, nbytes: int, where: str) -> np.ndarray:
    """Exactly `nbytes` into one buffer allocated once (peak memory = the tensor, not twice it)."""
    out = np.empty(nbytes, dtype=np.uint8)
    view = memoryview(out)
    done = 0
    while done < nbytes:
        block = stream.read(min(nbytes - done, 1 << 24))
        if not block:
            raise DumpFormatError(f"{where}: data ends {nbytes - done} bytes early (truncated file)")
        view[done:done + len(block)] = block
        done += len(block)
    return out


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:160] if text else type(err).__name__
