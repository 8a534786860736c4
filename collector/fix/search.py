"""`collect fix`: the smallest set of layers that, kept at high precision, brings the outputs back.

The question users ask after a diagnosis is "what do I change to ship at low precision?". Trying
every subset of n layers costs 2^n runs; this search costs a handful, in three phases:

1. **Follow the findings (greedy).** Run the model at low precision, analyze it against the
   high-precision run, and keep the layer the findings blame first at high precision (by kind,
   then the most upstream, over every input): the Inf
   origin, fp16 saturation, a NaN origin that no Inf explains, the failure source, the zero-collapse
   origin, the reference's fp16 overflow/underflow-risk layers, then the strongest error amplifier
   and the first divergence. Run again and repeat on the new findings: fixing one layer often moves
   the failure one layer down (a value above 65504 kept in fp32 by one layer overflows again in the
   next fp16 layer), and the next analysis names exactly that layer. One trial per step.
2. **Bisection (fallback)** when the findings name nothing new and the outputs are still off: the
   remaining layers are ranked by their error in the last trial; if even all of them together do
   not meet the tolerance the model cannot be fixed this way; otherwise binary search on k finds
   the fewest top-ranked layers that do (log2(n) trials, assuming more layers at high precision
   never hurts, which is what Polygraphy's `debug precision` assumes too).
3. **Prune.** Each chosen layer is dropped once, last added first; it stays out if the outputs still
   meet the tolerance without it. The result is 1-minimal: no single layer can be removed.

Where a kept layer must read fp32 (the mechanism's `closed(backend)`: a feature-mask engine's CPU), every
layer feeding it is kept with it; every phase works on such closed sets and the prune only drops a layer
no other kept layer reads from.

A trial runs every given input; the tolerance (relative L2 of every model output against the
high-precision run on the same input) must hold on all of them. How a trial keeps layers high is the
mechanism the engine's folder names (`layerdiff.collector.fix.mechanisms`): a real patched model
(feature masks) or a what-if.
"""
from __future__ import annotations

import math
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.vocabulary import RunStatus
from layerdiff.analyzer.analysis import analyze_paths, build_graph
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DeviceError, UsageError
from layerdiff.collector.transport.devices import Device
from layerdiff.collector.engines.harness_cli import split_key
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.fix.mechanisms import Mechanism, mechanism_for
from layerdiff.collector.run.outdir_lock import OutdirLock
from layerdiff.collector.fix.trial import Trial, TrialRunner, output_keys
from layerdiff.collector.run.pipeline import RunSpec, collect_run

KIND_PRIORITY = ("inf_origin", "saturation", "nan_origin", "failure_source", "zero_collapse_origin", "fp16_risk",
                 "error_growth", "first_divergence")
NOT_MASKABLE = {"Input", "Output", "Split"}  # model inputs, MNN's output records; ncnn's blob copies (no arithmetic)
MAX_GREEDY = 8
TIMING_REPEATS = 4
TIMING_ROUNDS = 2


@dataclass
class Step:
    phase: str  # before | findings | bisect | prune | verify
    trial: Trial
    added: str = ""


@dataclass
class FixResult:
    status: str  # nothing_to_fix | fixed | unfixable | unverified
    chosen: list[str]
    reasons: dict[str, dict]
    steps: list[Step]
    before: Trial
    after: Trial | None
    maskable: list[str]
    layers_total: int
    runs: int
    seconds: float
    patched: ModelFiles | None = None
    masks: dict[str, int] = field(default_factory=dict)
    speed: dict = field(default_factory=dict)
    references: dict[str, Path] = field(default_factory=dict)


class Search:
    """The three phases above, on one TrialRunner; remembers every trial so none runs twice."""

    def __init__(self, runner: TrialRunner, tolerance: float, maskable: list[str], op_types: dict[str, str],
                 upstream: dict[str, set[str]] | None = None) -> None:
        self.runner, self.tolerance, self.maskable, self.op_types = runner, tolerance, maskable, op_types
        self.closed_reason = runner.mechanism.closed_reason
        self.upstream = upstream  # op -> every op feeding it, when a kept layer needs its producers kept too
        self.steps: list[Step] = []
        self.reasons: dict[str, dict] = {}
        self._seen: dict[frozenset, Trial] = {}

    def trial(self, layers: list[str], phase: str, added: str = "") -> Trial:
        key = frozenset(layers)
        if key not in self._seen:
            self._seen[key] = self.runner.run(tuple(layers))
            self.steps.append(Step(phase, self._seen[key], added))
        return self._seen[key]

    def ok(self, trial: Trial) -> bool:
        return trial.within(self.tolerance)

    def run(self, before: Trial) -> list[str] | None:
        """The chosen layers, or None when even every maskable layer kept high is not enough."""
        self._seen[frozenset()] = before
        chosen: list[str] = []
        current = before
        for _ in range(MAX_GREEDY):
            if self.ok(current):
                return self.prune(chosen)
            nominee = self.next_candidate(current, chosen)
            if nominee is None:
                break
            chosen = self.close(chosen + [nominee], nominee)
            current = self.trial(chosen, "findings", nominee)
        if self.ok(current):
            return self.prune(chosen)
        found = self.bisect(chosen, current)
        return None if found is None else self.prune(found)

    def close(self, ops: list[str], nominee: str = "") -> list[str]:
        """`ops` plus every layer feeding them when kept layers need fp32 inputs; in execution order."""
        closed = set(ops)
        for op in ops if self.upstream is not None else []:
            for feeder in self.upstream.get(op, set()) - closed:
                closed.add(feeder)
                self.reasons.setdefault(feeder, {"kind": "feeds_kept_layer",
                                                 "reason": f"feeds {nominee or op}, {self.closed_reason}"})
        return [op for op in self.maskable if op in closed]

    def next_candidate(self, trial: Trial, chosen: list[str]) -> str | None:
        """The layer the findings of this trial blame first, among those not kept high yet."""
        for kind, op, finding in self.findings(trial):
            if op in self.maskable and op not in chosen:
                self.reasons.setdefault(op, {"kind": kind, "reason": finding})
                return op
        return None

    def findings(self, trial: Trial) -> list[tuple[str, str, str]]:
        """(kind, op, sentence) from analyzing the trial's runs against the references, by priority."""
        refs = [self.runner.references[label] for label in trial.paths]
        if not refs:
            self._ranked_errors = {}
            return []
        analysis = analyze_paths([*refs, *trial.paths.values()], ref=refs[0])
        try:
            found: list[tuple[str, str, str]] = []
            for finding in analysis.findings:
                if finding.kind not in KIND_PRIORITY or _inherited_nan(finding):
                    continue
                keys = finding.numbers.get("layers") if finding.kind == "fp16_risk" else None
                for key in keys or [finding.layer]:
                    if key:
                        found.append((finding.kind, split_key(key)[0], finding.sentence))
            self._ranked_errors = _worst_by_op(analysis.comparison.table)
        finally:
            analysis.close()
        order = {op: i for i, op in enumerate(self.maskable)}
        return sorted(found, key=lambda f: (KIND_PRIORITY.index(f[0]), order.get(f[1], len(order))))

    def bisect(self, chosen: list[str], last: Trial) -> list[str] | None:
        """Fewest of the remaining layers, worst first, that bring the outputs within tolerance."""
        errors = getattr(self, "_ranked_errors", None) or {}
        if not errors and last.paths:
            self.findings(last)
            errors = self._ranked_errors
        rest = sorted((op for op in self.maskable if op not in chosen),
                      key=lambda op: (-errors.get(op, 0.0), self.maskable.index(op)))
        if not self.ok(self.trial(self.close(chosen + rest), "bisect")):
            return None
        low, high = 0, len(rest)  # chosen + rest[:low] fails, chosen + rest[:high] passes
        while high - low > 1:
            mid = (low + high) // 2
            if self.ok(self.trial(self.close(chosen + rest[:mid]), "bisect")):
                high = mid
            else:
                low = mid
        for op in rest[:high]:
            self.reasons.setdefault(op, {"kind": "bisection", "reason": f"ranked by its error in the last trial "
                                         f"(rel L2 {errors.get(op, 0.0):.3g}); needed to meet the tolerance"})
        return self.close(chosen + rest[:high])

    def prune(self, chosen: list[str]) -> list[str]:
        """Drop each layer once (last added first) when the outputs stay within tolerance without it."""
        kept = list(chosen)
        for op in reversed(chosen):
            if len(kept) <= 1:
                break
            without = [k for k in kept if k != op]
            if set(self.close(without)) != set(without):
                continue  # a kept layer reads this one's output and needs it in fp32
            if self.ok(self.trial(without, "prune")):
                kept = without
        return kept


def _inherited_nan(finding) -> bool:
    """A NaN origin fed by an Inf is the Inf's heir; the Inf origin is the layer to fix."""
    return finding.kind == "nan_origin" and bool(finding.numbers.get("inf_inputs"))


def _worst_by_op(table) -> dict[str, float]:
    """Each op's worst relative L2 over the compared runs (infinite for NaN/Inf)."""
    worst: dict[str, float] = {}
    for key, rel in zip(table["key"], table["rel_l2"]):
        op = split_key(key)[0]
        value = math.inf if rel != rel else float(rel)
        worst[op] = max(worst.get(op, 0.0), value)
    return worst


def fix(device: Device, model: ModelFiles, backend: str, precision: str, inputs: list[InputSet], out_dir: Path, *,
        tolerance: float = 1e-2, deadline_s: float = 900.0) -> FixResult:
    """Search the layers to keep high, write the fix (a patched model) or the what-if, verify, time it."""
    if precision == "high":
        raise UsageError("--precision high is already the reference; name the precision to fix (low or normal)")
    if not inputs:
        raise UsageError("collect fix needs at least one input")
    mechanism_for(model.engine)  # an engine without a per-layer switch is refused before any run
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise UsageError(f"--tolerance {tolerance}: give the largest relative L2 error to accept, e.g. 1e-2")
    with OutdirLock(out_dir):
        return _fix(device, model, backend, precision, inputs, Path(out_dir), tolerance, deadline_s)


def _fix(device: Device, model: ModelFiles, backend: str, precision: str, inputs: list[InputSet], out_dir: Path,
         tolerance: float, deadline_s: float) -> FixResult:
    start = time.monotonic()
    work = out_dir / ".fix-work"
    refs = _references(device, model, backend, inputs, out_dir / "reference", deadline_s)
    runner = TrialRunner(device, model, backend, precision, inputs, refs, work, deadline_s, runs=len(inputs))
    closed = runner.mechanism.closed(backend)
    maskable, op_types, total, upstream = _maskable(model, runner.mechanism, refs[inputs[0].label], closed)
    before = runner.run((), out_dir / "before")
    search = Search(runner, tolerance, maskable, op_types, upstream if closed else None)
    search.steps.append(Step("before", before))
    result = FixResult("nothing_to_fix", [], {}, search.steps, before, None, maskable, total, 0, 0.0, references=refs)
    if not before.within(tolerance):
        chosen = search.run(before)
        result.status = "unfixable" if chosen is None or len(chosen) >= len(maskable) else "fixed"
        result.chosen = chosen if chosen is not None else _best(search)
        result.reasons = {op: search.reasons.get(op, {"kind": "bisection", "reason": "needed"}) for op in result.chosen}
        _verify(result, runner, model, out_dir)
        if result.status == "fixed" and not (result.after and result.after.within(tolerance)):
            result.status = "unverified"  # the chosen set passed its trial but not the re-run (nondeterminism?)
    shutil.rmtree(work, ignore_errors=True)
    result.runs, result.seconds = runner.runs, time.monotonic() - start
    return result


def _references(device: Device, model: ModelFiles, backend: str, inputs: list[InputSet], out: Path,
                deadline_s: float) -> dict[str, Path]:
    """The high-precision run of the same backend on every input: what the fix must come back to."""
    refs = {}
    for item in inputs:
        outcome = collect_run(device, RunSpec(model, backend, "high", item, deadline_s=deadline_s), out, force=True)
        if outcome.status != RunStatus.DONE or not outcome.paths:
            raise DeviceError(f"{device.serial}: the {backend}/high reference run failed on input {item.label}: "
                                 f"{outcome.message}")
        refs[item.label] = outcome.paths[0]
    return refs


def _maskable(model: ModelFiles, mechanism: Mechanism, ref: Path, closed: bool) -> tuple[list[str], dict[str, str], int, dict[str, set[str]]]:
    """Ops that can be kept high (execution order), their op types, the model's layer count, and
    each op's upstream ops (model inputs excluded). With `closed`, copies (Split) are kept too."""
    with DumpFile(ref) as dump:
        layers = dump.layers
        graph = build_graph(layers)
    op_types = dict(zip(layers["op"], layers["op_type"]))
    ops = list(dict.fromkeys(layers["op"]))
    excluded = NOT_MASKABLE - {"Split"} if closed else NOT_MASKABLE
    maskable = [op for op in ops if op_types[op] not in excluded]
    feeds: dict[str, set[str]] = {op: set() for op in ops}
    for key in graph.order:
        feeds[split_key(key)[0]] |= {split_key(p)[0] for p in graph.producers.get(key, [])}
    upstream = {op: _ancestors(op, feeds) & set(maskable) for op in maskable}
    total = mechanism.layer_total(model, ops)
    return maskable, op_types, total, upstream


def _ancestors(op: str, feeds: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    stack = list(feeds.get(op, ()))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(feeds.get(current, ()))
    return seen


def _best(search: Search) -> list[str]:
    """When nothing meets the tolerance: the set with the smallest worst output error."""
    trials = [s.trial for s in search.steps]
    best = min(trials, key=lambda t: (t.worst if math.isfinite(t.worst) else math.inf, len(t.layers)))
    return list(best.layers)


def _verify(result: FixResult, runner: TrialRunner, model: ModelFiles, out_dir: Path) -> None:
    """A patching mechanism: write `<model>.fixed.*`, re-run it on every input and time it. A what-if: re-run it."""
    if not runner.mechanism.patches_model:
        result.after = runner.run(tuple(result.chosen), out_dir / "after")
        return
    result.masks = {op: runner.mask() for op in result.chosen}
    result.patched = runner.mechanism.write_fix(model, result.masks, out_dir, f"{model.stem}.fixed")
    result.after = runner.run(tuple(result.chosen), out_dir / "after", model=result.patched)
    result.steps.append(Step("verify", result.after))
    result.speed = _speed(runner, model, result.patched)


def _speed(runner: TrialRunner, original: ModelFiles, patched: ModelFiles) -> dict:
    """Inference time of the original and the patched model on the first input.

    Rounds alternate the two models and the fastest repeat of each counts (the first repeat of a
    run is warm-up and is dropped): on a shared machine the minimum is the least noisy estimate.
    """
    outputs = output_keys(runner.references[runner.inputs[0].label])
    pattern = "^(?:" + "|".join(re.escape(split_key(k)[0]) for k in outputs) + ")$"
    samples: dict[str, list[float]] = {"original_ms": [], "patched_ms": []}
    for round_ in range(TIMING_ROUNDS):
        for name, model in (("original_ms", original), ("patched_ms", patched)):
            spec = RunSpec(model, runner.backend, runner.precision, runner.inputs[0], repeat=TIMING_REPEATS,
                           layers=pattern, deadline_s=runner.deadline_s)
            outcome = collect_run(runner.device, spec, runner.work_dir / "timing" / f"{name}{round_}", force=True)
            runner.runs += 1
            for path in outcome.paths[1:]:
                with DumpFile(path) as dump:
                    samples[name].append(float(dump.attrs.get("infer_ms") or math.nan))
    times = {name: min(values, default=math.nan) for name, values in samples.items()}
    ratio = times["patched_ms"] / times["original_ms"] if times["original_ms"] else math.nan
    return {**times, "slowdown": ratio, "samples": len(samples["original_ms"]), "input": runner.inputs[0].label}
