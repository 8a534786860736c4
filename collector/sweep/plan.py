"""What a `collect` command will do, decided before any run starts.

Planning expands the cross product (devices × backends × precisions × inputs), asks each device's
harness once what it can run (`--probe`), and settles every run's fate up front: to run, already
done (resume), failed before (kept unless `--retry-failed`), or impossible on that device (skipped
with the reason). Nothing then fails one by one after a timeout for a backend a phone lacks.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.vocabulary import RunStatus
from layerdiff.analyzer.formats.diskspace import NO_SPACE
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.clioptions import comma_items
from layerdiff.errors import DeviceError, LayerdiffError, UsageError
from layerdiff.collector.transport.devices import Device, DeviceError, LocalDevice
from layerdiff.collector.transport.probe import probe_document
from layerdiff.collector.engines.harness_cli import HARNESS_VERSION
from layerdiff.collector.engines.versions import requested
from layerdiff.collector.sweep.index import IndexRow, read_index
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.run.pipeline import RunOptions, SETTING_OPTIONS, RunSpec, dump_settings, settings_text


@dataclass
class SweepPlan(RunOptions):
    devices: list[Device]
    model: ModelFiles
    backends: list[str]
    precisions: list[str]
    inputs: list[InputSet]
    out_dir: Path
    force: bool = False
    retry_failed: bool = False
    probe: bool = True
    configs: list[tuple[str, str]] = field(default_factory=list)  # (backend, precision) pairs; empty: the cross product
    extra_attrs: dict = field(default_factory=dict)  # written into every run's root attributes (e.g. the --task)
    engine_version: str = ""  # `--engine NAME==VERSION` (collector/engines/versions.py); "": the installed engine

    def specs(self) -> list[RunSpec]:
        pairs = self.configs or [(backend, precision) for backend in self.backends for precision in self.precisions]
        return [RunSpec(self.model, backend, precision, inputs, extra_attrs=dict(self.extra_attrs),
                        engine_version=self.engine_version, **self.run_options())
                for backend, precision in pairs for inputs in self.inputs]

    def device_dir(self, device: Device) -> Path:
        """One device writes straight into the output directory; several get a folder each."""
        if len(self.devices) == 1:
            return self.out_dir
        return self.out_dir / "".join(c if c.isalnum() or c in "-_." else "_" for c in device.serial)


@dataclass
class PlannedRun:
    device: Device
    spec: RunSpec
    row: IndexRow
    out_dir: Path
    todo: bool = True
    paths: list[Path] = field(default_factory=list)


def split_list(values: list[str] | None) -> list[str]:
    """`--backend cpu,vulkan --backend opencl` → ["cpu", "vulkan", "opencl"], order kept, no repeats."""
    return comma_items(values)


def parse_configs(items: list[str], backends: tuple[str, ...], precisions: tuple[str, ...]) -> list[tuple[str, str]]:
    """`cpu/high,vulkan/low` → [("cpu", "high"), ("vulkan", "low")]: exactly the runs a question needs
    (vulkan/low against its cpu/high reference) instead of every backend × precision."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        backend, _, precision = item.partition("/")
        if backend not in backends or precision not in precisions:
            raise UsageError(f"--config {item!r}: write BACKEND/PRECISION, e.g. cpu/high, with a backend of "
                                 f"{', '.join(backends)} and a precision of {', '.join(precisions)}")
        if (backend, precision) not in pairs:
            pairs.append((backend, precision))
    return pairs


def resolve_devices(names: list[str], adb_servers: list[str] | None = None, exclude: list[str] | None = None,
                    connect: list[str] | None = None) -> list[Device]:
    """`local`, `arm64[:CPU]`, serials, `host:port` endpoints, or `all` → Device objects.

    `all` is the host, the emulated arm64 core (when qemu-user is installed) and every online
    phone of the adb server(s); without a running adb server it is just the first two. `connect`
    endpoints are connected through the first adb server and added (layerdiff.collector.transport.endpoints).
    """
    from layerdiff.collector.transport.arm64 import Arm64Device, is_arm64_name

    excluded = set(exclude or [])
    wanted = [n for n in names if n not in excluded]
    if "all" in wanted:
        extra = ["local"] + (["arm64"] if _qemu_available() else [])
        wanted = [n for n in extra if n not in excluded] + [n for n in wanted if n not in extra]
    devices: list[Device] = []
    if "local" in wanted:
        devices.append(LocalDevice())
    devices.extend(Arm64Device.from_name(n) for n in dict.fromkeys(wanted) if is_arm64_name(n))
    adb_names = [n for n in wanted if n != "local" and not is_arm64_name(n)]
    if adb_names or connect:
        devices.extend(_phones(adb_names, adb_servers or [], connect or []))
    devices = [d for d in devices if d.serial not in excluded]
    if not devices:
        raise DeviceError("no device left to run on; check --device and --exclude")
    return devices


def _qemu_available() -> bool:
    import shutil

    from layerdiff.collector.transport.arm64runtime import QEMU

    return shutil.which(QEMU) is not None


def _phones(names: list[str], adb_servers: list[str], connect: list[str]) -> list[Device]:
    """ADB devices by serial; `all` alone with no adb server running (and none named) means no phones."""
    from layerdiff.collector.transport.adb import adb_devices  # the ADB stack loads only when a phone is asked for

    try:
        return list(adb_devices(names, adb_servers, connect))
    except DeviceError:
        if names == ["all"] and not adb_servers and not connect:
            return []
        raise


def probe_backends(device: Device, engine: str) -> tuple[dict[str, dict], str]:
    """Ask the device's harness what it can run; returns (backends, harness version) or raises DeviceError."""
    probe = probe_document(device, engine)  # a kept answer where the device keeps them
    try:
        backends, version = probe["engines"][engine]["backends"], str(probe.get("version", ""))
    except (KeyError, TypeError):
        raise DeviceError(f"{device.serial}: the harness --probe printed no {engine} section") from None
    return _explained(device, backends), version


def _explained(device: Device, backends: dict[str, dict]) -> dict[str, dict]:
    """The harness says why a backend is missing as it sees it; a device that knows better (the
    emulated arm64 phone: no GPU at all, not a missing driver) says it instead."""
    explain = getattr(device, "unavailable_reason", None)
    if explain is None or not isinstance(backends, dict):
        return backends
    return {name: ({**cap, "reason": explain(name, str(cap.get("reason", "")))}
                   if isinstance(cap, dict) and not cap.get("ok") else cap) for name, cap in backends.items()}


def estimate_dump_bytes(plan: SweepPlan) -> int | None:
    """One dump's size, measured by running the model once on the host engine (phones only).

    A phone's free space must be checked before its harness fills it; the tensors a phone dumps are
    the tensors the host engine dumps, so one host run gives the exact size for every configuration.
    """
    if all(isinstance(d, LocalDevice) for d in plan.devices):
        return None
    from layerdiff.collector.run.pipeline import collect_run
    from layerdiff.collector.transport.scratch import scratch_dir

    spec = RunSpec(plan.model, "cpu", "high", plan.inputs[0], threads=plan.threads, deadline_s=plan.deadline_s)
    with scratch_dir("estimate") as tmp:  # a whole dump: locked, so a killed collect's is removed by the next
        try:
            outcome = collect_run(LocalDevice(tmp), spec, tmp)
            with DumpFile(outcome.paths[0]) as dump:
                return int((dump.layers["numel"] * 4).sum())
        except (LayerdiffError, IndexError):
            return None  # no host estimate: the harness's own write errors still protect the run


def plan_runs(plan: SweepPlan, previous: dict[tuple, IndexRow] | None = None) -> list[PlannedRun]:
    """Every run of the sweep with its fate decided (see module docstring)."""
    previous = read_index(plan.out_dir) if previous is None else previous
    model_hash = plan.model.sha256
    # The host run that sizes the dump and the devices' probes wait on different machines (or
    # processes): asked at once, planning takes the longer of the two instead of their sum.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="estimate") as pool:
        estimate = pool.submit(estimate_dump_bytes, plan)
        capabilities = [_capabilities(plan, device) for device in plan.devices]
        expected = estimate.result()
    runs: list[PlannedRun] = []
    decisions: list[tuple[dict | None, str]] = []
    for device, (backends, harness, skip_all) in zip(plan.devices, capabilities):
        out_dir = plan.device_dir(device)
        for spec in plan.specs():
            spec.expected_bytes = expected
            row = IndexRow(device.serial, requested(spec.model.engine, spec.engine_version), spec.backend, spec.precision, spec.inputs.label,
                           spec.repeat, model_sha256=model_hash, input_sha256=spec.inputs.sha256(), harness=harness,
                           settings=settings_text(spec))
            runs.append(PlannedRun(device, spec, row, out_dir))
            decisions.append((backends, skip_all))
    assign_file_names(runs, previous, plan.out_dir)
    for run, (backends, skip_all) in zip(runs, decisions):
        _decide(run, plan, previous.get(run.row.key), backends, skip_all)
    return runs


def assign_file_names(runs: list[PlannedRun], previous: dict[tuple, IndexRow], base: Path) -> None:
    """Give every planned run file names no other run of the directory has, before anything runs.

    Names come from labels made safe for file names, so two inputs (`a b.npy`, `a_b.npy`) can share
    one; the later run then gets `-2` (`-3`, ...) after its input part (index.csv's `files` once written). A run
    the index already names keeps its recorded names (a resume finds its files whatever the order of
    --input), and files the index gives to runs not planned now are never taken."""
    planned = {run.row.key for run in runs}
    used = {base / name for key, row in previous.items() if key not in planned for name in row.files}
    pending: list[PlannedRun] = []
    for run in runs:
        before = previous.get(run.row.key)
        suffix = _recorded_suffix(run.spec, before.files) if before is not None else None
        if suffix is None or used & set(_targets(run, suffix)):
            pending.append(run)
            continue
        run.spec.suffix = suffix
        used.update(_targets(run, suffix))
    for run in pending:
        suffix, k = "", 1
        while used & set(_targets(run, suffix)):
            k += 1
            suffix = f"-{k}"
        run.spec.suffix = suffix
        used.update(_targets(run, suffix))


def _targets(run: PlannedRun, suffix: str) -> list[Path]:
    saved, run.spec.suffix = run.spec.suffix, suffix
    try:
        return [run.out_dir / name for name in run.spec.output_names()]
    finally:
        run.spec.suffix = saved


_SUFFIX = re.compile(r"(-[0-9]+)?")


def _recorded_suffix(spec: RunSpec, files: list[str]) -> str | None:
    """The suffix an earlier sweep gave this run, read back from its recorded file names (None: none)."""
    if not files:
        return None
    first = Path(files[0]).name
    ending = ".h5" if spec.repeat == 1 else "_r0.h5"
    if not (first.startswith(spec.base_stem) and first.endswith(ending)):
        return None
    suffix = first[len(spec.base_stem):len(first) - len(ending)]
    return suffix if _SUFFIX.fullmatch(suffix) else None


def _capabilities(plan: SweepPlan, device: Device) -> tuple[dict[str, dict] | None, str, str]:
    if not plan.probe:
        return None, "", ""
    if _host_cpu_only(plan, device):
        return {"cpu": {"ok": True}}, HARNESS_VERSION, ""
    if plan.engine_version:  # the kept probe is the installed release's: each run of another says itself what works
        return None, HARNESS_VERSION, ""
    try:
        backends, version = probe_backends(device, plan.model.engine)
    except LayerdiffError as err:
        return None, "", str(err)
    return backends, version, ""


def _host_cpu_only(plan: SweepPlan, device: Device) -> bool:
    """The host's own engines (PyPI wheels) always have their CPU backend: a probe process cost
    a third of a one-run `collect`'s CPU and could tell a cpu-only plan nothing else it uses."""
    backends = {backend for backend, _ in plan.configs} if plan.configs else set(plan.backends)
    return type(device) is LocalDevice and backends == {"cpu"}


def _decide(run: PlannedRun, plan: SweepPlan, before: IndexRow | None, backends: dict | None, skip_all: str) -> None:
    row, targets = run.row, [run.out_dir / name for name in run.spec.output_names()]
    if skip_all:
        row.status, row.reason, run.todo = RunStatus.SKIPPED, skip_all, False
        return
    capability = (backends or {}).get(run.spec.backend)
    if backends is not None and not (capability or {}).get("ok", False):
        reason = (capability or {}).get("reason") or f"the harness has no {run.spec.backend} backend"
        row.status, row.reason, run.todo = RunStatus.SKIPPED, f"{run.spec.backend} unavailable: {reason}", False
        return
    blocked = next((t for t in targets if t.exists() and not t.is_file()), None)
    if blocked is not None:  # even --force cannot write there: say so now, not as a crash mid-run
        row.status, run.todo = RunStatus.FAILED, False
        row.reason = f"{blocked} is in the way (not a dump file); move it away or choose another -o"
        return
    if plan.force:
        return
    if (before is not None and before.status == RunStatus.FAILED and not plan.retry_failed and _same_inputs(before, row)
            and not before.reason.startswith(NO_SPACE)):  # the host's disk was full, not the run at fault: retried
        row.status, row.duration_s, run.todo = RunStatus.FAILED, before.duration_s, False
        row.reason = before.reason.removesuffix(" (use --retry-failed)") + " (use --retry-failed)"
        row.files = before.files
        return
    if all(t.exists() for t in targets):
        _existing(run, targets, plan.out_dir)


def _same_inputs(before: IndexRow, row: IndexRow) -> bool:
    """The same run as an earlier row: model, input and every setting that changes a dump (an index
    written before settings were recorded has none: its rows compare on model and input)."""
    return (before.model_sha256 == row.model_sha256 and before.input_sha256 == row.input_sha256
            and (not before.settings or before.settings == row.settings))


def settings_difference(attrs: dict, spec: RunSpec) -> str:
    """Which recorded setting of an existing dump differs from this run's ("" when none does; a dump
    from before settings were recorded has none to compare)."""
    for name, wanted in dump_settings(spec).items():
        if name in attrs and str(attrs[name]) != str(wanted):
            option = SETTING_OPTIONS[name]
            return f"{option} {_shown(attrs[name])}, this run {option} {_shown(wanted)}"
    return ""


def _shown(value) -> str:
    text = str(value)
    return "(none)" if text in ("", "0") else repr(text) if not text.isdigit() else text


def _existing(run: PlannedRun, targets: list[Path], base: Path) -> None:
    """Files already there: done if they are this very run, refused (not overwritten) otherwise."""
    row = run.row
    for target in targets:
        try:
            with DumpFile(target) as dump:
                attrs = dump.attrs
        except LayerdiffError:
            row.status, row.reason, run.todo = RunStatus.FAILED, f"{target} exists but is unreadable; use --force to replace it", False
            return
        if attrs.get("model_sha256") != row.model_sha256 or attrs.get("input_sha256") != row.input_sha256:
            row.status, run.todo = RunStatus.FAILED, False
            row.reason = f"{target.name} exists from another model or input; use --force or another -o"
            return
        other = settings_difference(attrs, run.spec)
        if other:
            row.status, run.todo = RunStatus.FAILED, False
            row.reason = f"{target.name} exists from other settings ({other}); use --force to replace it or another -o"
            return
        if not attrs.get("complete", True):
            return  # an incomplete earlier attempt is re-run
    row.status, row.reason, run.todo = RunStatus.DONE, "already collected", False
    row.files = [relative_name(t, base) for t in targets]
    run.paths = targets


def relative_name(path: Path, base: Path) -> str:
    """How index.csv names a file: relative to the sweep's output directory when inside it."""
    return str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
