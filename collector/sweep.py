"""The cross product of devices × backends × precisions × inputs, run and recorded in an index.

`collect` with one value of each is a sweep of one run; with lists it is a sweep of many. Either way
every planned run gets a row in `index.csv`, written atomically after each run so an interrupted
sweep always says what is done.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from analyzer.errors import LayerdiffError
from collector.devices import Device, LocalDevice
from collector.inputs import InputSet
from collector.models import ModelFiles
from collector.run import RunOutcome, RunSpec, collect_run

INDEX_COLUMNS = ["serial", "engine", "backend", "precision", "input", "status", "reason", "duration_s", "files",
                 "model_sha256", "input_sha256"]


@dataclass
class SweepPlan:
    devices: list[Device]
    model: ModelFiles
    backends: list[str]
    precisions: list[str]
    inputs: list[InputSet]
    out_dir: Path
    threads: int = 1
    repeat: int = 1
    deadline_s: float = 900.0
    layers: str | None = None
    max_bytes: int | None = None
    keep: bool = False
    force: bool = False
    extra: dict = field(default_factory=dict)

    def specs(self) -> Iterable[RunSpec]:
        for backend in self.backends:
            for precision in self.precisions:
                for inputs in self.inputs:
                    yield RunSpec(self.model, backend, precision, inputs, threads=self.threads, repeat=self.repeat,
                                  deadline_s=self.deadline_s, layers=self.layers, max_bytes=self.max_bytes,
                                  keep=self.keep)

    def device_dir(self, device: Device) -> Path:
        """One device writes straight into the output directory; several get a folder each."""
        if len(self.devices) == 1:
            return self.out_dir
        return self.out_dir / "".join(c if c.isalnum() or c in "-_." else "_" for c in device.serial)


def split_list(values: list[str] | None) -> list[str]:
    """`--backend cpu,vulkan --backend opencl` → ["cpu", "vulkan", "opencl"], order kept, no repeats."""
    out: list[str] = []
    for value in values or []:
        for item in value.split(","):
            item = item.strip()
            if item and item not in out:
                out.append(item)
    return out


def resolve_devices(names: list[str], adb_servers: list[str] | None = None, exclude: list[str] | None = None) -> list[Device]:
    """`local`, serials, or `all` (every device the adb server(s) know) → Device objects."""
    devices: list[Device] = []
    for name in names:
        if name == "local":
            devices.append(LocalDevice())
            continue
        from collector.adb import adb_devices  # the ADB stack loads only when a phone is asked for

        devices.extend(adb_devices([name], adb_servers or []))
    excluded = set(exclude or [])
    devices = [d for d in devices if d.serial not in excluded]
    if not devices:
        raise LayerdiffError("no device left to run on; check --device and --exclude")
    return devices


def write_index(path: Path, outcomes: list[RunOutcome], plan: SweepPlan) -> None:
    """Rewrite index.csv under a temporary name and move it into place."""
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=INDEX_COLUMNS)
        writer.writeheader()
        for outcome in outcomes:
            writer.writerow(_index_row(outcome, plan))
    os.replace(tmp, path)


def _index_row(outcome: RunOutcome, plan: SweepPlan) -> dict:
    spec = outcome.spec
    return {
        "serial": outcome.serial,
        "engine": spec.model.engine,
        "backend": spec.backend,
        "precision": spec.precision,
        "input": spec.inputs.label,
        "status": outcome.status,
        "reason": outcome.message,
        "duration_s": f"{outcome.duration_s:.2f}",
        "files": ";".join(str(p.relative_to(plan.out_dir)) if p.is_relative_to(plan.out_dir) else str(p)
                          for p in outcome.paths),
        "model_sha256": "",
        "input_sha256": spec.inputs.sha256(),
    }


OutcomeSink = Callable[[RunOutcome], None]
ProgressFactory = Callable[[Device, RunSpec], Callable[[int, int, str], None] | None]


def run_sweep(plan: SweepPlan, *, on_outcome: OutcomeSink | None = None, progress: ProgressFactory | None = None) -> list[RunOutcome]:
    """Run every planned configuration on every device, one after another, keeping the index current."""
    if plan.out_dir.exists() and not plan.out_dir.is_dir():
        raise LayerdiffError(f"output {plan.out_dir} is a file; pass a directory to -o")
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    outcomes: list[RunOutcome] = []
    for device in plan.devices:
        device_dir = plan.device_dir(device)
        device_dir.mkdir(parents=True, exist_ok=True)
        for spec in plan.specs():
            sink = progress(device, spec) if progress else None
            try:
                outcome = collect_run(device, spec, device_dir, force=plan.force, on_progress=sink)
            except LayerdiffError as err:
                outcome = RunOutcome(spec, device.serial, "failed", [], str(err))
            outcomes.append(outcome)
            write_index(plan.out_dir / "index.csv", outcomes, plan)
            if on_outcome:
                on_outcome(outcome)
    return outcomes
