"""Running a planned sweep: one worker per device, all devices at once, the index always current.

A phone runs one job at a time, so each device gets one thread that works through its own runs; the
devices run in parallel. A device that disappears has its remaining runs marked failed while the
others carry on. Ctrl-C stops every worker, kills local harness processes, and leaves the index
saying exactly what is done (final files only ever appear complete: see layerdiff.analyzer.formats.dumpfile).
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from layerdiff.vocabulary import RunStatus
from layerdiff.analyzer.formats.diskspace import NO_SPACE, NoSpaceError
from layerdiff.analyzer.formats.dumpfile import partial_path
from layerdiff.errors import LayerdiffError, StorageError, os_error_line
from layerdiff.collector.harness.children import terminate_children
from layerdiff.collector.transport.devices import Device, DeviceError
from layerdiff.collector.sweep.index import Index, read_index
from layerdiff.collector.run.outdir_lock import OutdirLock, remove_leftovers
from layerdiff.collector.sweep.plan import PlannedRun, SweepPlan, plan_runs, relative_name
from layerdiff.collector.run.pipeline import RunOutcome, collect_run
from layerdiff.collector.run.each import Listener, collect_each, runs_in_one_process, same_configuration
from layerdiff.collector.transport.scratch import remove_stale_scratch


class SweepObserver(Protocol):
    """What a progress display hears from a sweep (called from worker threads)."""

    def started(self, run: PlannedRun) -> None: ...

    def layer(self, run: PlannedRun, k: int, n: int, op: str) -> None: ...

    def finished(self, run: PlannedRun) -> None: ...


@dataclass
class SweepResult:
    runs: list[PlannedRun]
    index: Index
    interrupted: bool = False
    failed: list[PlannedRun] = field(default_factory=list)
    sketched: object = None  # sketchpull.SketchedRuns: what the sketch-first runs pulled (None: none ran)


class _Worker(threading.Thread):
    """Works through one device's runs in order; stops between runs when asked."""

    def __init__(self, device: Device, runs: list[PlannedRun], index: Index, plan: SweepPlan,
                 stop: threading.Event, observer: SweepObserver | None, halt: threading.Event | None = None) -> None:
        super().__init__(name=f"sweep-{device.serial}", daemon=True)
        self.device, self.runs, self.index, self.plan = device, runs, index, plan
        self.stop, self.observer = stop, observer
        self.halt = halt or threading.Event()  # set when the output disk is full: no worker starts another run
        self.current: PlannedRun | None = None
        # Set when run() returns. The sweep waits on this, never on Thread.join: a Ctrl-C that interrupts
        # join() marks a still-running thread as stopped (CPython's bpo-45274 handling in
        # _wait_for_tstate_lock), and the interrupt handler then removed the .partial file a worker was
        # about to rename (a FileNotFoundError traceback from the thread, about 1 in 40 interrupts).
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self._run_all()
        except BaseException as err:  # noqa: BLE001 - a worker must never die leaving rows `running`
            self._abandon(err)
        finally:
            self.done.set()

    def _abandon(self, err: BaseException) -> None:
        """Something escaped a run's own handling (a bug, or an observer that failed): the run in
        flight and every run after it fail with one line, so no row stays `running`."""
        reason = internal_failure(err, self.plan.out_dir)
        for run in self.runs:
            if run.row.status in (RunStatus.PLANNED, RunStatus.RUNNING) and not self.stop.is_set():
                self.index.update(run.row, status=RunStatus.FAILED, reason=reason)
                remove_partials(run)
                try:
                    if self.observer:
                        self.observer.finished(run)  # its one line, unless the display itself is what failed
                except Exception:  # noqa: BLE001 - the index already says it
                    pass

    def finished(self) -> bool:
        return self.done.is_set()

    def _run_all(self) -> None:
        position = 0
        while position < len(self.runs):
            if self.stop.is_set() or self.halt.is_set():
                return
            group = self._one_process_group(position)
            if len(group) > 1:
                self._each(group)
                position += len(group)
                continue
            run = self.runs[position]
            self.current = run
            self.index.update(run.row, status=RunStatus.RUNNING, reason="")
            if self.observer:
                self.observer.started(run)
            lost = self._one(run)
            self.current = None
            if self.observer:
                self.observer.finished(run)
            if lost:
                for rest in self.runs[position + 1 :]:
                    self.index.update(rest.row, status=RunStatus.FAILED, reason=f"device lost earlier in the sweep: {lost}")
                    if self.observer:
                        self.observer.finished(rest)
                return
            position += 1

    def _one_process_group(self, position: int) -> list[PlannedRun]:
        """The runs from `position` on that one engine process serves: one configuration, consecutive inputs."""
        first = self.runs[position]
        group = [first]
        for run in self.runs[position + 1:]:
            if run.out_dir != first.out_dir or not same_configuration(first.spec, run.spec):
                break
            group.append(run)
        # asked only of a group: on a phone the answer costs a round trip to its harness
        return group if len(group) > 1 and runs_in_one_process(self.device, first.spec) else [first]

    def _each(self, group: list[PlannedRun]) -> None:
        """One configuration's inputs in one engine process (collector/run/each.py): each input's row is
        running, then done or failed, as the engine reaches it; what no outcome reached fails with the reason."""
        by_spec = {id(run.spec): run for run in group}
        started = time.monotonic()

        def began(spec) -> None:
            run = by_spec[id(spec)]
            self.current = run
            self.index.update_soon(run.row, status=RunStatus.RUNNING, reason="")
            if self.observer:
                self.observer.started(run)

        def ended(outcome: RunOutcome) -> None:
            run = by_spec[id(outcome.spec)]
            if outcome.status == RunStatus.FAILED:
                remove_partials(run)
                if outcome.message.startswith(NO_SPACE):
                    self.halt.set()
            run.paths = outcome.paths
            self.index.update_soon(run.row, status=outcome.status, reason=outcome.message,
                                   duration_s=outcome.duration_s,
                                   files=[relative_name(p, self.plan.out_dir) for p in outcome.paths])
            self.current = None
            if self.observer:
                self.observer.finished(run)

        layer = (lambda k, n, op: self.observer.layer(self.current, k, n, op) if self.current else None) \
            if self.observer else None
        try:
            listener = Listener(began, ended, layer, unexpected=lambda err: internal_failure(err, self.plan.out_dir))
            collect_each(self.device, [run.spec for run in group], group[0].out_dir, listener, cancel=self.stop)
        except NoSpaceError as err:
            self.halt.set()
            self._fail_rest(group, f"{NO_SPACE}: {err}", started)
        except LayerdiffError as err:
            self._fail_rest(group, str(err), started)
        except OSError as err:
            self._fail_rest(group, os_error_line(err), started)
        except Exception as err:  # noqa: BLE001 - any other failure is these runs', never the sweep's end
            self._fail_rest(group, internal_failure(err, self.plan.out_dir), started)
        finally:
            self.index.save()  # every row as it stands, whatever update_soon left unwritten

    def _fail_rest(self, group: list[PlannedRun], reason: str, started: float) -> None:
        if self.stop.is_set():
            return  # the interrupt handler owns the rows now
        for run in group:
            if run.row.status in (RunStatus.PLANNED, RunStatus.RUNNING):
                remove_partials(run)
                self.index.update(run.row, status=RunStatus.FAILED, reason=reason,
                                  duration_s=time.monotonic() - started)
                if self.observer:
                    self.observer.finished(run)
        self.current = None

    def _one(self, run: PlannedRun) -> str:
        """Run one configuration; returns a reason when the device itself is gone.

        A device-lab endpoint that dropped is reconnected (bounded tries within a deadline) and the
        run tried once more before it counts as failed and the device as lost."""
        lost = self._attempt(run)
        if not lost or self.stop.is_set() or not getattr(self.device, "endpoint", False):
            return lost
        if _reconnected(self.device):
            self.index.update(run.row, status=RunStatus.RUNNING, reason="")
            return self._attempt(run)
        from layerdiff.collector.transport import endpoints  # only phones reach here: adb loads with them

        gave_up = f"{self.device.serial} did not come back within {endpoints.RECONNECT_DEADLINE_S:g} s of reconnecting"
        self.index.update(run.row, reason=f"{run.row.reason}; {gave_up}")
        return f"{lost}; {gave_up}"

    def _attempt(self, run: PlannedRun) -> str:
        """One try at a configuration; returns a reason when the device itself is gone."""
        start = time.monotonic()
        sink = (lambda k, n, op: self.observer.layer(run, k, n, op)) if self.observer else None
        try:
            outcome = collect_run(self.device, run.spec, run.out_dir, force=True, on_progress=sink, cancel=self.stop)
        except NoSpaceError as err:
            self.halt.set()  # later runs would fail the same way; they stay planned for the resume
            outcome = RunOutcome(run.spec, self.device.serial, "failed", [], f"{NO_SPACE}: {err}")
        except LayerdiffError as err:
            outcome = RunOutcome(run.spec, self.device.serial, "failed", [], str(err))
        except OSError as err:  # a path under OUTDIR the run could not write (a directory in its way, permissions)
            outcome = RunOutcome(run.spec, self.device.serial, "failed", [], os_error_line(err))
        except Exception as err:  # noqa: BLE001 - any other failure is this run's, never the sweep's end
            outcome = RunOutcome(run.spec, self.device.serial, "failed", [], internal_failure(err, self.plan.out_dir))
        if self.stop.is_set():
            return ""  # the interrupt handler owns this run's row now
        if outcome.status == RunStatus.FAILED:
            remove_partials(run)
        run.paths = outcome.paths
        self.index.update(run.row, status=outcome.status, reason=outcome.message,
                          duration_s=time.monotonic() - start,
                          files=[relative_name(p, self.plan.out_dir) for p in outcome.paths])
        if outcome.status == RunStatus.FAILED and not device_alive(self.device):
            return outcome.message or "the device stopped answering"
        return ""


ERROR_LOG = "collect-errors.log"


def internal_failure(err: BaseException, out_dir: Path | str) -> str:
    """One line for an unexpected failure; its traceback goes to OUTDIR/collect-errors.log (appended),
    where a bug report can take it from, instead of tearing through the progress display."""
    line = f"{type(err).__name__}: {err}".strip().splitlines()[0] if str(err).strip() else type(err).__name__
    log = os.path.join(str(out_dir), ERROR_LOG)
    try:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
            fh.write("".join(traceback.format_exception(type(err), err, err.__traceback__)))
        return f"unexpected error {line} (traceback in {log})"
    except OSError:
        return f"unexpected error {line}"


def remove_partials(run: PlannedRun) -> None:
    """A failed run leaves no half-written file: its finished files, if any, are what it wrote."""
    for name in run.spec.output_names():
        try:
            partial_path(run.out_dir / name).unlink(missing_ok=True)
        except OSError:
            pass


def _reconnected(device: Device) -> bool:
    """True when a dropped endpoint is back (layerdiff.collector.transport.endpoints)."""
    try:
        return bool(device.reconnect())
    except (DeviceError, OSError):
        return False


def device_alive(device: Device) -> bool:
    """A cheap round trip: a device that cannot report free space is gone for this sweep."""
    try:
        device.free_bytes(getattr(device, "root", None) or tempfile.gettempdir())
        return True
    except (DeviceError, OSError):
        return False


def run_sweep(plan: SweepPlan, observer: SweepObserver | None = None,
              on_planned: Callable[[list[PlannedRun]], None] | None = None) -> SweepResult:
    """Plan, then run every device's runs concurrently; Ctrl-C leaves a consistent index.

    The output directory is locked for the whole sweep: a second collect into it fails at once."""
    if plan.out_dir.exists() and not plan.out_dir.is_dir():
        raise StorageError(f"output {plan.out_dir} is a file; pass a directory to -o")
    with OutdirLock(plan.out_dir):
        return _run_locked(plan, observer, on_planned)


def _run_locked(plan: SweepPlan, observer: SweepObserver | None,
                on_planned: Callable[[list[PlannedRun]], None] | None) -> SweepResult:
    remove_stale_scratch()  # what killed collects left in the temp folder (their owners are gone)
    for root in {d.scratch_root() for d in plan.devices if hasattr(d, "scratch_root")}:
        remove_stale_scratch(root)
    previous = read_index(plan.out_dir)
    runs = plan_runs(plan, previous)
    for run in runs:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        remove_leftovers(run.out_dir)  # under the lock, anything half-written is an earlier run's
    planned_keys = {run.row.key for run in runs}
    others = [row for key, row in previous.items() if key not in planned_keys]  # e.g. a phone not attached today
    index = Index(plan.out_dir, [run.row for run in runs] + others)
    if on_planned:
        on_planned(runs)
    stop, halt = threading.Event(), threading.Event()
    workers = [
        _Worker(device, [r for r in runs if r.device is device and r.todo], index, plan, stop, observer, halt)
        for device in plan.devices
    ]
    for worker in workers:
        worker.start()
    interrupted = False
    try:
        while not all(w.finished() for w in workers):
            for worker in workers:
                worker.done.wait(timeout=0.2)
    except KeyboardInterrupt:
        interrupted = True
        _interrupt(workers, index, stop)
    failed = [r for r in runs if r.row.status == RunStatus.FAILED]
    result = SweepResult(runs, index, interrupted, failed)
    if not interrupted:
        try:
            result.sketched = _refine_sketched(plan, runs)
        except KeyboardInterrupt:  # files stay as a stop before refinement leaves them: a re-run goes on
            result.interrupted = True
    if result.interrupted:
        result.sketched = _waiting_sketches(runs)
    return result


def _waiting_sketches(runs: list[PlannedRun]):
    from layerdiff.collector.run.sketchpull import waiting_sketches

    return waiting_sketches(sorted({run.out_dir for run in runs}))


def _refine_sketched(plan: SweepPlan, runs: list[PlannedRun]):
    """Pull what the analysis needs of the sweep's sketch-first runs (collector/run/sketchpull.py), with
    every run of the sweep as their possible references; nothing to do when every dump came whole."""
    from layerdiff.collector.run.sketchpull import SKETCH_DIR, SketchedRuns, refine_sketched

    out_dirs = sorted({run.out_dir for run in runs})
    if not any((d / SKETCH_DIR).is_dir() for d in out_dirs):
        return SketchedRuns()
    others = [run.out_dir / name for run in runs for name in run.row.files if (run.out_dir / name).is_file()]
    return refine_sketched(out_dirs, {d.serial: d for d in plan.devices}, others, plan.keep)


STOP_WAIT_S = 5.0


def _interrupt(workers: list[_Worker], index: Index, stop: threading.Event) -> None:
    """Stop everything, record in-flight runs as interrupted, and remove half-written files. A run in flight
    when the Ctrl-C came that finished while the workers stopped keeps its `done`: its files are whole.

    Workers stop between tensors of a conversion (never inside HDF5) and their child process groups
    are killed. A worker still blocked after STOP_WAIT_S (e.g. in a network read) would keep the
    interpreter from exiting cleanly, so then the process ends here with 130, everything recorded."""
    stop.set()
    in_flight = [w.current for w in workers if w.current is not None]
    terminate_children()
    deadline = time.monotonic() + STOP_WAIT_S
    for worker in workers:
        worker.done.wait(timeout=max(0.0, deadline - time.monotonic()))
    for run in in_flight:
        if run.row.status == RunStatus.DONE:  # its files were whole and recorded while the workers stopped
            continue
        index.update(run.row, status=RunStatus.INTERRUPTED, reason="stopped by Ctrl-C; re-run the command to resume")
        remove_partials(run)
        remove_leftovers(run.out_dir)
    index.save()
    if not all(worker.finished() for worker in workers):
        sys.stderr.write("collect: interrupted; runs already written are kept\n")
        sys.stderr.flush()
        os._exit(130)
