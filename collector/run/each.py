"""One configuration over many inputs in one engine process: the harness's `--each` (HARNESS_CLI.md).

`collect --input DIR` runs one configuration on every input of the folder. Started once per input,
the host engine would import its library and load the model N times; here the engine process starts
once per configuration, loads the model once, and runs every input in turn. Each input is still its
own run: its own raw dump and header (its input's sha256, what the engine was fed), converted to its
own HDF5 file as soon as the engine finishes it, while the engine goes on with the next, so a crash
keeps every input before it. The input the process died on is converted from what it dumped (marked
incomplete), failed with one line naming it, and a new process takes the inputs after it.
"""
from __future__ import annotations

import json
import posixpath
import queue
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from layerdiff.analyzer.formats.diskspace import NO_SPACE, NoSpaceError, writing
from layerdiff.errors import LayerdiffError, os_error_line
from layerdiff.vocabulary import RunStatus
from layerdiff.collector.engines.harness_cli import CASE_EVENT
from layerdiff.collector.inputs.modelfiles import input_dtypes
from layerdiff.collector.run.pipeline import (PROGRESS_PREFIX, ProgressSink, RunOutcome, RunSpec, _fetch_and_convert,
                                              _harness, staged_array)
from layerdiff.collector.transport.devices import Device, ExecResult
from layerdiff.collector.transport.scratch import scratch_dir

CASES_FILE = "cases.jsonl"


def runs_in_one_process(device: Device, spec: RunSpec) -> bool:
    """Whether `spec`'s configuration can take its inputs in one engine process on `device`: a harness that
    takes `--each` there (the host's and the `arm64` device's Python engines, the C++ harness on phones; an
    engine's own native harness, such as ggml's, takes one input a process), one dump per input (no
    --repeat), nothing staged beside the model and inputs."""
    takes_each = getattr(device, "takes_each", None)
    if takes_each is None or spec.repeat != 1 or spec.fresh_process or spec.extra_args or spec.placed_files:
        return False
    return bool(takes_each(spec.model.engine, spec.backend))


def same_configuration(a: RunSpec, b: RunSpec) -> bool:
    """Two runs one engine process can serve: everything but the input alike."""
    return (a.model is b.model or a.model.sha256 == b.model.sha256) and (a.backend, a.precision, a.engine_version,
            a.run_options()) == (b.backend, b.precision, b.engine_version, b.run_options())


@dataclass
class Listener:
    """What the sweep hears per input: started, a dumped layer, and its outcome (called from the thread
    that reads the engine's output)."""

    started: Callable[[RunSpec], None]
    outcome: Callable[[RunOutcome], None]
    layer: ProgressSink | None = None
    # one line for a failure nothing foresaw inside one input's conversion (the sweep logs its traceback)
    unexpected: Callable[[Exception], str] = lambda err: f"unexpected error {type(err).__name__}: {err}"


def collect_each(device: Device, specs: list[RunSpec], out_dir: Path, listener: Listener,
                 cancel: threading.Event | None = None) -> None:
    """Run `specs` (one configuration, one input each) in as few engine processes as crashes allow; every
    spec gets exactly one outcome, in order, unless `cancel` stops the sweep first."""
    pending = list(specs)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    while pending and not (cancel is not None and cancel.is_set()):
        finished = _one_process(device, pending, Path(out_dir), listener, cancel)
        pending = pending[finished:]


def _one_process(device: Device, specs: list[RunSpec], out_dir: Path, listener: Listener,
                 cancel: threading.Event | None) -> int:
    """One engine process over `specs`; returns how many of them got their outcome (at least one)."""
    first = specs[0]
    harness = _harness(device, first)
    run_dir = device.new_run_dir(f"{first.stem}-each")
    state = _State(device, specs, out_dir, run_dir, listener, cancel)
    try:
        with scratch_dir("inputs") as tmp:
            argv = _stage(device, specs, run_dir, tmp)
            deadline = first.deadline_s * len(specs)
            result = device.execute(harness.argv + argv, env=harness.env, deadline_s=deadline, on_stdout_line=state.line)
        return state.after_exit(result)
    finally:
        state.remover.finish()
        if not first.keep:
            _remove(device, run_dir)
        elif hasattr(device, "keep_run_dir"):
            device.keep_run_dir(run_dir)


def _stage(device: Device, specs: list[RunSpec], run_dir: str, scratch: Path) -> list[str]:
    """The model once, every input, and the `--each` file naming each input's files and dump directory,
    put in the run directory with paths relative to it (the harness reads them from the file's directory)."""
    first = specs[0]
    argv = ["--engine", first.model.engine]
    for model_file in first.model.files:
        argv += ["--model", device.stage(model_file, run_dir)]
    dtypes = input_dtypes(first.model) if any(spec.inputs.arrays for spec in specs) else {}
    lines = []
    for k, spec in enumerate(specs):
        inputs = {}
        for index, (name, array) in enumerate(spec.inputs.arrays.items()):
            local = scratch / f"case{k}-input{index}.npy"
            np.save(local, staged_array(array, dtypes.get(name, "float32")))
            inputs[name] = _named_in_cases(device, device.stage(local, run_dir), run_dir)
        lines.append(json.dumps({"out": _named_in_cases(device, _case_dir(run_dir, k), run_dir), "inputs": inputs}))
    cases = scratch / CASES_FILE
    cases.write_text("\n".join(lines) + "\n", encoding="utf-8")
    device.put(cases, f"{run_dir}/{CASES_FILE}")
    argv += ["--backend", first.backend, "--precision", first.precision, "--threads", str(first.threads)]
    argv += ["--out", f"{run_dir}/unused", "--each", f"{run_dir}/{CASES_FILE}"]
    if first.layers:
        argv += ["--layers", first.layers]
    if first.max_bytes:
        argv += ["--max-bytes", str(first.max_bytes)]
    return argv + [arg.replace("{run_dir}", run_dir) for arg in first.extra_args]


def _named_in_cases(device: Device, path: str, run_dir: str) -> str:
    """How the `--each` file names a path. On a device reached over a transport (a phone): relative to the run
    directory the file is put in, since both are directories the collector made under its root, and the name
    then holds whatever path the device's shell sees them under. On the host: as given (staging there resolves
    links, which `..` in a relative name could climb out of wrongly)."""
    return path if getattr(device, "fetches_in_place", False) else posixpath.relpath(path, run_dir)


def _case_dir(run_dir: str, k: int) -> str:
    """Input k's raw dump directory (one level: a directory made or removed costs milliseconds on some disks)."""
    return f"{run_dir}/dump{k}"


class _State:
    """Follows the engine's `@@ld` lines: which input runs, and each finished one converted at once."""

    def __init__(self, device: Device, specs: list[RunSpec], out_dir: Path, run_dir: str, listener: Listener,
                 cancel: threading.Event | None) -> None:
        self.device, self.specs, self.out_dir, self.run_dir = device, specs, out_dir, run_dir
        self.listener, self.cancel = listener, cancel
        self.running: int | None = None  # the case the engine works on
        self.finished = 0
        self.since = time.monotonic()
        self.remover = _Remover(device)
        self.halted = False  # the output disk is full: later inputs would fail the same way
        self.pid: int | None = None

    def line(self, text: str) -> None:
        if not text.startswith(PROGRESS_PREFIX):
            return
        try:
            event = json.loads(text[len(PROGRESS_PREFIX):])
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("event") == CASE_EVENT:
            self._case(event)
        elif event.get("event") == "tensor" and self.running is not None and self.listener.layer is not None:
            try:
                self.listener.layer(int(event.get("k", 0)), int(event.get("n", 0)), str(event.get("op", "")))
            except (TypeError, ValueError):
                pass

    def _case(self, event: dict) -> None:
        if self.halted or (self.cancel is not None and self.cancel.is_set()):
            return  # the sweep is stopping (Ctrl-C, a full disk): no input starts or ends now; they stay planned
        k = event.get("case")
        if not isinstance(k, int) or k != self.finished or k >= len(self.specs):
            return  # cases run in order; anything else is not this engine's doing
        if event.get("state") == "start":
            self.running, self.since = k, time.monotonic()
            self.pid = event.get("pid") if isinstance(event.get("pid"), int) else None
            self.listener.started(self.specs[k])
            return
        failed = event.get("state") == "failed"
        code = event.get("code") if failed else 0
        message = str(event.get("message", "")) if failed else ""
        result = ExecResult(exit_status=(code if isinstance(code, int) and code > 0 else 5) if failed else 0,
                            stderr=f"layerdiff-harness: {message}\n" if message else "",
                            duration_s=time.monotonic() - self.since)
        self._conclude(k, result, "")
        self.running = None

    def _conclude(self, k: int, result: ExecResult, why: str) -> None:
        """Convert case `k`'s dump (whatever is there) into its HDF5 file and report its outcome."""
        spec = self.specs[k]
        self.finished = k + 1
        if self.cancel is not None and self.cancel.is_set():
            return  # the interrupt handler owns the rows of a stopped sweep
        targets = [self.out_dir / name for name in spec.output_names()]
        provenance = {**spec.extra_attrs.get("provenance", {}),
                      "engine_process": {"pid": self.pid, "position": k, "inputs": len(self.specs)}}
        recorded = replace(spec, extra_attrs={**spec.extra_attrs, "provenance": provenance})
        try:
            with writing(self.out_dir, spec.expected_bytes or 0):
                paths, message = _fetch_and_convert(self.device, recorded, self.run_dir, targets, result, self.cancel,
                                                    dump_dirs=[_case_dir(self.run_dir, k)])
        except NoSpaceError as err:
            paths, message = [], f"{NO_SPACE}: {err}"
            self.halted = True
        except LayerdiffError as err:
            paths, message = [], str(err)
        except OSError as err:
            paths, message = [], os_error_line(err)
        except Exception as err:  # noqa: BLE001 - this input's failure, never the other inputs'
            paths, message = [], self.listener.unexpected(err)
        if why:
            message = f"{why}: {message}" if message else why
        status = RunStatus.DONE if not message else RunStatus.FAILED
        if not spec.keep:
            self.remover.put(_case_dir(self.run_dir, k))  # the disk holds about one input's dump at a time
        self.listener.outcome(RunOutcome(spec, self.device.serial, status, paths, message, result.exit_status,
                                         time.monotonic() - self.since))

    def after_exit(self, result: ExecResult) -> int:
        """The process ended: every case done, or it died inside one (that one fails, naming its input,
        with what it dumped kept) or before any (every case left fails with its line)."""
        if self.halted or self.finished >= len(self.specs) or (self.cancel is not None and self.cancel.is_set()):
            return len(self.specs) if self.halted else max(self.finished, 1)
        if result.exit_status == 0 and not result.timed_out:
            result = replace(result, exit_status=5, stderr=result.stderr + "\nlayerdiff-harness: the engine stopped "
                             "before every input was run\n")
        k = self.finished
        if self.running is None:  # nothing started: the process itself cannot run (bad arguments, no engine)
            for rest in range(k, len(self.specs)):
                self.listener.started(self.specs[rest])
                self._conclude(rest, result, "")
            return len(self.specs)
        label = self.specs[k].inputs.label
        self._conclude(k, result, f"the engine process ended on input {label}, the inputs after it run in a new "
                                  "process")
        return k + 1


class _Remover(threading.Thread):
    """Removes converted inputs' dump directories beside the conversions (removing a directory waits on
    the disk, converting on the CPU: in turn, they added up)."""

    def __init__(self, device: Device) -> None:
        super().__init__(name="each-remove", daemon=True)
        self.device = device
        self.queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.start()

    def put(self, path: str) -> None:
        self.queue.put(path)

    def run(self) -> None:
        while (path := self.queue.get()) is not None:
            _remove(self.device, path)

    def finish(self) -> None:
        self.queue.put(None)
        self.join()


def _remove(device: Device, path: str) -> None:
    try:
        device.remove(path)
    except LayerdiffError:
        pass
