"""Sketch-first collection: pull a run's summaries, outputs and small tensors, then only the tensors the
analysis needs to see exactly (docs/sketch.md).

Why: over a USB 2 cable a 0.5 GB dump takes ~14 s to pull and a sweep pulls hundreds. Every harness
writes a summary of each tensor beside the dump (analyzer/FORMATS.md §3), a few percent of its bytes,
from which the analyzer estimates every layer with its uncertainty. The loop here:
1. pulls `manifest.jsonl`, `summary.jsonl`, `summary.bin`, the plain run's outputs, and by byte range the
   tensors that are small (a summary would not be smaller) or outputs of the model;
2. converts what it has to HDF5 (tensors left on the phone become estimated rows);
3. analyses it with the reference and asks the judge which layers it needs exactly (first divergence,
   failure sources and their inputs, estimates within 4 sigma of a threshold);
4. pulls those by byte range, and repeats until nothing new is named.
The local `tensors.bin` is a sparse file of the dump's size holding the pulled ranges; `pulled.json`
says which tensors they are and how many bytes came over the link.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

from layerdiff.analyzer.formats.dumpformat import tensor_key
from layerdiff.analyzer.formats.rawdump import MANIFEST, PLAIN_DIR, PULLED, TENSORS, RawDump, convert_raw_dump, read_raw_dump
from layerdiff.analyzer.formats.sketchformat import SUMMARY_DATA, SUMMARY_LINES
from layerdiff.collector.transport.devices import DeviceError
from layerdiff.errors import DumpFormatError, LayerdiffError

SMALL_TENSOR_BYTES = 64 << 10  # a summary is ~8-40 KB: a tensor this small is pulled whole
AUTO_SKETCH_BYTES = 100 << 20  # `collect` pulls sketch-first when a dump is larger than this (docs/sketch.md)
MAX_ROUNDS = 8  # each round pulls what the last analysis named; real runs settle in 2-3
MAX_DUMP_BYTES = 1 << 44  # a manifest claiming more is lying: the sparse file is never made larger
RANGES_PER_READ = 256  # byte ranges per device round trip (one shell command line each)
KEPT_BY_WRITER = ("layerdiff_format", "format_version", "tool_version", "created", "provenance", "sketch_first",
                  "bytes_pulled", "dump_bytes", "tensors_pulled", "complete")
FIRST_FILES = (MANIFEST, SUMMARY_LINES, SUMMARY_DATA, f"{PLAIN_DIR}/{MANIFEST}", f"{PLAIN_DIR}/{TENSORS}")


class RangeDevice(Protocol):
    """What a sketch-first pull needs of a device (AdbDevice has both)."""

    serial: str

    def fetch_files(self, remote_dir: str, names: list[str], local_dir: Path) -> list[str]: ...

    def read_ranges(self, remote_path: str, ranges: list[tuple[int, int]]) -> bytes: ...


@dataclass
class SketchedPull:
    """One run's dump pulled sketch-first: what is local, and how to get more."""

    device: RangeDevice
    remote_dir: str
    local_dir: Path
    dump: RawDump
    pulled: set[int] = field(default_factory=set)
    bytes_pulled: int = 0  # every byte that crossed the link: first files and tensor ranges
    written: tuple[Path, frozenset[int]] | None = None  # the HDF5 this pull last wrote, and the tensors in it

    @property
    def dump_bytes(self) -> int:
        return sum(t.nbytes for t in self.dump.tensors)

    def pull_orders(self, orders: Iterable[int]) -> int:
        """Pull these tensors by byte range into the local sparse `tensors.bin`; returns how many were new."""
        wanted = sorted({int(o) for o in orders} - self.pulled)
        by_order = {t.order: t for t in self.dump.tensors}
        wanted = [o for o in wanted if o in by_order]
        if not wanted:
            return 0
        self.pull_ranges([(by_order[o].offset, by_order[o].nbytes) for o in wanted])
        self.pulled.update(wanted)
        self._record()
        return len(wanted)

    def pull_ranges(self, ranges: list[tuple[int, int]]) -> None:
        """Copy byte ranges of the device's `tensors.bin` into the same places of the local one."""
        ranges = _merged([r for r in ranges if r[1] > 0])
        with open(self.local_dir / TENSORS, "r+b") as out:
            for start in range(0, len(ranges), RANGES_PER_READ):
                batch = ranges[start:start + RANGES_PER_READ]
                data = self.device.read_ranges(f"{self.remote_dir}/{TENSORS}", batch)
                at = 0
                for offset, length in batch:
                    out.seek(offset)
                    out.write(data[at:at + length])
                    at += length
                self.bytes_pulled += len(data)

    def pull_keys(self, keys: Iterable[str]) -> int:
        """Pull the tensors with these layer keys (`op:output_index`, as the HDF5 names them)."""
        wanted = set(keys)
        return self.pull_orders(t.order for t in self.dump.tensors if tensor_key(t.op, t.output_index) in wanted)

    def convert(self, target: Path) -> Path:
        """The HDF5 of what is local: pulled tensors whole, the others as estimated rows. A target that exists
        (the run as collected) keeps its attributes, inputs and log: only the tensors change. A target this
        pull wrote before only gains the tensors pulled since (`add_pulled_tensors`), the rest is left as is."""
        target = Path(target)
        if self.written is not None and self.written[0] == target and target.is_file():
            return self._add_new(target, self.written[1])
        self.written = (target, frozenset(self.pulled))
        if not target.is_file():
            return convert_raw_dump(self.local_dir, target)
        from layerdiff.analyzer.formats.dumpfile import DumpFile

        with DumpFile(target) as old:
            attrs = {k: v for k, v in old.attrs.items() if k not in KEPT_BY_WRITER}
            attrs["provenance"] = {k: v for k, v in old.provenance.items() if not k.startswith("raw_")}
            attrs.pop("input_fed_check", None)  # checked again from the pulled input bytes
            inputs = list(old.inputs())
            stderr = old.stderr()
            exit_status = int(old.attrs.get("exit_status", 0) or 0)
        return convert_raw_dump(self.local_dir, target, attrs=attrs, inputs=inputs, stderr=stderr,
                                exit_status=exit_status)

    def _add_new(self, target: Path, before: frozenset[int]) -> Path:
        from layerdiff.analyzer.formats.dumpwriter import add_pulled_tensors

        new = [t for t in self.dump.tensors if t.order in self.pulled and t.order not in before]
        if new:
            add_pulled_tensors(target, [({**t.meta(), "op": t.op, "shape": list(t.shape)}, self.dump.read(t))
                                        for t in new],
                               {"bytes_pulled": self.bytes_pulled, "tensors_pulled": len(self.pulled)})
        self.written = (target, frozenset(self.pulled))
        return target

    def _record(self) -> None:
        (self.local_dir / PULLED).write_text(json.dumps({"orders": sorted(self.pulled), "bytes_pulled": self.bytes_pulled}))


def start_pull(device: RangeDevice, remote_dir: str, local_dir: Path,
               small_bytes: int = SMALL_TENSOR_BYTES) -> SketchedPull:
    """The first pass: the manifest, the summaries, the plain run's outputs, then the small tensors and the
    model's outputs by byte range. Raises DumpFormatError when the harness wrote no summary (an older harness:
    collect with --full)."""
    local_dir = Path(local_dir)
    got = device.fetch_files(remote_dir, list(FIRST_FILES), local_dir)
    if SUMMARY_LINES not in got or SUMMARY_DATA not in got:
        raise DumpFormatError(f"{device.serial}: {remote_dir} has no tensor summary (a harness older than this "
                              "layerdiff); collect with --full, or rebuild the harness")
    first_bytes = sum(os.path.getsize(local_dir / name) for name in got)
    size = _dump_size(local_dir / MANIFEST)
    with open(local_dir / TENSORS, "wb") as out:
        out.truncate(size)  # sparse: only the pulled ranges take disk space
    pull = SketchedPull(device, remote_dir, local_dir, read_raw_dump(local_dir), bytes_pulled=first_bytes)
    pull.pull_ranges([(fed.offset, fed.nbytes) for fed in pull.dump.fed])  # the inputs the engine received
    pull._record()
    pull.pull_orders(initial_orders(pull.dump, small_bytes))
    return pull


def resume_pull(device: RangeDevice, remote_dir: str, local_dir: Path) -> SketchedPull:
    """A sketch-first pull started earlier (its local directory and `pulled.json`), to pull more of it."""
    local_dir = Path(local_dir)
    record = json.loads((local_dir / PULLED).read_text())
    return SketchedPull(device, remote_dir, local_dir, read_raw_dump(local_dir), set(record.get("orders", [])),
                        int(record.get("bytes_pulled", 0)))


def initial_orders(dump: RawDump, small_bytes: int = SMALL_TENSOR_BYTES) -> list[int]:
    """Tensors pulled before any analysis: the small ones, the model's declared outputs and every tensor no
    other tensor reads (the outputs of a model that declares none)."""
    declared = dump.header.get("outputs") if isinstance(dump.header.get("outputs"), list) else []
    consumed = {name for t in dump.tensors for name in t.inputs}
    return [t.order for t in dump.tensors
            if t.nbytes <= small_bytes or t.name in declared or t.name not in consumed]


def _dump_size(manifest: Path) -> int:
    """Bytes of the device's `tensors.bin`, from the manifest alone (before any tensor is here): the end of
    its last tensor or input record, or the footer's count. The full reader checks every line afterwards."""
    size = 0
    for raw in manifest.read_bytes().splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        values = [record.get("offset"), record.get("nbytes")] if record.get("record") in ("tensor", "input_fed") \
            else [record.get("bytes"), 0] if record.get("record") == "footer" else [0, 0]
        if all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DUMP_BYTES for v in values):
            size = max(size, values[0] + values[1])
    return size


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent byte ranges joined (tensors are back to back: consecutive layers are one read)."""
    out: list[list[int]] = []
    for offset, length in sorted(ranges):
        if out and out[-1][0] + out[-1][1] == offset:
            out[-1][1] += length
        else:
            out.append([offset, length])
    return [(o, n) for o, n in out]


@dataclass
class RefineResult:
    """What a sketch-first collection pulled and what the final analysis says."""

    rounds: int
    bytes_pulled: dict[Path, int]  # per HDF5 of a sketch-first run
    dump_bytes: dict[Path, int]
    named: dict[Path, int]  # tensors pulled after the first pass
    analysis: object | None = None  # the last round's analysis, open, when asked for (`keep_analysis`): the answer
    reused: int = 0  # rows later rounds took from earlier ones instead of measuring again


def refine(pulls: dict[Path, SketchedPull], others: list[Path], ref: Path | str | None,
           thresholds=None, max_rounds: int = MAX_ROUNDS, keep_analysis: bool = False) -> RefineResult:
    """Analyse, pull what the judge names, and repeat until nothing new is named (at most `max_rounds`).

    `pulls` maps each sketch-first run's HDF5 (written here, updated each round) to its pull; `others` are
    runs held whole (a local golden); `ref` names the reference (None: the analyzer's own choice). A round
    measures again only the layers whose tensors it pulled (MeasureMemo); the others keep their rows.
    `keep_analysis`: the last round's analysis is the answer; it comes back open in `RefineResult.analysis`
    (the caller closes it) instead of being analysed again."""
    from layerdiff.analyzer.analysis import MeasureMemo, analyze_paths, needed_exactly

    targets = {Path(path): pull for path, pull in pulls.items()}
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
    named = dict.fromkeys(targets, 0)
    memo = MeasureMemo()
    rounds = 0
    while True:
        rounds += 1
        for path, pull in targets.items():
            pull.convert(path)
        analysis = analyze_paths([*targets, *others], ref=ref, thresholds=thresholds, memo=memo)
        try:
            needs = needed_exactly(analysis)
            labels = {Path(run.path).resolve(): run.label for run in analysis.runs}
            new = 0
            if rounds < max_rounds:
                for path, pull in targets.items():
                    pulled = pull.pull_keys(needs.keys.get(labels.get(path.resolve(), ""), set()))
                    named[path] += pulled
                    new += pulled
        except BaseException:
            analysis.close()
            raise
        if new and rounds < max_rounds:
            analysis.close()
            continue
        if not keep_analysis:
            analysis.close()
        return RefineResult(rounds, {p: t.bytes_pulled for p, t in targets.items()},
                            {p: t.dump_bytes for p, t in targets.items()}, named,
                            analysis if keep_analysis else None, memo.hits)


PULL_MODES = ("auto", "sketch", "full")
SKETCH_DIR = ".sketch"  # beside a sweep's HDF5 files: the sketch-first pulls still to refine
REMOTE_RECORD = "remote.json"


def sketch_dir(target: Path) -> Path:
    """Where the sketch-first pull of the run written to `target` (an HDF5 path) keeps its local bytes."""
    return Path(target).parent / SKETCH_DIR / Path(target).stem


def fetch_dump(device, remote_dir: str, local_dir: Path, mode: str, target: Path, run_dir: str) -> Path:
    """Bring a raw dump to the host for `collect`: whole (`full`, a device without byte-range reads, or
    `auto` on a dump of at most AUTO_SKETCH_BYTES or without summaries) or sketch-first (its first pass, kept
    in `sketch_dir(target)` with where it came from, for `refine_sketched` once the sweep is done)."""
    if mode == "full" or not hasattr(device, "read_ranges"):
        return device.fetch_dir(remote_dir, local_dir)
    keep = sketch_dir(target)
    shutil.rmtree(keep, ignore_errors=True)
    if mode == "auto":
        got = device.fetch_files(remote_dir, [MANIFEST, SUMMARY_LINES], keep)
        if MANIFEST not in got or SUMMARY_LINES not in got or _dump_size(keep / MANIFEST) <= AUTO_SKETCH_BYTES:
            shutil.rmtree(keep, ignore_errors=True)
            return device.fetch_dir(remote_dir, local_dir)
    start_pull(device, remote_dir, keep)
    (keep / REMOTE_RECORD).write_text(json.dumps({"serial": device.serial, "remote_dir": remote_dir, "run_dir": run_dir}))
    return keep


@dataclass
class SketchedRuns:
    """The sketch-first runs of a sweep after refinement: what a user is told."""

    runs: int = 0
    bytes_pulled: int = 0
    dump_bytes: int = 0
    rounds: int = 0
    problems: list[str] = field(default_factory=list)
    waiting: int = 0  # runs left unrefined by a Ctrl-C: their files wait for the same command to run again


def waiting_sketches(out_dirs: list[Path]) -> SketchedRuns:
    """The sketch-first runs a stopped sweep leaves unrefined (a Ctrl-C before or during refinement): each keeps
    its dump on the phone and its summaries and pulled bytes in `.sketch/`, so that running the same command
    again refines them (the done runs are not run again) and then removes both."""
    count = 0
    for out_dir in out_dirs:
        root = Path(out_dir) / SKETCH_DIR
        count += sum(1 for d in root.iterdir() if (d / REMOTE_RECORD).is_file()) if root.is_dir() else 0
    return SketchedRuns(waiting=count)


def refine_sketched(out_dirs: list[Path], devices: dict[str, object], others: list[Path], keep: bool,
                    thresholds=None) -> SketchedRuns:
    """Refine every sketch-first run a sweep left under `out_dirs` (against the sweep's other runs and each
    other), then remove their files from the devices (unless `keep`) and their local bytes."""
    pulls: dict[Path, SketchedPull] = {}
    run_dirs: list[tuple[object, str]] = []
    summary = SketchedRuns()
    for out_dir in out_dirs:
        root = Path(out_dir) / SKETCH_DIR
        for keep_dir in sorted(root.iterdir()) if root.is_dir() else []:
            record = json.loads((keep_dir / REMOTE_RECORD).read_text()) if (keep_dir / REMOTE_RECORD).is_file() else {}
            device = devices.get(str(record.get("serial")))
            target = Path(out_dir) / f"{keep_dir.name}.h5"
            if device is None or not target.is_file():
                summary.problems.append(f"{target}: its sketch-first pull cannot be refined (device "
                                        f"{record.get('serial')!r} gone); its estimated rows stay estimates")
                continue
            pulls[target] = resume_pull(device, str(record["remote_dir"]), keep_dir)
            run_dirs.append((device, str(record["run_dir"])))
    if pulls:
        others = [p for p in others if Path(p) not in pulls]
        try:
            result = refine(pulls, others, None, thresholds)
            summary = SketchedRuns(len(pulls), sum(result.bytes_pulled.values()), sum(result.dump_bytes.values()),
                                   result.rounds, summary.problems)
        except LayerdiffError as err:  # e.g. one run and no reference: nothing names a layer to pull
            summary = SketchedRuns(len(pulls), sum(p.bytes_pulled for p in pulls.values()),
                                   sum(p.dump_bytes for p in pulls.values()), 0,
                                   summary.problems + [f"the sketch-first runs were not refined ({err}); their "
                                                       "layers left on the device stay estimates"])
    for device, run_dir in dict.fromkeys(run_dirs):
        if not keep:
            try:
                device.remove(run_dir)
            except DeviceError as err:  # a phone gone now keeps its scratch files; nothing depends on them
                summary.problems.append(f"{device.serial}: {run_dir} left on the device ({err})")
    for out_dir in out_dirs:
        shutil.rmtree(Path(out_dir) / SKETCH_DIR, ignore_errors=True)
    return summary
