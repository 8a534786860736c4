"""What a GGUF file asks for as input, read from its header (no weights, no vocabulary loaded).

The `gguf` package's GGUFReader turns every metadata field into numpy arrays up front: on a real
model (Gemma 3 270M, a 262,144-token vocabulary) that took 18 s of CPU and 734 MB before a run could
even be planned. The two facts needed here (the architecture, and for the convolution graph its
kernel's shape) sit at the head of the file, so the header is read as the GGUF spec lays it out and
left as soon as they are known: the architecture is the first key llama.cpp's converters write.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from layerdiff.errors import ModelFormatError

CONV_ARCH = "layerdiff.conv2d"
ARCH_KEY = "general.architecture"
# GGUF value types (gguf.GGUFValueType) and the sizes of the fixed-size ones
STRING, ARRAY = 8, 9
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
MAX_DIMS = 8


class _Header:
    """A GGUF file read field by field from the start (spec: magic, version, counts, key/values, tensor infos)."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path
        magic, version = f.read(4), self._u32()
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"no GGUF v2+ header (magic {magic!r}, version {version})")
        self.n_tensors, self.n_kv = self._u64(), self._u64()

    def _read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("the file ends inside its header")
        return data

    def _u32(self) -> int:
        return struct.unpack("<I", self._read(4))[0]

    def _u64(self) -> int:
        return struct.unpack("<Q", self._read(8))[0]

    def string(self) -> str:
        return self._read(self._u64()).decode("utf-8", errors="replace")

    def skip(self, kind: int) -> None:
        """Step over one value of GGUF type `kind` without building it."""
        if kind in FIXED:
            self.f.seek(FIXED[kind], 1)
        elif kind == STRING:
            self.f.seek(self._u64(), 1)
        elif kind == ARRAY:
            item, count = self._u32(), self._u64()
            if item in FIXED:
                self.f.seek(FIXED[item] * count, 1)
            else:
                for _ in range(count):
                    self.skip(item)
        else:
            raise ValueError(f"unknown GGUF value type {kind}")

    def key_values(self):
        """(key, type) of each metadata field in turn; the caller reads or skips each value."""
        for _ in range(self.n_kv):
            yield self.string(), self._u32()

    def tensor_shapes(self):
        """(name, ne) of each tensor info (after every key/value has been read or skipped)."""
        for _ in range(self.n_tensors):
            name, dims = self.string(), self._u32()
            if dims > MAX_DIMS:
                raise ValueError(f"tensor {name!r} declares {dims} dimensions")
            ne = struct.unpack(f"<{dims}Q", self._read(8 * dims))
            self._read(4 + 8)  # type, offset
            yield name, ne


def architecture(path: Path) -> str:
    """general.architecture; one clear error for a file that is no GGUF."""
    try:
        with open(path, "rb") as f:
            header = _Header(f, path)
            for key, kind in header.key_values():
                if key == ARCH_KEY and kind == STRING:
                    return header.string()
                header.skip(kind)
    except (OSError, ValueError, struct.error, MemoryError) as err:
        raise ModelFormatError(f"{path}: not a readable GGUF model ({type(err).__name__}: {err})") from None
    raise ModelFormatError(f"{path}: not a readable GGUF model (no {ARCH_KEY})")


def tensor_shape(path: Path, wanted: str) -> tuple[int, ...] | None:
    """ggml's ne (fastest axis first) of one tensor, from the tensor infos after the metadata."""
    try:
        with open(path, "rb") as f:
            header = _Header(f, path)
            for _key, kind in header.key_values():
                header.skip(kind)
            for name, ne in header.tensor_shapes():
                if name == wanted:
                    return tuple(int(n) for n in ne)
    except (OSError, ValueError, struct.error, MemoryError) as err:
        raise ModelFormatError(f"{path}: not a readable GGUF model ({type(err).__name__}: {err})") from None
    return None


def input_specs(path: Path) -> dict[str, tuple[tuple[int, ...] | None, str]]:
    """A language model takes token ids (`tokens`, int32, any length); the convolution graph takes
    `x` [1, in_channels, H, W] float32. A prompt goes straight to the harness (`--input prompt=FILE.txt`)."""
    if architecture(path) == CONV_ARCH:
        ne = tensor_shape(path, "conv.weight")  # kw, kh, in, out
        if ne is None or len(ne) < 3:
            raise ModelFormatError(f"{path}: a {CONV_ARCH} GGUF without conv.weight")
        return {"x": ((1, ne[2], -1, -1), "float32")}
    return {"tokens": ((-1,), "int32")}
