"""Finding and opening the runs to analyze: files and directories in, labelled `Run`s out.

Users point `analyze` at whatever they have: a sweep's output directory, a few files a colleague
mailed, a raw dump pulled by hand. A file that is not a usable dump must not stop the others from
being analyzed, so opening returns the runs that worked *and* one line per input that did not.
Non-HDF5 inputs (raw dump directories, other tools' formats) go through `layerdiff.analyzer.importers`.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.runs import dumpheaders
from layerdiff.analyzer.runs.discovery import H5_SUFFIXES, RAW_MANIFEST, discover  # noqa: F401 (API)
from layerdiff.analyzer.runs.placement import cpu_by_design
from layerdiff.errors import LayerdiffError

# Attributes that make two runs "the same configuration" (everything except input and repetition).
CONFIG_FIELDS = ("device_serial", "device_model", "engine", "engine_version", "backend_requested", "precision_requested",
                 "threads", "model_sha256")
LABEL_FIELDS = ("device", "engine", "setting", "input_label", "repeat")
# Precomputed /layers counts the metrics use to skip work (no NaN -> no finiteness tests, ...).
# mean/std give |x|^2 = n (std^2 + mean^2) without a pass over the tensor.
STATS_FIELDS = ("n_nan", "n_posinf", "n_neginf", "n_zero", "n_fp16_saturated", "mean", "std")
# min/max let the metrics take a layer's scale from the file instead of a pass over the tensor.
OPTIONAL_STATS_FIELDS = ("min", "max")


class LayerStats(Mapping):
    """order -> {field: value} of `STATS_FIELDS`, read from the /layers columns at each lookup.

    A dict per layer held ~40 MB at 50,000 layers per run; the columns are already in memory. A
    repeated order resolves to its last row, as a dict built from the rows would."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._columns = {f: frame[f].to_numpy() for f in STATS_FIELDS}
        self._columns.update({f: frame[f].to_numpy() for f in OPTIONAL_STATS_FIELDS if f in frame})
        self._layouts = frame["layout"].to_numpy() if "layout" in frame else None
        orders = frame["order"].to_numpy(dtype=np.int64)
        self._rows = np.argsort(orders, kind="stable")
        self._orders = orders[self._rows]

    def _row(self, order: int) -> int:
        i = int(np.searchsorted(self._orders, order, side="right")) - 1
        if i < 0 or self._orders[i] != order:
            raise KeyError(order)
        return int(self._rows[i])

    def __getitem__(self, order: int) -> dict[str, float]:
        row = self._row(order)
        return {f: column[row].item() for f, column in self._columns.items()}

    def layout(self, order: int) -> str:
        """The layout the producer recorded for this tensor's bytes ('' when none)."""
        return "" if self._layouts is None else str(self._layouts[self._row(order)] or "")

    def __iter__(self) -> Iterator[int]:
        return (int(o) for o in dict.fromkeys(self._orders.tolist()))

    def __len__(self) -> int:
        return len(np.unique(self._orders))


@dataclass
class Run:
    """One opened dump with a short label unique within the analysis."""

    path: Path
    dump: DumpFile
    attrs: dict[str, Any]
    label: str = ""
    source: Path | None = None  # what the user named (a foreign file or directory) when `path` is its import
    input_override: str = ""  # the input key a golden without input hash stands for (`--ref-input`)
    _stats: "LayerStats | None" = field(default=None, repr=False)
    _by_design: list[str] | None = field(default=None, repr=False)
    _plain: "dict[str, np.ndarray] | None" = field(default=None, repr=False)

    def plain_outputs(self) -> "dict[str, np.ndarray]":
        """The model's outputs from the run without observation, by layer key ({} when the dump has none):
        what an app gets, so the verdict judges these (FORMATS.md §2 `/plain_outputs`)."""
        if self._plain is None:
            self._plain = self.dump.plain_outputs()
        return self._plain

    def stats_by_order(self) -> "LayerStats":
        """Per-layer counts from /layers keyed by order; built once, looked up for every layer."""
        if self._stats is None:
            self._stats = LayerStats(self.layers)
        return self._stats

    @property
    def layers(self) -> pd.DataFrame:
        return self.dump.layers

    @property
    def backend(self) -> str:
        return str(self.attrs.get("backend_actual") or self.attrs.get("backend_requested") or "")

    @property
    def cpu_by_design(self) -> list[str]:
        """Nodes this GPU run computed on the CPU because its engine always does (llama.cpp's input layer):
        not a fallback (placement.py); [] for every other run."""
        if self._by_design is None:
            try:
                self._by_design = cpu_by_design(self.attrs, self.layers)
            except LayerdiffError:
                self._by_design = []
        return self._by_design

    @property
    def precision(self) -> str:
        return str(self.attrs.get("precision_requested") or "")

    @property
    def config(self) -> tuple:
        """What was run, ignoring which input and which repetition: runs to compare across inputs."""
        return tuple(str(self.attrs.get(f, "")) for f in CONFIG_FIELDS)

    @property
    def config_label(self) -> str:
        device = self.attrs.get("device_model") or self.attrs.get("device_serial") or ""
        engine = str(self.attrs.get("engine", ""))
        if self.attrs.get("engine_requested"):  # a release asked for by version is named with it
            engine = f"{engine} {bare_release(engine, str(self.attrs.get('engine_version', '')))}".strip()
        parts = [str(device), engine, f"{self.backend}/{self.precision}"]
        return " ".join(p for p in parts if p and p != "/")

    @property
    def input_key(self) -> str:
        """Identity of the input fed: its sha256 when known, else its label (pairing goes by this)."""
        return self.input_override or str(self.attrs.get("input_sha256") or self.attrs.get("input_label") or "")

    @property
    def input_name(self) -> str:
        """The input as findings and tables name it: its label, else the first 12 characters of its key."""
        return str(self.attrs.get("input_label") or self.input_key[:12])

    @property
    def input_description(self) -> str:
        """The input as the user knows it plus the key pairing uses: `cat.png (sha256 1a2b3c4d5e6f)`."""
        label = str(self.attrs.get("input_label") or "")
        sha = str(self.attrs.get("input_sha256") or "")
        if self.input_override:
            return f"{label or '?'} (paired as {self.input_override[:12]} by --ref-input or as the only input)"
        if sha:
            return f"{label or '?'} (sha256 {sha[:12]})"
        return f"{label} (no input hash: paired by this label)" if label else "unknown (no input label or hash)"

    @property
    def shown_path(self) -> Path:
        """The file to name in a message: the dump itself, or for a foreign dump (an .npz, a zip, a raw
        folder) the file the user gave, never its converted copy in the cache they never saw."""
        if self.source is None or self.path == self.source or self.source in self.path.parents:
            return self.path
        return self.source

    def names(self, path: Path | str) -> bool:
        """True when `path` is this run's dump or the foreign file/directory it was imported from."""
        wanted = Path(path).resolve()
        return self.path.resolve() == wanted or (self.source is not None and self.source.resolve() == wanted)

    @property
    def is_isolated(self) -> bool:
        """A `collect isolate` dump: chosen layers re-run alone on the reference's inputs, not a run."""
        return is_isolated(self.attrs)

    @property
    def repeat(self) -> int:
        try:
            return int(self.attrs.get("repeat", 0) or 0)
        except (TypeError, ValueError):
            return 0


def is_isolated(attrs: dict[str, Any]) -> bool:
    """Root attribute `mode = "isolate"` marks the output of `collect isolate` (see collector/run/isolate.py)."""
    return str(attrs.get("mode", "")) == "isolate"


@dataclass
class SourceSet:
    """The runs that opened, the isolated dumps (kept apart: they are not runs), and one line per failure."""

    runs: list[Run] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    isolated: list[Run] = field(default_factory=list)

    def close(self, keep_headers: bool = True) -> None:
        """Close every dump; first keep each one's header for the next analysis of the same files
        (runs/dumpheaders.py) when this reading learnt something (offsets included, so an analysis ended)."""
        headers = []
        for run in self.runs + self.isolated:
            if keep_headers and run.dump.learnt:
                try:
                    headers.append((run.path, run.dump.header()))
                except LayerdiffError:
                    pass  # a table that did not read keeps no header: it is read, and reported, again
            run.dump.close()
        dumpheaders.store_all(headers)


def open_runs(paths: Iterable[Path | str], set_attrs: dict[str, dict[str, Any]] | None = None) -> SourceSet:
    """Open every dump it can; each failure becomes one problem line instead of an exception.

    `set_attrs` attaches provenance a foreign format lacks (`analyze --set`): key `""` applies to
    every input, a key naming an input argument to the dumps found under it, a key naming a dump
    file to that file. Isolated dumps go
    to `SourceSet.isolated`: their rows are a few layers fed someone else's inputs, so comparing
    them as a (partial) run would report nonsense; `layerdiff.analyzer.measure.isolation` pairs them with their
    reference and cumulative run instead.
    """
    candidates, problems = discover(paths)
    sources = SourceSet(problems=problems)
    for path, origin in candidates:
        attrs = _attrs_for(path, origin, set_attrs or {})
        for dump_path in _as_h5_dumps(path, attrs, sources.problems):
            try:
                dump = DumpFile(dump_path, header=dumpheaders.load(dump_path))
            except LayerdiffError as err:
                sources.problems.append(str(err))
                continue
            run = Run(path=dump_path, dump=dump, attrs=dump.attrs, source=path)
            (sources.isolated if run.is_isolated else sources.runs).append(run)
    assign_labels(sources.runs)
    for run in sources.isolated:
        run.label = run.path.stem
    return sources


def _attrs_for(path: Path, origin: Path, set_attrs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Attributes for one dump: those for every input, then its argument's, then its own file's."""
    attrs = dict(set_attrs.get("", {}))
    for target in (origin.resolve(), path.resolve()):
        for key, values in set_attrs.items():
            if key and Path(key).resolve() == target:
                attrs.update(values)
    return attrs


def _as_h5_dumps(path: Path, attrs: dict[str, Any], problems: list[str]) -> list[Path]:
    """A layerdiff `.h5` as it is; anything else (or an `.h5` to relabel) through the importers."""
    if _is_h5(path) and not attrs:
        return [path]
    try:
        from layerdiff.analyzer.importers import import_many
    except ImportError:
        problems.append(f"{path}: not an HDF5 dump and the importers for other formats are not installed; "
                        "convert it to a layerdiff .h5 first")
        return []
    imported, errors = import_many([path], attrs or None)
    problems.extend(errors)
    return [Path(p) for p in imported]


def _is_h5(path: Path) -> bool:
    if path.suffix.lower() in H5_SUFFIXES:
        return True
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


def assign_labels(runs: list[Run]) -> None:
    """Give each run the shortest label that tells it apart: only the fields that vary are shown."""
    fields = [_label_fields(run) for run in runs]
    _with_releases(fields, runs)
    varying = [name for name in LABEL_FIELDS if len({f[name] for f in fields}) > 1]
    if not varying:
        varying = ["setting"]
    labels = [" ".join(f[name] for name in varying if f[name]) or run.path.stem for f, run in zip(fields, runs)]
    labels = _with_models(labels, runs)
    counts = pd.Series(labels).value_counts()
    for run, label in zip(runs, labels):
        run.label = f"{label} [{run.path.stem}]" if counts[label] > 1 or not label else label


def _with_releases(fields: list[dict[str, str]], runs: list[Run]) -> None:
    """Runs of one engine at two releases (`--engine mnn==3.5.0` beside the installed MNN) are two
    configurations: their engine field names the release (`mnn 3.5.0`), only where releases differ."""
    releases: dict[str, set[str]] = {}
    for run in runs:
        releases.setdefault(str(run.attrs.get("engine", "")), set()).add(str(run.attrs.get("engine_version", "")))
    for field_set, run in zip(fields, runs):
        version = str(run.attrs.get("engine_version", ""))
        if len(releases.get(field_set["engine"], ())) > 1 and version:
            field_set["engine"] = f"{field_set['engine']} {bare_release(field_set['engine'], version)}"


def bare_release(engine: str, version: str) -> str:
    """A recorded engine version without the engine's name in front (`ggml 0.9.8 (llama-cpp-python 0.3.17 sdist)`
    -> `0.9.8 (...)`), so labels and sentences that name the engine first do not name it twice."""
    version = version.strip()
    return version[len(engine) + 1:].strip() if engine and version.lower().startswith(engine.lower() + " ") else version


def _with_models(labels: list[str], runs: list[Run]) -> list[str]:
    """Runs of different model files that would share a label (an fp32 ONNX and its fp16 copy, one
    stem in two folders) get their model added: its file name, and its sha256 prefix where the
    names are the same too. Runs of one model keep their labels."""
    models = [_model_label(run) for run in runs]
    out = []
    for label, model in zip(labels, models):
        sharing = {m for other, m in zip(labels, models) if other == label}
        if len(sharing) > 1:
            names = {m.split(" (", 1)[0] for m in sharing}
            label = f"{label} {model if len(names) < len(sharing) else model.split(' (', 1)[0]}"
        out.append(label)
    return out


def _model_label(run: Run) -> str:
    """`name.onnx (sha256 1a2b3c4d)`: which model file a run computed."""
    name = str(run.attrs.get("model_name") or "")
    sha = str(run.attrs.get("model_sha256") or "")
    return f"{name or '?'} (sha256 {sha[:8] or '?'})"


def _label_fields(run: Run) -> dict[str, str]:
    device = str(run.attrs.get("device_model") or run.attrs.get("device_serial") or "")
    backend = run.backend
    requested = str(run.attrs.get("backend_requested") or "")
    if requested and backend and requested != backend:  # `vulkan->cpu`: not what was asked for
        backend = requested if run.cpu_by_design else f"{requested}->{backend}"
    return {
        "device": device,
        "engine": str(run.attrs.get("engine", "")),
        "setting": f"{backend}/{run.precision}" if backend or run.precision else "",
        "input_label": str(run.attrs.get("input_label", "")),
        "repeat": f"r{run.repeat}",
    }
