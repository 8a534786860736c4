"""`collect` as a library: plan a sweep from plain values, prepare the devices, run it.

`collect` (collector/cli.py) parses its command line and calls these; `layerdiff.collect(...)` calls
`collect` below. Everything is checked before any device is touched (one `LayerdiffError` subclass
naming the bad value), as on the command line.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from layerdiff.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_SOME_SKIPPED, EngineVersionError, InputError, StorageError
from layerdiff.collector.engines.versions import (check_release, how_obtained, prepare_release, release_devices,
                                                  source_for, split_engine)
from layerdiff.collector.sweep.prepare import build_phone_harnesses
from layerdiff.collector.inputs.bundled import default_model
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.modelfiles import ENGINES, apply_shapes, input_shapes, parse_shapes, resolve_model
from layerdiff.collector.inputs.preprocess import parse_preprocess
from layerdiff.collector.run.pipeline import check_run_options
from layerdiff.collector.sweep.execute import SweepResult, run_sweep
from layerdiff.collector.sweep.plan import SweepPlan, resolve_devices
from layerdiff.collector.transport.arm64 import prepare_runtime
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.vocabulary import RunStatus


def build_plan(*, devices: list[str], model: Path | None, engine: str, backends: list[str], precisions: list[str],
               inputs: list[str], out: Path, threads: int, repeat: int, deadline: float, layers: str | None,
               max_bytes: int | None, exclude: list[str], adb_servers: list[str], keep: bool, force: bool,
               retry_failed: bool = False, preprocess: str | None = None,
               shapes: list[str] | None = None, configs: list[tuple[str, str]] | None = None,
               fresh_process: bool = False, connect: list[str] | None = None,
               pull: str = "auto") -> tuple[SweepPlan, list[str]]:
    """Everything `collect` needs, checked before any device is touched; plus unusable-input lines."""
    check_run_options(threads, repeat, deadline, layers, max_bytes)
    if out.exists() and not out.is_dir():
        raise StorageError(f"output {out} is a file; pass a directory to -o")
    engine, engine_version = split_engine(engine)
    if engine_version:  # refused before any model is read when the engine has no releases to install
        if engine not in ENGINES:
            raise EngineVersionError(f"--engine {engine}=={engine_version}: name an engine, one of {', '.join(ENGINES)}")
        check_release(ENGINES[engine], engine_version)
    model_files = resolve_model(model or default_model(), engine)
    model_shapes = apply_shapes(input_shapes(model_files), parse_shapes(shapes or []), model_files)
    input_sets, input_errors = resolve_inputs(inputs, model_shapes, parse_preprocess(preprocess),
                                              ENGINES[model_files.engine].prompt_input)
    if not input_sets:
        raise InputError(input_errors[0] if len(input_errors) == 1 else
                         f"none of the {len(input_errors)} inputs is usable; first: {input_errors[0]}")
    if configs:
        backends = list(dict.fromkeys(b for b, _ in configs))
        precisions = list(dict.fromkeys(p for _, p in configs))
    resolved = resolve_devices(devices, adb_servers, exclude, connect)
    if any(type(device) is LocalDevice for device in resolved):  # arm64 runs its own wheels
        ENGINES[model_files.engine].require_installed()  # one line naming the extra, before anything runs
    if engine_version:
        check_version_devices(model_files.engine, engine_version, resolved)
    return SweepPlan(
        devices=resolved, model=model_files, backends=backends,
        precisions=precisions, inputs=input_sets, out_dir=out, threads=threads, repeat=repeat,
        deadline_s=deadline, layers=layers, max_bytes=max_bytes, keep=keep, force=force, retry_failed=retry_failed,
        configs=list(configs or []), fresh_process=fresh_process, engine_version=engine_version, pull=pull,
    ), input_errors


def check_version_devices(engine: str, version: str, devices: list) -> None:
    """`--engine NAME==VERSION` runs on the devices the engine's releases run on (a wheel's: the host only; a
    source build's: the kinds its folder declares), one line else."""
    check_release(ENGINES[engine], version, tuple(_kind(device) for device in devices))
    kinds = release_devices(ENGINES[engine])
    others = [device.serial for device in devices if _kind(device) not in kinds]
    if others:
        where = "the local device only" if kinds == ("local",) else f"{', '.join(kinds)} devices only"
        why = f": {ENGINES[engine].release_refusal}" if ENGINES[engine].release_refusal else ""
        raise EngineVersionError(
            f"--engine {engine}=={version} runs on {where} ({how_obtained(ENGINES[engine], version)}){why}; "
            f"{', '.join(others)} run the installed {engine} only: drop them or the ==VERSION")


def _kind(device) -> str:
    """A device's kind as DeviceInfo names it, without asking a phone: the host, its emulated arm64 core, or adb."""
    if type(device) is LocalDevice:
        return "local"
    return "qemu" if isinstance(device, LocalDevice) else "adb"


def _quiet_step(title: str):
    return contextlib.nullcontext(lambda text, done, total: None)


def prepare(plan: SweepPlan, step_display: Callable = _quiet_step) -> None:
    """Build the phones' harnesses and the arm64 runtime the plan needs, before any run starts."""
    engine = ENGINES[plan.model.engine]
    if not plan.engine_version:
        build_phone_harnesses(plan.devices, plan.model.engine, plan.backends)
    elif all(source_for(engine, _kind(device)) for device in plan.devices):  # the builder's own progress display
        prepare_release(engine, plan.engine_version, plan.devices, kind_of=_kind)
    else:  # pip fills the release's environment once, before the display starts (builds for the others first)
        with step_display(f"{plan.model.engine}=={plan.engine_version} environment") as step:
            prepare_release(engine, plan.engine_version, plan.devices, on_step=lambda text: step(text, 0, 1),
                            kind_of=_kind)
    prepare_runtime(plan.devices, step_display)


@dataclass
class Collected:
    """What a `collect` produced: the plan, the sweep (its runs and index), and the unusable inputs."""

    plan: SweepPlan
    sweep: SweepResult
    input_errors: list[str]

    @property
    def out_dir(self) -> Path:
        return self.plan.out_dir

    @property
    def paths(self) -> list[Path]:
        """Every dump the sweep's output holds for its runs (collected now or before)."""
        return [self.plan.out_dir / name for run in self.sweep.runs for name in run.row.files]

    @property
    def exit_code(self) -> int:
        """What the `collect` command exits with for this outcome (README: exit codes)."""
        if self.sweep.interrupted:
            return EXIT_INTERRUPTED
        if self.sweep.failed or self.input_errors or self.sweep.index.write_error is not None:
            return 1  # a run or an input failed, or index.csv could not be written (the runs are kept)
        skipped = any(run.row.status == RunStatus.SKIPPED for run in self.sweep.runs)
        return EXIT_SOME_SKIPPED if skipped else EXIT_OK


def collect(model: Path | str | None = None, *, devices: Iterable[str] = ("local",), engine: str = "auto",
            backends: Iterable[str] = ("cpu",), precisions: Iterable[str] = ("high",),
            configs: Iterable[tuple[str, str]] = (), inputs: Iterable[str] = (), shapes: Iterable[str] = (),
            preprocess: str | None = None, out: Path | str = "runs", threads: int = 1, repeat: int = 1,
            deadline: float = 900.0, layers: str | None = None, max_bytes: int | None = None,
            exclude: Iterable[str] = (), adb_servers: Iterable[str] = (), keep: bool = False, force: bool = False,
            retry_failed: bool = False, fresh_process: bool = False, task: str | None = None,
            connect: Iterable[str] = (), pull: str = "auto") -> Collected:
    """Run `model` with every layer dumped on each device x backend x precision x input, as `collect`
    does (same files, same index.csv, resumes the same way), without printing progress. `pull`: how phones'
    dumps come over (`auto`: sketch-first past 100 MB, `sketch`, `full`; docs/sketch.md)."""
    plan, input_errors = build_plan(
        devices=list(devices), model=Path(model) if model is not None else None, engine=engine,
        backends=list(backends), precisions=list(precisions), inputs=list(inputs), shapes=list(shapes),
        preprocess=preprocess, out=Path(out), threads=threads, repeat=repeat, deadline=deadline, layers=layers,
        max_bytes=max_bytes, exclude=list(exclude), adb_servers=list(adb_servers), keep=keep, force=force,
        retry_failed=retry_failed, configs=list(configs), fresh_process=fresh_process, connect=list(connect),
        pull=pull)
    if task:  # what the outputs are (analyze --task), recorded in every dump
        plan.extra_attrs["task"] = task
    prepare(plan)
    return Collected(plan, run_sweep(plan), input_errors)
