"""`collect bisect`: the layer whose move to the failing configuration breaks the model's outputs,
found by running the model plainly and comparing only its declared outputs.

Why only outputs: a GPU delegate does not hand out intermediate tensors, and asking for them can
change what runs (extra downloads, split command buffers, different kernels). So, as culprit finders
and users' by-hand bisections do, every trial runs a model in
which some layers are moved back to the reference configuration, every run dumps nothing but the
model outputs (`--layers` matching the output layers only), and the verdict is the outputs'
relative L2 error against the reference run.

How a layer is moved is the engine's business, declared by its folder (`Engine.bisect` returns its
BisectRecipe, collector/engines/bisectrecipe.py; an engine without one gives `Engine.bisect_refusal`, one line).

The search, for layers L in execution order (each trial = one plain run per input):
- the failing run (no layer kept) and the run with every movable layer kept bound the search: the
  first must fail and the second pass, or there is nothing to find (one line says which);
- a binary search over the split point i: layers before i run the failing configuration, those
  after it are kept, so the smallest failing i names the culprit L[i-1] in about log2(len(L)) runs.
  Where a kept layer needs its producers kept too (a fp32 layer that must read fp32),
  only prefixes can be kept: the largest failing i names L[i], the last layer the outputs need kept
  (with every layer before it), and the search ends there;
- otherwise the culprit is then kept for good and, if the outputs still fail, the search repeats over
  the layers after it: each further culprit costs about log2 of what remains.
It assumes that moving more layers to the failing configuration never repairs the outputs; a
culprit that needs a partner to break (two layers whose errors cancel) is found as the partner pair.
"""
from __future__ import annotations

import math
import re
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from layerdiff.errors import DeviceError, UsageError
from layerdiff.vocabulary import RunStatus
from layerdiff.collector.transport.devices import Device
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.engines.bisectrecipe import BisectLayer, BisectRecipe
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.fix.trial import Trial, TrialRunner
from layerdiff.collector.run.outdir_lock import OutdirLock
from layerdiff.collector.run.pipeline import RunSpec, collect_run


class InProcessTrials:
    """Trials of a recipe that runs them in the collect process, as Trials."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.output_names = list(runner.output_names)

    @property
    def runs(self) -> int:
        return self.runner.runs

    def run(self, kept: tuple[str, ...]) -> Trial:
        errors, failures = self.runner.run(tuple(kept))
        return Trial(tuple(kept), dict(errors), failures=dict(failures))


def output_layers(layers: list[BisectLayer]) -> list[str]:
    """The layers whose outputs nothing consumes: the model's declared outputs."""
    consumed = {blob for layer in layers for blob in layer.bottoms}
    return [layer.name for layer in layers if layer.tops and not set(layer.tops) <= consumed]


def outputs_only(ops: list[str]) -> str:
    """The `--layers` pattern that dumps these layers and nothing else."""
    return "^(?:" + "|".join(re.escape(op) for op in ops) + ")$"


class PlainTrialRunner(TrialRunner):
    """A fix trial runner whose every run dumps only the model's outputs."""

    layers_pattern: str = ""
    keep_args: Callable[[tuple[str, ...]], list[str]] | None = None
    mode: str = ""  # the recipe's name, recorded in each dump as `fix_mode`

    def _placed_files(self, label: str, layers: tuple[str, ...], tmp: Path) -> dict:
        return {} if self.keep_args is not None else super()._placed_files(label, layers, tmp)

    def _spec(self, layers, inputs, out_dir, model) -> RunSpec:
        if self.keep_args is not None:  # the harness keeps the layers: the model file stays as it is
            return RunSpec(self.model, self.backend, self.precision, inputs, deadline_s=self.deadline_s,
                           layers=self.layers_pattern, extra_args=self.keep_args(tuple(layers)),
                           extra_attrs={"fix_layers": list(layers), "fix_mode": self.mode})
        return replace(super()._spec(layers, inputs, out_dir, model), layers=self.layers_pattern)


@dataclass
class BisectStep:
    moved: list[str]  # layers running the failing configuration in this trial
    kept: list[str]
    trial: Trial


@dataclass
class BisectResult:
    status: str  # found | nothing_fails | not_layerwise
    culprits: list[dict]
    failing: Trial
    all_kept: Trial | None
    movable: list[str]
    outputs: list[str]
    runs: int  # plain runs of the search (references not counted)
    reference_runs: int
    seconds: float
    tolerance: float
    mechanism: BisectRecipe
    steps: list[BisectStep] = field(default_factory=list)
    references: dict[str, Path] = field(default_factory=dict)
    prefix_kept: bool = False  # kept layers need kept producers: the culprit is the end of the kept prefix

    @property
    def runs_per_culprit(self) -> float:
        return self.runs / max(1, len(self.culprits))


class Bisection:
    """The searches of the module docstring on one runner; no set runs twice."""

    def __init__(self, runner: PlainTrialRunner, movable: list[str], tolerance: float, prefix_kept: bool) -> None:
        self.runner, self.movable, self.tolerance, self.prefix_kept = runner, movable, tolerance, prefix_kept
        self.steps: list[BisectStep] = []
        self._seen: dict[frozenset, Trial] = {}

    def trial(self, kept: list[str]) -> Trial:
        key = frozenset(kept)
        if key not in self._seen:
            self._seen[key] = self.runner.run(tuple(op for op in self.movable if op in key))
            moved = [op for op in self.movable if op not in key]
            self.steps.append(BisectStep(moved, [op for op in self.movable if op in key], self._seen[key]))
        return self._seen[key]

    def passes(self, kept: list[str]) -> bool:
        return self.trial(kept).within(self.tolerance)

    def culprits(self) -> list[dict]:
        """Each culprit with the error its move causes, in the order found."""
        found: list[dict] = []
        candidates = list(self.movable)
        if self.prefix_kept:
            # kept layers need kept producers: only prefixes can be tried, so the search names the last
            # layer the outputs need kept, and every layer before it is kept with it
            index = self._split([], candidates)
            return [{"layer": candidates[index], "error_moved": self._error([], candidates, index)}]
        while candidates and not self.passes([f["layer"] for f in found]):
            kept = [f["layer"] for f in found]
            index = self._split(kept, candidates)
            culprit = candidates[index]
            found.append({"layer": culprit, "error_moved": self._error(kept, candidates, index)})
            candidates = candidates[index + 1:]
        return found

    def _split(self, kept: list[str], candidates: list[str]) -> int:
        """The candidate whose move (with those moved before it) first breaks the outputs."""
        n = len(candidates)
        if self.prefix_kept:  # kept = kept + candidates[:i]; i = n passes, i = 0 fails: largest failing i
            low, high = 0, n
            while high - low > 1:
                mid = (low + high) // 2
                if self.passes(kept + candidates[:mid]):
                    high = mid
                else:
                    low = mid
            return low
        low, high = 0, n  # kept = kept + candidates[i:]; i = 0 passes, i = n fails: smallest failing i
        while high - low > 1:
            mid = (low + high) // 2
            if self.passes(kept + candidates[mid:]):
                low = mid
            else:
                high = mid
        return high - 1

    def _error(self, kept: list[str], candidates: list[str], index: int) -> float:
        """The worst output error of the trial in which the culprit's move broke the outputs."""
        moved_set = kept + (candidates[:index] if self.prefix_kept else candidates[index + 1:])
        trial = self._seen.get(frozenset(moved_set))
        return trial.worst if trial is not None else math.nan


def mechanism_for(engine_name: str) -> BisectRecipe:
    """The engine's declared way to keep single layers, or UsageError with its one-line refusal."""
    engine = ENGINES[engine_name]
    if engine.bisect is None:
        raise UsageError(engine.bisect_refusal or f"{engine_name}: no per-layer way to move a layer between "
                                                  "configurations; bisect cannot run")
    return engine.bisect()


def bisectable(model: ModelFiles, backend: str) -> BisectRecipe:
    """The mechanism that moves this model's layers on `backend`, or UsageError with the one line why not."""
    mechanism = mechanism_for(model.engine)
    refusal = mechanism.refusal(model, backend) if mechanism.refusal else ""
    if refusal:
        raise UsageError(refusal)
    return mechanism


def bisect(device: Device, model: ModelFiles, backend: str, precision: str, inputs: list[InputSet], out_dir: Path, *,
           tolerance: float = 1e-2, ref_config: tuple[str, str] | None = None, deadline_s: float = 900.0) -> BisectResult:
    """Find the culprit layer(s) of `backend`/`precision` against the reference (default: `backend`/high)."""
    mechanism = bisectable(model, backend)
    ref_config = ref_config or (backend, "high")
    if tuple(ref_config) == (backend, precision):
        raise UsageError(f"{backend}/{precision} is the reference itself; name the failing precision (-p low) or "
                         "another reference (--ref-config cpu/high)")
    if not inputs:
        raise UsageError("collect bisect needs at least one input")
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise UsageError(f"--tolerance {tolerance}: give the largest relative L2 error to accept, e.g. 1e-2")
    with OutdirLock(out_dir):
        return _bisect(device, model, backend, precision, inputs, Path(out_dir), tolerance,
                       tuple(ref_config), deadline_s, mechanism)


def parse_ref_config(value: str | None, backend: str, backends, precisions) -> tuple[str, str]:
    """`--ref-config cpu/high` -> ("cpu", "high"); None -> the failing backend at high precision."""
    if value is None:
        return backend, "high"
    ref_backend, _, ref_precision = value.partition("/")
    if ref_backend not in backends or ref_precision not in precisions:
        raise UsageError(f"--ref-config {value!r}: give BACKEND/PRECISION, e.g. cpu/high "
                         f"(backends: {', '.join(backends)}; precisions: {', '.join(precisions)})")
    return ref_backend, ref_precision


def _bisect(device: Device, model: ModelFiles, backend: str, precision: str, inputs: list[InputSet], out_dir: Path,
            tolerance: float, ref_config: tuple[str, str], deadline_s: float, mechanism: BisectRecipe) -> BisectResult:
    start = time.monotonic()
    layers = mechanism.layers(model)
    movable = mechanism.movable(layers, backend)
    if mechanism.in_process is not None:
        if device.serial != "local":
            raise UsageError(f"--device {device.serial}: {model.engine} bisects in the collect process; use --device local")
        runner = InProcessTrials(mechanism.in_process(model, (backend, precision), ref_config, inputs))
        outputs, refs = list(runner.output_names), {}
    else:
        outputs = mechanism.outputs(model) if mechanism.outputs else output_layers(layers)
        pattern = outputs_only(outputs)
        refs = _references(device, model, ref_config, inputs, out_dir / "reference", pattern, deadline_s)
        trials_dir = out_dir / "trials"
        shutil.rmtree(trials_dir, ignore_errors=True)
        runner = PlainTrialRunner(device, model, backend, precision, inputs, refs, trials_dir, deadline_s)
        runner.layers_pattern, runner.keep_args, runner.mode = pattern, mechanism.keep_args, mechanism.name
    search = Bisection(runner, movable, tolerance, mechanism.kept_needs_producers(backend))
    prefix_kept = search.prefix_kept
    failing = search.trial([])
    if mechanism.keep_args is not None:  # the harness listed the layers it can keep in the failing run's header
        movable = search.movable = harness_movable(failing)
        search.steps[0].moved = list(movable)
    result = BisectResult("nothing_fails", [], failing, None, movable, outputs, 0, len(inputs), 0.0, tolerance,
                          mechanism, search.steps, refs, prefix_kept)
    if not failing.within(tolerance):
        result.all_kept = search.trial(movable)
        if not result.all_kept.within(tolerance):
            result.status = "not_layerwise"
        else:
            result.status = "found"
            result.culprits = search.culprits()
    result.runs, result.seconds = runner.runs, time.monotonic() - start
    return result


def harness_movable(trial: Trial) -> list[str]:
    """The layers a `--keep` harness could keep, in execution order, from the header of a trial's dump."""
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    for label, path in trial.paths.items():
        with DumpFile(path) as dump:
            header = dump.provenance.get("raw_header")
        options = header.get("options") if isinstance(header, dict) else None
        keep = options.get("keep") if isinstance(options, dict) else None
        movable = keep.get("movable") if isinstance(keep, dict) else None
        if isinstance(movable, list) and all(isinstance(name, str) for name in movable):
            return list(movable)
        raise DeviceError(f"{path}: the harness recorded no options.keep.movable for input {label}; its build "
                          "predates --keep: rebuild it")
    reasons = "; ".join(f"{label}: {why}" for label, why in trial.failures.items()) or "no run finished"
    raise DeviceError(f"the failing configuration's run did not finish, so the layers to move are unknown ({reasons})")


def _references(device: Device, model: ModelFiles, config: tuple[str, str], inputs: list[InputSet], out: Path,
                pattern: str, deadline_s: float) -> dict[str, Path]:
    """The reference configuration's plain run on every input."""
    backend, precision = config
    refs = {}
    for item in inputs:
        spec = RunSpec(model, backend, precision, item, deadline_s=deadline_s, layers=pattern)
        outcome = collect_run(device, spec, out, force=True)
        if outcome.status != RunStatus.DONE or not outcome.paths:
            raise DeviceError(f"{device.serial}: the {backend}/{precision} reference run failed on input {item.label}: "
                              f"{outcome.message}")
        refs[item.label] = outcome.paths[0]
    return refs


def _number(value: float) -> float | str:
    return value if math.isfinite(value) else ("nan" if value != value else "inf")


def bisect_document(result: BisectResult, *, device: str, model: str, backend: str, precision: str,
                    ref_config: tuple[str, str]) -> dict:
    """bisect.json: the verdict, the culprits, every trial (which layers moved, the output errors)."""
    return {
        "status": result.status, "device": device, "model": model, "config": f"{backend}/{precision}",
        "reference": "/".join(ref_config), "tolerance": result.tolerance, "mechanism": result.mechanism.name,
        "mechanism_how": result.mechanism.how,
        **result.mechanism.kept_record(backend),
        **({"kept_argument": result.mechanism.keep_args(tuple(c["layer"] for c in result.culprits))}
           if result.mechanism.keep_args is not None and result.culprits else {}),
        "observed": {"outputs": result.outputs, "layers_filter": outputs_only(result.outputs)},
        "culprits": [{"layer": c["layer"], "error_when_moved": _number(c["error_moved"])} for c in result.culprits],
        "errors": {"failing": {k: _number(v) for k, v in result.failing.errors.items()},
                   "all_kept": ({k: _number(v) for k, v in result.all_kept.errors.items()} if result.all_kept else None)},
        "layers_movable": len(result.movable), "kept_with_producers": result.prefix_kept,
        "runs": result.runs, "reference_runs": result.reference_runs, "seconds": round(result.seconds, 2),
        "trials": [{"moved": len(s.moved), "kept": s.kept, "worst_error": _number(s.trial.worst),
                    "failures": s.trial.failures} for s in result.steps],
    }


def summary_lines(doc: dict) -> list[str]:
    """What the terminal shows: the verdict in one line, then the culprits and the run count."""
    config, ref, tol = doc["config"], doc["reference"], doc["tolerance"]
    worst = max((_as_float(v) for v in doc["errors"]["failing"].values()), default=0.0)
    if doc["status"] == "nothing_fails":
        return [f"bisect: nothing fails: {config} outputs are within {tol:g} of {ref} (worst rel L2 {worst:.3g}); "
                f"{doc['runs']} plain run(s)"]
    if doc["status"] == "not_layerwise":
        kept = max((_as_float(v) for v in doc["errors"]["all_kept"].values()), default=0.0)
        return [f"bisect: no culprit layer: even with all {doc['layers_movable']} layers kept, {config} outputs are "
                f"{kept:.3g} from {ref} (tolerance {tol:g}); the difference is not one of layers moving"]
    lines = [f"bisect: {config} outputs are {worst:.3g} from {ref}; culprit(s) in execution order:"]
    for item in doc["culprits"]:
        error = _as_float(item["error_when_moved"])
        if doc.get("kept_with_producers"):
            lines.append(f"  {item['layer']}: the outputs need it and every layer before it kept (a kept layer needs "
                         f"kept producers on this backend); keeping one layer less gives rel L2 {error:.3g}")
        else:
            lines.append(f"  {item['layer']}: moving it to {config} breaks the outputs (rel L2 {error:.3g})")
    trials = len(doc["trials"])
    per = trials / max(1, len(doc["culprits"]))
    inputs = f" x {doc['reference_runs']} inputs" if doc["reference_runs"] > 1 else ""
    lines.append(f"bisect: {doc['runs']} plain run(s) ({trials} trials{inputs}) for {doc['layers_movable']} layers "
                 f"({per:.1f} trials per culprit, log2({doc['layers_movable']}) = "
                 f"{math.log2(max(1, doc['layers_movable'])):.1f}), + {doc['reference_runs']} reference; "
                 "only the outputs were observed")
    return lines


def _as_float(value) -> float:
    return float(value)  # bisect.json writes inf/nan as strings; float() reads both
