"""Measured comparisons kept in the user's layerdiff cache, so one set of runs is measured once.

A sweep ends with its own report, and users then often run `analyze` on the same runs (another
`-o`, `--json`): without this, every layer was read and measured twice. The expensive part of an
analysis, `layerdiff.analyzer.measure.compare.compare_all` (alignment + every metric of every layer), is stored as
one `results-<key>.json` entry of the cache that also holds conversions (`layerdiff.analyzer.importers.convcache`: the
user's private XDG cache directory, bounded least-recently-used first, shown and emptied by
`analyze cache`), and reused when the same dumps are analyzed with the same options. The entry also keeps
the model outputs a task decodes (`Comparison.outputs`: both sides of each run-vs-reference pair, up to
16 MiB each, their raw bytes in a side file `results-<key>.outputs`), so a changed `--task` re-judges without
opening a tensor.

The key covers everything the measurement depends on: each dump's path, size, modification time
and inode (a rewritten dump gets a new key), the pairing, the name rules, the tolerances (atol, rtol: what the allclose share counts; the
thresholds only judge, so a changed threshold reuses the entry) and the
analyzer's own code (a hash of its sources, so a changed metric or alignment is never answered from
an entry measured by older code, even in a development install where the version stays the same). Entries are
plain JSON, tables one column at a time (layerdiff.analyzer.formats.jsontable), and any entry that does not load
is ignored and recomputed. A cache that cannot be used (read-only,
owned by someone else) is never an error: the analysis just is not stored.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator

import numpy as np
import orjson

from layerdiff.analyzer.importers import convcache
from layerdiff.analyzer.align.byname import NameRules, PairAlignment
from layerdiff.analyzer.measure.comparison import Comparison
from layerdiff.errors import LayerdiffError
from layerdiff.analyzer.formats.atomic import atomic_write_chunks
from layerdiff.analyzer.formats.jsontable import array_ref, checked_array_ref, read_array_ref, table_chunks, table_frame
from layerdiff.analyzer.runs.reference import Plan
from layerdiff.analyzer.measure.tolerances import Tolerances
from layerdiff.analyzer.formats.fingerprint import code_fingerprint
from layerdiff.analyzer.measure.storage import StorageEvidence

PREFIX = "results-"
FORMAT = 9  # 3: numeric columns as bytes; 4: rows measured, not judged (status `measured`); 5: storage evidence;
# 6: the model outputs a task decodes; 8: the runs' /layers tables moved to their dump headers (runs/dumpheaders.py);
# 9: the model outputs' bytes in a side file (`results-<key>.outputs`)
OUTPUTS_SUFFIX = ".outputs"


def cache_key(plan: Plan, rules: NameRules, tolerances: Tolerances) -> str:
    runs = {id(r): r for p in plan.pairs for r in (p.base, p.other)}
    files = []
    for run in runs.values():
        st = run.path.stat()
        files.append([str(run.path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, run.label])
    identity = {
        "code": code_fingerprint(), "files": sorted(files),
        "pairs": [[str(p.base.path.resolve()), str(p.other.path.resolve()), p.kind] for p in plan.pairs],
        "rules": [sorted(rules.name_map.items()), [[r.pattern, s] for r, s in rules.regex], rules.builtin],
        "tolerances": [tolerances.atol, tolerances.rtol],
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]


def entry_path(key: str) -> Path | None:
    """Where the entry for `key` lives, or None when the user's cache cannot be used."""
    try:
        return convcache.cache_dir() / f"{PREFIX}{key}.json"
    except (LayerdiffError, OSError):
        return None


def load(plan: Plan, key: str) -> Comparison | None:
    """The stored comparison for `key` attached to this plan, or None (absent, damaged, stale)."""
    path = entry_path(key)
    if path is None:
        return None
    try:
        doc = orjson.loads(path.read_bytes())
        if doc.get("key") != key or doc.get("format") != FORMAT or len(doc["alignments"]) != len(plan.pairs):
            return None
        alignments = [PairAlignment(**{part: table_frame(a[part]) for part in ("matched", "only_base", "only_other")})
                      for a in doc["alignments"]]
        table = table_frame(doc.pop("table"))
        convcache.touch(path)  # recently used entries survive the trimming
        storage = {str(label): StorageEvidence(*(int(v) for v in counts)) for label, counts in doc["storage"].items()}
        outputs = _kept_outputs(path, doc["outputs"])
        return Comparison(plan=plan, table=table, alignments=alignments, graphs={},  # built when judging asks
                          problems=[str(p) for p in doc["problems"]], storage=storage, outputs=outputs)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None


def _kept_outputs(path: Path, refs: list) -> dict[tuple[str, int], dict]:
    """(dump, order) -> where a kept model output's bytes are in the entry's side file (checked, not read)."""
    if not refs:
        return {}
    side = path.with_suffix(OUTPUTS_SUFFIX)
    size = side.stat().st_size  # absent (trimmed apart from its entry): the entry is measured again
    convcache.touch(side)
    return {(str(dump), int(order)): checked_array_ref(ref, side, size) for dump, order, ref in refs}


def store(comparison: Comparison, key: str) -> None:
    path = entry_path(key)
    if path is None:
        return
    try:
        side = path.with_suffix(OUTPUTS_SUFFIX)
        refs = _store_outputs(comparison, side)
        atomic_write_chunks(path, _document(comparison, key, refs))
        convcache.trim(keep=path, added=[side, path])
    except (OSError, LayerdiffError, ValueError):
        pass


def _store_outputs(comparison: Comparison, side: Path) -> list:
    """The kept model outputs' bytes into the side file, one after another (written before the entry that
    points into it); returns each one's [dump, order, reference]."""
    refs: list = []

    def chunks() -> Iterator[bytes]:
        offset = 0
        for (dump, order), values in comparison.outputs.items():
            array = np.ascontiguousarray(values if isinstance(values, np.ndarray) else read_array_ref(values))
            refs.append([dump, order, array_ref(array, offset)])
            offset += array.nbytes
            yield array.tobytes()

    if comparison.outputs:
        atomic_write_chunks(side, chunks())
    return refs


def _document(comparison: Comparison, key: str, outputs: list) -> Iterator[bytes]:
    head = {"key": key, "format": FORMAT, "problems": comparison.problems,
            "storage": {label: [e.informative, e.fp16_exact, e.bf16_exact] for label, e in comparison.storage.items()}}
    yield orjson.dumps(head)[:-1] + b',"alignments":['
    for i, alignment in enumerate(comparison.alignments):
        yield b"," if i else b""
        yield b'{"matched":'
        yield from table_chunks(alignment.matched)
        yield b',"only_base":'
        yield from table_chunks(alignment.only_base)
        yield b',"only_other":'
        yield from table_chunks(alignment.only_other)
        yield b"}"
    yield b'],"table":'
    yield from table_chunks(comparison.table)
    yield b',"outputs":' + orjson.dumps(outputs) + b"}"  # [dump file, order, where its bytes are]

