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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol

from layerdiff.analyzer.formats.dumpformat import tensor_key
from layerdiff.analyzer.formats.rawdump import MANIFEST, PLAIN_DIR, PULLED, TENSORS, RawDump, convert_raw_dump, read_raw_dump
from layerdiff.analyzer.formats.sketchformat import SUMMARY_DATA, SUMMARY_LINES
from layerdiff.errors import DumpFormatError

SMALL_TENSOR_BYTES = 64 << 10  # a summary is ~8-40 KB: a tensor this small is pulled whole
AUTO_SKETCH_BYTES = 100 << 20  # `collect` pulls sketch-first when a dump is larger than this (docs/sketch.md)
MAX_ROUNDS = 8  # each round pulls what the last analysis named; real runs settle in 2-3
MAX_DUMP_BYTES = 1 << 44  # a manifest claiming more is lying: the sparse file is never made larger
RANGES_PER_READ = 256  # byte ranges per device round trip (one shell command line each)
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
        ranges = _merged([(by_order[o].offset, by_order[o].nbytes) for o in wanted])
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
        self.pulled.update(wanted)
        self._record()
        return len(wanted)

    def pull_keys(self, keys: Iterable[str]) -> int:
        """Pull the tensors with these layer keys (`op:output_index`, as the HDF5 names them)."""
        wanted = set(keys)
        return self.pull_orders(t.order for t in self.dump.tensors if tensor_key(t.op, t.output_index) in wanted)

    def convert(self, target: Path, attrs: dict | None = None) -> Path:
        """The HDF5 of what is local: pulled tensors whole, the others as estimated rows."""
        return convert_raw_dump(self.local_dir, target, attrs=attrs)

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
    pull._record()
    pull.pull_orders(initial_orders(pull.dump, small_bytes))
    return pull


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
    bytes_pulled: dict[str, int]  # per run label
    dump_bytes: dict[str, int]
    named: dict[str, int]  # per run label: tensors pulled after the first pass
    paths: dict[str, Path]  # per run label: its final HDF5


def refine(pulls: dict[str, SketchedPull], others: list[Path], ref: Path | str | None, workdir: Path,
           thresholds=None, max_rounds: int = MAX_ROUNDS) -> RefineResult:
    """Analyse, pull what the judge names, and repeat until nothing new is named (at most `max_rounds`).

    `pulls` maps an output file stem to its sketch-first pull; `others` are runs held whole (a local golden);
    `ref` names the reference among them, or the stem of a pull (a sketched reference)."""
    from layerdiff.analyzer.analysis import analyze_paths, needed_exactly

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    named = dict.fromkeys(pulls, 0)
    rounds = 0
    while True:
        rounds += 1
        paths = {stem: pull.convert(workdir / f"{stem}.h5") for stem, pull in pulls.items()}
        reference = paths.get(str(ref), ref)
        analysis = analyze_paths([*paths.values(), *others], ref=reference, thresholds=thresholds)
        try:
            needs = needed_exactly(analysis)
            labels = {Path(run.path).resolve(): run.label for run in analysis.runs}
        finally:
            analysis.close()
        new = 0
        for stem, pull in pulls.items():
            keys = needs.keys.get(labels.get(paths[stem].resolve(), ""), set())
            pulled = pull.pull_keys(keys)
            named[stem] += pulled
            new += pulled
        if not new or rounds >= max_rounds:
            return RefineResult(rounds, {s: p.bytes_pulled for s, p in pulls.items()},
                                {s: p.dump_bytes for s, p in pulls.items()}, named, paths)
