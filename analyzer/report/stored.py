"""Finished reports kept in the user's layerdiff cache: the same analysis asked again is copied, not redone.

A sweep ends with its own report and users then run `analyze` on the same runs (another `-o`,
`--json`, the quick start's second command). The stored measurement
(`layerdiff.analyzer.measure.resultcache`) already spares the metrics, but a re-analysis still imported
pandas, rebuilt the findings, the summary and a page of several MB: about 2x the floor of merely
reading the stored table. A finished report depends on nothing but the files it read, the options
and the code that made it, so it is kept whole, as one entry `report-<key>/` of the same cache
(private, bounded, least recently used first, emptied by `analyze cache clean`): the report's
files (second names of the report's own files where the file system allows, else copies; an entry whose
file changed since is not used) plus `view.json`, what the console printed (the verdict rows, the findings,
the problems).

The key is made before anything heavy is imported and covers everything the report depends on:
- every file the analysis would read (the same discovery, `layerdiff.analyzer.runs.discovery`): path,
  size, modification time, inode, change time; a raw dump directory by each file inside it; the
  `fix.json` files the page shows (`layerdiff.analyzer.report.fixsection`);
- every option: reference, its input, `--set`, `--task`, the thresholds, `--png`, the name rules;
- the code: a hash of the analyzer's and layerdiff's own sources (a development install changes
  code without changing its version) and the versions of the libraries whose output lands in the
  page (plotly.js and the DataTables bundle are inlined; numpy/pandas format numbers);
- the `LAYERDIFF_*` settings other than where the cache lives (size limits change what is read).
Anything else (a renamed option, a name map, a file that cannot be checked) just means no entry:
the analysis runs as usual. A damaged or partial entry is ignored and replaced. The one field that
is not re-made is results.json's `created`: it says when the analysis was made.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from layerdiff.analyzer.findings.thresholds import Thresholds
from layerdiff.analyzer.importers import convcache
from layerdiff.analyzer.report.outdir import atomic_write_chunks, finish_out_dir, prepare_out_dir
from layerdiff.errors import LayerdiffError
from layerdiff.identity import file_stat, library_stat

PREFIX = "report-"
VIEW = "view.json"  # written last: an entry without it is incomplete
COPY_CHUNK = 1 << 20
FORMAT = 2
# Libraries whose code or bundled scripts end up in the report's bytes.
LIBRARIES = ("numpy", "pandas", "h5py", "orjson", "plotly", "itables", "matplotlib")
# LAYERDIFF_* settings that say where things live, not what an analysis reads or writes.
PLACE_SETTINGS = ("LAYERDIFF_CACHE", "LAYERDIFF_CACHE_DIR", "LAYERDIFF_CACHE_MAX_BYTES")


@dataclass(frozen=True)
class StoredReport:
    """One complete entry: its folder, the report files in it and the console view."""

    folder: Path
    files: tuple[str, ...]
    view: dict[str, Any]

    @property
    def results_json(self) -> Path:
        return self.folder / "results.json"


def report_key(paths: Iterable[Path | str], *, png: bool = False, ref: Path | str | None = None,
               ref_input: str | None = None, set_attrs: dict | None = None, task: str | None = None,
               thresholds: Thresholds | None = None, rules=None) -> str | None:
    """The key of the report these arguments ask for, or None when it cannot be told safely.

    `rules` is a `NameRules` (or None): only the built-in rules on or off are keyed; a name map or
    renames make no key (their identity is a file's or a regex's meaning, not worth the risk)."""
    builtin = True
    if rules is not None:
        if rules.name_map or rules.regex:
            return None
        builtin = bool(rules.builtin)
    return key_for(paths, png=png, ref=ref, ref_input=ref_input, set_attrs=set_attrs, task=task,
                   thresholds=thresholds, builtin_rules=builtin)


def key_for(paths: Iterable[Path | str], *, png: bool, ref: Path | str | None, ref_input: str | None,
            set_attrs: dict | None, task: str | None, thresholds: Thresholds | None, builtin_rules: bool) -> str | None:
    """`report_key` from plain values (the CLI's options, before NameRules exists)."""
    from layerdiff.analyzer.runs.discovery import discover

    paths = list(paths)
    if ref is not None and Path(ref).exists():
        paths.append(Path(ref))  # as analyze_paths does
    try:
        candidates, problems = discover(paths)
        identity = {
            "format": FORMAT, "code": code_identity(), "settings": _settings(),
            "inputs": [[str(c), str(Path(o).resolve()), _file_identity(c), _fix_identity(c)] for c, o in candidates],
            "problems": problems, "png": bool(png),
            "ref": str(Path(ref).resolve()) if ref is not None else None, "ref_input": ref_input,
            "set": set_attrs or {}, "task": task, "thresholds": (thresholds or Thresholds()).as_dict(),
            "builtin_rules": bool(builtin_rules),
        }
        text = json.dumps(identity, sort_keys=True, default=str)
    except (OSError, LayerdiffError, TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _file_identity(path: Path) -> list:
    """A file by its stat; a dump directory by every file inside (a rewrite changes one of them)."""
    if path.is_dir():
        return [[str(p.relative_to(path)), file_stat(p)] for p in sorted(path.rglob("*")) if p.is_file()]
    return file_stat(path)


def _fix_identity(path: Path) -> list:
    """The fix.json files the page would show for a run found here (see fixsection.fix_documents)."""
    from layerdiff.analyzer.report.fixsection import FIX_JSON

    out = []
    for folder in (path.parent, path.parent.parent):
        candidate = folder / FIX_JSON
        if candidate.is_file():
            out.append([str(candidate), file_stat(candidate)])
    return out


def _settings() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("LAYERDIFF_") and k not in PLACE_SETTINGS}


def code_identity() -> dict[str, str]:
    """What made a report: a hash of the analyzer's and layerdiff's sources (the engine declarations installed
    included: formats/fingerprint.py), and the libraries installed."""
    from layerdiff.analyzer.formats.fingerprint import code_fingerprint

    files, libraries = _page_sources_and_libraries()
    return {"sources": hashlib.sha256(code_fingerprint().encode() + files).hexdigest()[:16], **libraries}


@functools.lru_cache(maxsize=1)
def _page_sources_and_libraries() -> tuple[bytes, dict[str, str]]:
    """layerdiff's own sources and the page's web assets by their stat, and the libraries installed: the same
    for the whole process."""
    import layerdiff
    from layerdiff.analyzer.formats.fingerprint import source_identities

    root = Path(layerdiff.__file__).resolve().parent
    web = Path(__file__).resolve().parent / "web"
    files = b"".join(f"{name}\0{identity}\0".encode()
                     for name, identity in [*source_identities(root, ".py", recursive=False), *source_identities(web)])
    return files, {name: _library_identity(name) for name in LIBRARIES}


def _library_identity(name: str) -> str:
    """An installed library by its package file's stat (layerdiff.identity), "" when absent."""
    found = library_stat(name)
    return json.dumps(found) if found is not None else ""


def find(key: str | None) -> StoredReport | None:
    """The complete entry for `key`, or None (no key, absent, incomplete, damaged, unusable cache)."""
    if key is None:
        return None
    try:
        folder = convcache.cache_dir() / f"{PREFIX}{key}"
        view = json.loads((folder / VIEW).read_text(encoding="utf-8"))
        if view.get("key") != key or view.get("format") != FORMAT:
            return None
        files, stats = tuple(view["files"]), view["stats"]
        if not files or not isinstance(stats, dict) or any(_kept_stat(folder / name) != stats.get(name) for name in files):
            return None  # a file gone, or changed since it was kept (a kept file may be the report's own)
        convcache.touch(folder)  # recently used entries survive the trimming
        return StoredReport(folder, files, view["console"])
    except (OSError, LayerdiffError, ValueError, KeyError, TypeError):
        return None


def replay(entry: StoredReport, out_dir: Path | str, force: bool = False) -> Path:
    """Write the stored report into `out_dir` (checked as for a new report, each file under a temporary
    name with the same free-space check as a new one); returns the page."""
    out = prepare_out_dir(out_dir, force=force)
    for name in entry.files:
        source = entry.folder / name
        with open(source, "rb") as f:
            atomic_write_chunks(out / name, iter(lambda: f.read(COPY_CHUNK), b""), source.stat().st_size)
    finish_out_dir(out)
    return out / "index.html"


def store(key: str | None, out_dir: Path, files: Iterable[str], console: dict[str, Any]) -> None:
    """Keep the report just written to `out_dir` under `key`; a cache that cannot take it is no error."""
    if key is None:
        return
    files = [name for name in files if (out_dir / name).is_file()]
    try:
        root = convcache.cache_dir()
    except (OSError, LayerdiffError):
        return
    folder, partial = root / f"{PREFIX}{key}", root / f"{PREFIX}{key}.partial{os.getpid()}"
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=0o700)
        for name in files:
            _keep(out_dir / name, partial / name)
        doc = {"key": key, "format": FORMAT, "files": files, "console": console,
               "stats": {name: _kept_stat(partial / name) for name in files}}
        (partial / VIEW).write_text(json.dumps(doc), encoding="utf-8")  # last: an entry without it is incomplete
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
        convcache.trim(keep=folder)
    except (OSError, LayerdiffError):
        shutil.rmtree(partial, ignore_errors=True)


def _keep(source: Path, kept: Path) -> None:
    """The report file `source` as the cache's `kept`: a second name for the same file where the file system
    allows it (copying the page's several MB was most of what storing a report cost), else a copy. The
    report's files are only ever replaced whole (written under a temporary name, then renamed), never
    rewritten in place, so the kept name keeps the report as it was written."""
    try:
        os.link(source, kept)
    except OSError:
        shutil.copyfile(source, kept)


def _kept_stat(path: Path) -> list[int] | None:
    """size, modification time and inode of a kept file (None when it is not a file): whoever edits the
    report's file in place (it may be the same file) changes them, and the entry is then not used."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino] if stat.S_ISREG(st.st_mode) else None


def console_view(analysis) -> dict[str, Any]:
    """What the console shows of an analysis, as plain JSON values (the stored report prints it again)."""
    from layerdiff.analyzer.measure.rows import records  # pandas: only once an analysis ran

    plan = analysis.comparison.plan
    summary = analysis.summary
    shown = [c for c in ("role", *VIEW_COLUMNS) if c in summary.columns]  # only what the view reads
    rows = [{key: _plain(row.get(key)) for key in VIEW_COLUMNS}
            for row in records(summary, shown) if row.get("role") == "compared"]
    return {"reference": plan.reference.label, "reason": plan.reason, "rows": rows,
            "findings": [finding.sentence for finding in analysis.findings], "problems": list(analysis.problems)}


VIEW_COLUMNS = ("run", "verdict", "n_fail", "n_warn", "first_divergence", "first_divergence_op", "output",
                "output_rel_l2", "top1", "verdict_reason")


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones (JSON keeps NaN and infinities: json writes them as NaN/Infinity)."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        value = item()
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)
