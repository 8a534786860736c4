"""What produced a stored measurement or report: the analyzer's own sources, identified by their stat, and the
engine declarations it reads (a dump that does not record its engine's facts is read with its engine folder's
declaration, so editing one changes what such a dump's analysis gives).

A development install changes code without changing its version, so stored results are keyed by
this (`layerdiff.analyzer.measure.resultcache`, `layerdiff.analyzer.report.stored`). Imports nothing
heavy: a stored report is looked up before the analyzer is imported.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Callable, Iterator


def code_fingerprint() -> str:
    """A hash of every analyzer source file's identity and of the engine declarations a dump without recorded
    facts is read with (formats/declared.py): worked out once per set of declarations installed, so a program
    that installs its own gets its own fingerprint, and its own stored results."""
    from layerdiff.analyzer.formats import declared

    return _fingerprint(declared.sources)


@functools.lru_cache(maxsize=4)
def _fingerprint(sources: Callable[[], bytes] | None) -> str:
    package = Path(__file__).resolve().parents[1]  # the whole analyzer package, every room
    digest = hashlib.sha256()
    for name, identity in source_identities(package, ".py"):
        digest.update(f"{name}\0{identity}\0".encode())
    digest.update(b"\0declared\0" + (sources() if sources is not None else b""))
    return digest.hexdigest()[:16]


def source_identities(folder: Path, suffix: str = "", recursive: bool = True) -> Iterator[tuple[str, str]]:
    """(path relative to `folder`, "size mtime inode ctime") of every file under it ending in `suffix`, sorted.

    A source's stat stands for its contents (reading and hashing the ~130 sources was ~5 ms of every
    command): an edit, a checkout or a reinstall changes the modification or the change time, and the change
    time cannot be set back."""
    found = []
    pending = [(folder, "")]
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if recursive and entry.name != "__pycache__":
                        pending.append((Path(entry.path), f"{prefix}{entry.name}/"))
                elif entry.name.endswith(suffix):
                    st = entry.stat()
                    found.append((f"{prefix}{entry.name}", f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {st.st_ctime_ns}"))
    return iter(sorted(found))
