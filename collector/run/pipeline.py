"""One run on one device: stage → execute (with a deadline) → fetch → convert to HDF5 → clean up.

The steps are the same for a phone and for the `local` device; only the `Device` differs. Whatever
happens, what the harness dumped is kept: a crash, a deadline or a bad exit still converts the
partial raw dump into an HDF5 marked incomplete, under a temporary name renamed at the end.
"""
from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

import numpy as np

from layerdiff.vocabulary import RunStatus
from layerdiff.clioptions import check_number
from layerdiff.analyzer.formats.diskspace import writing
from layerdiff.errors import DumpFormatError, Interrupted, LayerdiffError, StorageError, UsageError
from layerdiff.analyzer.formats.enginefacts import ATTRIBUTE as ENGINE_FACTS, NO_FACTS
from layerdiff.analyzer.formats.fedinputs import fed_ok
from layerdiff.analyzer.formats.rawdump import MANIFEST, convert_raw_dump, fed_check, read_raw_dump
from layerdiff.collector.transport.devices import Device, DeviceError, DeviceInfo, ExecResult
from layerdiff.collector.engines.harness_cli import INPUT_DTYPES
from layerdiff.collector.engines.versions import engine_label, reported_release, requested, same_release
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.run.fresh import execute_fresh
from layerdiff.collector.inputs.modelfiles import ModelFiles, input_dtypes
from layerdiff.collector.run.outdir_lock import FETCH_PREFIX
from layerdiff.collector.run.sketchpull import fetch_dump, sketch_dir
from layerdiff.collector.transport.scratch import scratch_dir

PROGRESS_PREFIX = "@@ld "
HARNESS_EXIT_MEANINGS = {
    2: "the harness refused its arguments",
    3: "the model failed to load",
    4: "the backend is not available on this device",
    5: "the run failed",
    6: "writing the dump failed (device storage full?)",
}

ProgressSink = Callable[[int, int, str], None]


@dataclass(kw_only=True)
class RunOptions:
    """How a harness runs, the same for every run of a sweep (so a sweep carries one of these)."""

    threads: int = 1
    repeat: int = 1
    deadline_s: float = 900.0
    layers: str | None = None
    max_bytes: int | None = None
    keep: bool = False
    fresh_process: bool = False  # with repeat > 1: each repeat in its own harness process (collector/run/fresh.py)
    pull: str = "auto"  # "auto" | "sketch" | "full": how a phone's dump comes to the host (docs/sketch.md)

    def __post_init__(self) -> None:
        check_run_options(self.threads, self.repeat, self.deadline_s, self.layers, self.max_bytes)
        if self.pull not in ("auto", "sketch", "full"):
            raise UsageError(f"pull mode {self.pull!r}: use auto, sketch (--sketch) or full (--full)")

    def run_options(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(RunOptions)}


MAX_THREADS = 1024
# Every repeat is a file per configuration, planned before anything runs: 10^12 repeats planned for
# hours before failing. Studies of nondeterminism need tens.
MAX_REPEAT = 10_000


def check_run_options(threads: int, repeat: int, deadline_s: float, layers: str | None, max_bytes: int | None) -> None:
    """Refuse option values no run can use, before any device or engine is touched (one line each)."""
    if not 1 <= threads <= MAX_THREADS:
        raise UsageError(f"--threads {threads}: use a thread count from 1 to {MAX_THREADS}")
    if repeat < 1:
        raise UsageError(f"--repeat {repeat}: dump each configuration at least once (--repeat 1 or more)")
    if repeat > MAX_REPEAT:
        raise UsageError(f"--repeat {repeat}: at most {MAX_REPEAT} repeats (each is a dump file per configuration)")
    check_number("--deadline", deadline_s, 0.0, above_minimum=True, hint=": the seconds a run may take, such as 900")
    if max_bytes is not None and max_bytes <= 0:
        raise UsageError(f"--max-bytes {max_bytes}: give a positive byte count, or leave it out for no limit")
    if layers is not None:
        try:
            re.compile(layers)
        except re.error as err:
            raise UsageError(f"--layers {layers!r}: not a valid regular expression ({err})") from None


@dataclass
class RunSpec(RunOptions):
    """Everything that defines one run's configuration (and so its output file name)."""

    model: ModelFiles
    backend: str
    precision: str
    inputs: InputSet
    extra_args: list[str] = field(default_factory=list)  # "{run_dir}" is replaced by the run's device directory
    placed_files: dict[str, Path] = field(default_factory=dict)  # path under the run directory → local file
    extra_attrs: dict = field(default_factory=dict)  # merged into the HDF5 root attributes
    prefix: str = ""
    suffix: str = ""  # "-2", "-3", ...: set by the sweep's plan when another run of it has the same file name
    expected_bytes: int | None = None  # dump size of one repetition, when known (see layerdiff.collector.sweep.plan)
    engine_version: str = ""  # `--engine NAME==VERSION`: that release, from its cached environment (engines/versions.py)

    @property
    def stem(self) -> str:
        return f"{self.base_stem}{self.suffix}"

    @property
    def base_stem(self) -> str:
        """The file name a run gets unless another run of its sweep has it already (README: file names)."""
        engine = engine_label(self.model.engine, self.engine_version)
        return f"{self.prefix}{engine}_{self.backend}_{self.precision}_{_safe(self.inputs.label)}"

    def output_names(self) -> list[str]:
        if self.repeat == 1:
            return [f"{self.stem}.h5"]
        return [f"{self.stem}_r{k}.h5" for k in range(self.repeat)]


@dataclass
class RunOutcome:
    spec: RunSpec
    serial: str
    status: str  # "done", "failed" or "skipped"
    paths: list[Path]
    message: str = ""
    exit_status: int | None = None
    duration_s: float = 0.0


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def collect_run(
    device: Device, spec: RunSpec, out_dir: Path, *, force: bool = False, on_progress: ProgressSink | None = None,
    cancel: threading.Event | None = None,
) -> RunOutcome:
    """Run `spec` on `device`, writing its HDF5 file(s) into `out_dir`.

    Once `cancel` is set (Ctrl-C) nothing more is fetched or converted: `Interrupted` is raised."""
    out_dir = Path(out_dir)
    targets = [out_dir / name for name in spec.output_names()]
    if not force and all(t.exists() for t in targets):
        return RunOutcome(spec, device.serial, "skipped", targets, "already collected (use --force to re-run)")
    start = time.monotonic()
    if out_dir.exists() and not out_dir.is_dir():
        raise StorageError(f"output {out_dir} is a file; pass a directory to -o")
    out_dir.mkdir(parents=True, exist_ok=True)
    harness = _harness(device, spec)
    run_dir = device.new_run_dir(spec.stem)
    try:
        check_space(device, spec, run_dir)
        with scratch_dir("inputs") as tmp:
            argv = _stage(device, spec, run_dir, tmp)
            if spec.fresh_process and spec.repeat > 1:
                result = execute_fresh(device, harness.argv, argv, run_dir, spec.repeat, env=harness.env,
                                       deadline_s=spec.deadline_s, on_stdout_line=_progress_parser(on_progress))
            else:
                result = device.execute(harness.argv + argv, env=harness.env, deadline_s=spec.deadline_s,
                                        on_stdout_line=_progress_parser(on_progress))
        with writing(out_dir, (spec.expected_bytes or 0) * spec.repeat):
            paths, message = _fetch_and_convert(device, spec, run_dir, targets, result, cancel)
    finally:
        sketched = kept_sketches(targets)  # refined once the sweep is done, then removed
        if not spec.keep and not sketched:
            _cleanup(device, run_dir)
        elif hasattr(device, "keep_run_dir"):
            device.keep_run_dir(run_dir)  # a scratch of the host's: marked kept, so no later start removes it
    status = RunStatus.DONE if not message else RunStatus.FAILED
    return RunOutcome(spec, device.serial, status, paths, message, result.exit_status, time.monotonic() - start)


def kept_sketches(targets: list[Path]) -> bool:
    """Whether a sketch-first pull of these targets waits for the sweep's refinement (its HDF5 was written).
    A pull cut short before its HDF5 (Ctrl-C, a device lost, a failed conversion) is removed here: nothing can
    refine it, and a re-run collects that run again from the start."""
    waiting = False
    for target in targets:
        if not sketch_dir(target).is_dir():
            continue
        if Path(target).is_file():
            waiting = True
        else:
            shutil.rmtree(sketch_dir(target), ignore_errors=True)
    return waiting


def _harness(device: Device, spec: RunSpec):
    """How the device runs the spec's engine: the installed release, or the one `--engine NAME==VERSION` asked
    for (from its cached wheel environment or its own build: engines/versions.py)."""
    if not spec.engine_version:
        return device.prepare_harness(spec.model.engine, spec.backend)
    from layerdiff.collector.engines import ENGINES
    from layerdiff.collector.engines.versions import versioned_harness

    return versioned_harness(device, ENGINES[spec.model.engine], spec.backend, spec.engine_version)


SPACE_MARGIN = 16 << 20


def check_space(device: Device, spec: RunSpec, run_dir: str) -> None:
    """Refuse a run whose dump cannot fit on the device, before the harness fills the disk."""
    if not spec.expected_bytes:
        return
    need = spec.expected_bytes * spec.repeat
    if spec.max_bytes:
        need = min(need, spec.max_bytes * spec.repeat)
    free = device.free_bytes(run_dir)
    if free < need + SPACE_MARGIN:
        raise DeviceError(
            f"{device.serial}: not enough space under {run_dir}: the dump needs about {need / 2**20:.1f} MiB, "
            f"{free / 2**20:.1f} MiB free; free space on the device or dump less with --layers / --max-bytes"
        )


def _stage(device: Device, spec: RunSpec, run_dir: str, scratch: Path) -> list[str]:
    """Put model and inputs on the device; returns the harness arguments that refer to them."""
    argv = ["--engine", spec.model.engine]
    for model_file in spec.model.files:
        argv += ["--model", device.stage(model_file, run_dir)]
    dtypes = input_dtypes(spec.model) if spec.inputs.arrays else {}
    for index, (name, array) in enumerate(spec.inputs.arrays.items()):
        local = scratch / f"input{index}.npy"
        np.save(local, staged_array(array, dtypes.get(name, "float32")))
        argv += ["--input", f"{name}={device.stage(local, run_dir)}"]
    for relative, local in spec.placed_files.items():
        device.put(local, f"{run_dir}/{relative}")
    argv += ["--backend", spec.backend, "--precision", spec.precision, "--threads", str(spec.threads)]
    argv += ["--out", f"{run_dir}/dump"]
    if spec.repeat > 1:
        argv += ["--repeat", str(spec.repeat)]
    if spec.layers:
        argv += ["--layers", spec.layers]
    if spec.max_bytes:
        argv += ["--max-bytes", str(spec.max_bytes)]
    return argv + [arg.replace("{run_dir}", run_dir) for arg in spec.extra_args]


def staged_array(array: np.ndarray, model_dtype: str) -> np.ndarray:
    """What goes into an input's .npy: the dtype the model takes (`<f4` for float inputs, the harness
    format; int32/int64/bool where the model says so), little-endian, C order, 0-d kept 0-d."""
    dtype = np.dtype(model_dtype if model_dtype in INPUT_DTYPES else "float32").newbyteorder("<")
    return np.asarray(array, dtype=dtype, order="C")


def _progress_parser(sink: ProgressSink | None) -> Callable[[str], None] | None:
    if sink is None:
        return None

    def parse(line: str) -> None:
        if not line.startswith(PROGRESS_PREFIX):
            return
        try:
            event = json.loads(line[len(PROGRESS_PREFIX) :])
            sink(int(event.get("k", 0)), int(event.get("n", 0)), str(event.get("op", "")))
        except (ValueError, TypeError, AttributeError):
            return

    return parse


def harness_failure(result: ExecResult, deadline_s: float) -> str:
    """One line saying why a harness run did not finish, with its last stderr line."""
    if result.exit_status == 0:
        return ""
    tail = [line for line in result.stderr.strip().splitlines() if line.strip()][-1:] or [""]
    last = tail[0].strip().removeprefix("layerdiff-harness: ")
    detail = f": {last}" if last else ""
    if result.timed_out:
        return f"deadline of {deadline_s:.0f}s exceeded; raise --deadline or dump fewer layers{detail}"
    if result.exit_status < 0 or result.exit_status >= 128:
        signal = -result.exit_status if result.exit_status < 0 else result.exit_status - 128
        return f"the harness was killed by signal {signal} (crash){detail}"
    meaning = HARNESS_EXIT_MEANINGS.get(result.exit_status, f"the harness exited with status {result.exit_status}")
    return f"{meaning}{detail}"


def _fetch_and_convert(
    device: Device, spec: RunSpec, run_dir: str, targets: list[Path], result: ExecResult,
    cancel: threading.Event | None = None, dump_dirs: list[str] | None = None,
) -> tuple[list[Path], str]:
    message = harness_failure(result, spec.deadline_s)
    if dump_dirs is None:
        dump_dirs = [f"{run_dir}/dump"] if spec.repeat == 1 else [f"{run_dir}/dump/r{k}" for k in range(spec.repeat)]
    written: list[Path] = []
    stop = cancel.is_set if cancel is not None else None
    with _fetch_scratch(device, targets[0].parent) as tmp:
        for k, (remote, target) in enumerate(zip(dump_dirs, targets)):
            if stop and stop():
                raise Interrupted(f"{device.serial}: {spec.stem}: stopped on request")
            try:
                local = fetch_dump(device, remote, Path(tmp) / f"r{k}", spec.pull, target, run_dir)
            except DumpFormatError as err:  # --sketch of a dump without summaries
                return written, f"{message + '; ' if message else ''}{err}"
            except DeviceError as err:
                return written, f"{message + '; ' if message else ''}{err}"
            if not (Path(local) / MANIFEST).is_file():
                if not message:
                    message = f"the harness wrote no dump at {remote}"
                continue
            path, cut, fed_line = _convert(device, spec, Path(local), target, result, stop, k)
            written.append(path)
            if cut and not message:  # the harness said it finished, yet its dump stops short: not a done run
                message = (f"the harness reported success but the dump it left is cut short ({cut}); the layers "
                           "before the cut are kept, marked incomplete; re-run with --retry-failed")
            if fed_line and fed_line not in message:
                message = f"{message + '; ' if message else ''}{fed_line}"
    return written, message


def _fetch_scratch(device: Device, parent: Path):
    """Where fetched dumps land: nowhere for a device whose dumps are already here (the host's are used in
    place, and a directory made and removed per run costs as much as a small run's conversion)."""
    if getattr(device, "fetches_in_place", False):
        return contextlib.nullcontext(str(parent / f"{FETCH_PREFIX}unused"))
    return tempfile.TemporaryDirectory(prefix=FETCH_PREFIX, dir=parent)


def cut_short(raw) -> str:
    """Why a raw dump is shorter than its harness wrote it ("" when whole): no footer, or a
    `tensors.bin` ending inside a layer. A footer whose status names a stop the user asked for
    (`--max-bytes`) is a whole dump of what was asked."""
    if raw.footer is not None and not raw.truncated:
        return ""
    return raw.problems[0] if raw.problems else "no footer"


def _convert(device: Device, spec: RunSpec, local: Path, target: Path, result: ExecResult,
             stop: Callable[[], bool] | None = None, repeat_index: int = 0) -> tuple[Path, str, str]:
    """The HDF5 of one raw dump, why the raw dump was cut short ("" when it is whole), and '' or the line
    saying the engine received another input than the one given (its read-back, `input_fed`, checked here:
    such a run is converted, and reported as failed)."""
    try:
        raw = read_raw_dump(local)
    except LayerdiffError as err:
        raise DumpFormatError(f"{device.serial}: {spec.stem}: the harness's dump is unusable ({err})") from None
    info = _device_info(device, spec, raw.header)
    attrs = {
        **info.provenance(),
        "input_label": spec.inputs.label,
        "model_name": spec.model.name,
        "model_sha256": spec.model.sha256,  # what the collector sent, whatever the harness reports
        "input_sha256": spec.inputs.sha256() if spec.inputs.arrays else "",
        **dump_settings(spec),
        **spec.extra_attrs,
        "provenance": {
            **spec.extra_attrs.get("provenance", {}),
            "device": info.as_dict(),
            "input_source": spec.inputs.source,
            "input_preprocess": spec.inputs.preprocess,
            "harness_duration_s": result.duration_s,
            "timed_out": result.timed_out,
            "device_log": result.device_log,
            "command": shlex.join(["layerdiff-harness", "--backend", spec.backend, "--precision", spec.precision]),
        },
    }
    version_line = ""
    if spec.engine_version:
        from layerdiff.collector.engines import ENGINES

        attrs["engine_requested"] = requested(spec.model.engine, spec.engine_version)
        reported = str(raw.header.get("engine_version", ""))
        if not same_release(spec.engine_version, reported_release(ENGINES[spec.model.engine], reported, info.kind)):
            version_line = (f"{spec.model.engine}=={spec.engine_version} was asked for but the engine reported version "
                            f"{reported or '(none)'}; remove that release's environment or build from the layerdiff "
                            "cache and re-run")
    if spec.fresh_process and spec.repeat > 1:  # each process's header says repeat 0: the index is the collector's
        attrs["repeat"] = repeat_index
        attrs["provenance"]["fresh_process"] = True
    reach = _precision_reach(raw.header, spec)
    if reach:
        attrs["precision_reach"] = reach
    written = _declared_observability(raw, spec)
    if written:
        attrs["observability"] = written
    attrs[ENGINE_FACTS] = _engine_facts(raw.header, spec)
    opencl = opencl_device_name(raw.header)
    if opencl:  # the device that computed, not the phone's display GPU (a CPU OpenCL such as PoCL, too)
        attrs["gpu"] = opencl
    attrs.update(driver_attrs(raw.header, info))
    fed = fed_check(raw, list(spec.inputs.arrays.items())) if raw.fed else ""
    if fed:
        attrs["input_fed_check"] = fed
    path = convert_raw_dump(raw, target, attrs=attrs, inputs=list(spec.inputs.arrays.items()),
                            stderr=result.stderr, exit_status=result.exit_status, cancel=stop)
    fed_line = "" if fed_ok(fed) else f"{spec.model.engine} was fed another input: {fed}"
    return path, cut_short(raw), "; ".join(line for line in (version_line, fed_line) if line)


SETTING_OPTIONS = {"threads_requested": "--threads", "layers_filter": "--layers", "max_bytes": "--max-bytes"}


def dump_settings(spec: RunOptions) -> dict:
    """The options that change what a dump holds besides model, input, backend and precision, as the
    dump's root attributes record them: a resume compares these before calling a file "already collected"."""
    return {"threads_requested": int(spec.threads), "layers_filter": spec.layers or "",
            "max_bytes": int(spec.max_bytes or 0)}


def settings_text(spec: RunOptions) -> str:
    """`dump_settings` as index.csv's `settings` column writes it (and a reason names a difference)."""
    return ";".join(f"{name}={value}" for name, value in dump_settings(spec).items())


def _precision_reach(header: dict, spec: RunSpec) -> str:
    """What the engine declares separates this run's precision from its others on the backend that ran
    (JSON {other precision: op types}; "" when it declares nothing): the analyzer asks about two labels
    with identical bytes only where their settings could differ for the graph."""
    from layerdiff.collector.engines import ENGINES

    engine = ENGINES.get(str(header.get("engine") or spec.model.engine))
    reach = engine.reach_of(spec.backend, spec.precision) if engine is not None else {}
    return json.dumps(reach, sort_keys=True) if reach else ""


def _declared_observability(raw, spec: RunSpec) -> str:
    """The engine's declaration of why every tensor it dumps was written by the run (JSON, the dump's
    `observability` record: collector/engines/unwritten.py), for a run that did not check its tensors itself
    (no record in its header or footer); "" when there is nothing to add."""
    from layerdiff.collector.engines import ENGINES
    from layerdiff.collector.engines.unwritten import written

    if "observability" in raw.header or "observability" in (raw.footer or {}):
        return ""
    engine = ENGINES.get(str(raw.header.get("engine") or spec.model.engine))
    why = engine.written_why(spec.backend) if engine is not None else ""
    return json.dumps(written(why), sort_keys=True) if why else ""


def _engine_facts(header: dict, spec: RunSpec) -> str:
    """What the run's engine declares for the analyzer (analyzer/formats/enginefacts.py), as the header's
    JSON: written for every run, so a dump without it is one written before the attribute existed."""
    from layerdiff.collector.engines import ENGINES

    engine = ENGINES.get(str(header.get("engine") or spec.model.engine))
    return (engine.facts if engine is not None else NO_FACTS).to_json()


def _device_info(device: Device, spec: RunSpec, header: dict) -> DeviceInfo:
    """The device's facts; for a Vulkan run on a device that does not know its GPU (the host), the
    GPU is the one the harness says it computed on (ncnn's options.vulkan_device: the device ncnn picked,
    not the first one listed), else `vulkaninfo`'s first device (a process and a Vulkan instance)."""
    info = device.info()
    vulkan_gpu = getattr(device, "vulkan_gpu", None)
    if spec.backend != "vulkan" or vulkan_gpu is None or info.gpu:
        return info
    options = header.get("options")
    named = options.get("vulkan_device") if isinstance(options, dict) else None
    return replace(info, gpu=named if isinstance(named, str) and named else vulkan_gpu())


DRIVER_TEXT_MAX = 300  # characters of a driver field kept as a root attribute (the header keeps all of it)


def driver_attrs(header: dict, info: DeviceInfo) -> dict:
    """`gpu_driver` (version and mapped library file names) and `gpu_driver_build` (the pipeline cache
    UUID, which changes with each driver build) from the header's options.vulkan_driver, and the phone's
    `build_fingerprint` (its vendor driver ships with the build); only the facts that are known."""
    out = {}
    fingerprint = info.extra.get("fingerprint") if isinstance(info.extra, dict) else ""
    if isinstance(fingerprint, str) and fingerprint:
        out["build_fingerprint"] = fingerprint
    options = header.get("options")
    driver = options.get("vulkan_driver") if isinstance(options, dict) else None
    if not isinstance(driver, dict):
        return out
    libraries = driver.get("libraries") if isinstance(driver.get("libraries"), list) else []
    names = [Path(str(lib.get("path", ""))).name for lib in libraries if isinstance(lib, dict) and lib.get("path")]
    version = str(driver.get("driver_version") or "?")[:DRIVER_TEXT_MAX]  # a harness's answer is untrusted
    out["gpu_driver"] = f"{version} ({', '.join(names) or 'library not seen'})"[:DRIVER_TEXT_MAX]
    if driver.get("pipeline_cache_uuid"):
        out["gpu_driver_build"] = str(driver["pipeline_cache_uuid"])[:DRIVER_TEXT_MAX]
    return out


def opencl_device_name(header: dict) -> str:
    """`name (platform)` of the OpenCL device the harness says its run used (options.opencl_device), else ""."""
    options = header.get("options")
    found = options.get("opencl_device") if isinstance(options, dict) else None
    if not isinstance(found, dict) or not found.get("name"):
        return ""
    return f"{found['name']} ({found.get('platform') or 'platform unknown'})"


def _cleanup(device: Device, run_dir: str) -> None:
    try:
        device.remove(run_dir)
    except DeviceError:
        pass  # a device that went away keeps its scratch files; nothing collected depends on them
