"""Files that appear only when complete: written to `.<name>.partial` beside the target, then renamed.

Reports, stored measurements and index files are often rewritten in place; a crash half-way must never
leave a truncated file next to fresh ones, nor a 0-byte `.partial` after a full disk.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from layerdiff.analyzer.formats.diskspace import writing


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to `.<name>.partial` beside the target, then rename over it."""
    atomic_write_chunks(path, [data], len(data))


def atomic_write_chunks(path: Path, chunks: Iterable[bytes], need: int = 0) -> None:
    """`atomic_write_bytes` for a file produced piece by piece, so it is never whole in memory."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        with writing(path, need):
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk never leaves a 0-byte .partial behind
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
