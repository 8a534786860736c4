"""One analysis from start to finish: open -> plan -> measure -> judge -> findings -> summary.

Measuring (align every pair, every metric of every layer, isolated dumps) knows no threshold and is
stored once per set of dumps; judging (pass / warn / fail, decoded outputs, findings, verdicts) reads
only the measurement and the run headers, so a changed threshold or `--task` re-judges without
reading a tensor.

The CLI, the tests and any script call `analyze_paths`; the report writers only read its result.
Problems that leave part of the work possible (a file that is not a dump, a layer whose shape is
absurd, a run with no layer in common) are collected as one-line messages and the analysis goes on
with the rest; only a situation with nothing to compare raises.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import pandas as pd

from layerdiff.analyzer.formats.fedinputs import fed_ok
from layerdiff.analyzer.measure import resultcache
from layerdiff.analyzer.align.byname import NameRules
from layerdiff.analyzer.measure.comparison import Comparison
from layerdiff.errors import LayerdiffError, NothingToCompareError, UsageError
from layerdiff.progress import Steps
from layerdiff.analyzer.findings.divergence import KIND_ORDER, Finding, all_findings
from layerdiff.analyzer.findings.coverage import pair_verdicts
from layerdiff.analyzer.measure.isolation import Isolation, measure_isolated
from layerdiff.analyzer.findings.isolation import attach_isolated, judge_isolation
from layerdiff.analyzer.findings.layerstatus import judge_layers
from layerdiff.analyzer.outputs.judge import judge_all
from layerdiff.analyzer.outputs.task import parse_task
from layerdiff.analyzer.runs.reference import plan_comparisons
from layerdiff.analyzer.runs.sources import Run, SourceSet, open_runs
from layerdiff.analyzer.findings.summary import run_summary
from layerdiff.analyzer.findings.datasets import Dataset, dataset_findings, dataset_view
from layerdiff.analyzer.findings.repeatops import varying_op_findings
from layerdiff.analyzer.findings.fleet import fleet_findings, fleet_view
from layerdiff.analyzer.measure.repeats import repeat_spread_per_op
from layerdiff.analyzer.findings.verdict import Thresholds
# Also the analyzer's public surface for the collector (`collect fix` measures its trials with the
# report's graph and kernels; tests/test_package_layout.py keeps the collector to formats, importers,
# this module and layerdiff's root):
from layerdiff.analyzer.align.graph import LayerGraph, build_graph, run_graph  # noqa: F401,E402
from layerdiff.analyzer.findings.exactneeds import ExactNeeds, exact_needs  # noqa: E402 (sketch-first collection)

if TYPE_CHECKING:
    from layerdiff.analyzer.measure.compare import MeasureMemo

# the measuring surface (`collect fix`'s kernels, a refining collection's memo), imported when asked for: a
# re-judged analysis measures nothing (module __getattr__, PEP 562)
_MEASURING = {"PairKernel": "layerdiff.analyzer.measure.metrics", "Tolerances": "layerdiff.analyzer.measure.tolerances",
              "MeasureMemo": "layerdiff.analyzer.measure.compare"}


def __getattr__(name: str):
    if name in _MEASURING:
        import importlib

        return getattr(importlib.import_module(_MEASURING[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def needed_exactly(analysis: Analysis) -> ExactNeeds:
    """The layers of sketch-first runs whose tensors must be pulled whole before this analysis is final
    (analyzer/findings/exactneeds.py), per run label, in each run's own layer keys."""
    graphs = {run.label: analysis.comparison.graph(run) for run in analysis.runs}
    return exact_needs(analysis.comparison.table, analysis.findings, analysis.thresholds, graphs)


@dataclass
class Analysis:
    """Everything the report shows; `problems` are the one-line messages for stderr."""

    sources: SourceSet
    comparison: Comparison
    findings: list[Finding]
    summary: pd.DataFrame
    thresholds: Thresholds
    problems: list[str] = field(default_factory=list)
    isolation: Isolation = field(default_factory=Isolation)
    dataset: Dataset = field(default_factory=Dataset)  # one configuration over many inputs (findings/datasets.py)
    repeat_ops: pd.DataFrame = field(default_factory=pd.DataFrame)  # per op across repeats (measure/repeats.py)
    fleet: pd.DataFrame = field(default_factory=pd.DataFrame)  # verdicts per GPU x driver x configuration (findings/fleet.py)

    @property
    def runs(self) -> list[Run]:
        return self.sources.runs

    def close(self) -> None:
        self.isolation.close()
        self.sources.close()


def analyze_paths(paths: Iterable[Path | str], *, ref: Path | str | None = None, rules: NameRules | None = None,
                  thresholds: Thresholds | None = None,
                  steps: Steps | None = None,
                  set_attrs: dict[str, dict] | None = None, ref_input: str | None = None,
                  task: str | None = None, memo: MeasureMemo | None = None) -> Analysis:
    """Analyze every dump under `paths`; raises LayerdiffError only when nothing can be compared.

    `ref` may be any dump, also one not under `paths` (a golden `.npz`, Polygraphy JSON, directory):
    it is opened with the rest. `ref_input` names the input a reference without input hash was
    made from (see `layerdiff.analyzer.runs.reference.plan_comparisons`). `set_attrs` attaches provenance to
    foreign inputs (see `layerdiff.analyzer.runs.sources.open_runs`). `task` declares what the outputs are
    (`--task`, see `layerdiff.analyzer.outputs.task`); without it a task a run's file records is used. `memo`:
    rows an earlier analysis of the same files measured, reused (a refining collection's rounds: MeasureMemo)."""
    rules = rules or NameRules()
    thresholds = thresholds or Thresholds()
    declared = parse_task(task)  # a bad --task is refused before any file is opened
    paths = list(paths)
    if ref is not None and Path(ref).exists():
        paths.append(Path(ref))  # discovery drops it again when it is already among the inputs
    with (steps or Steps.quiet()).step("reading the inputs (foreign formats are converted once)"):
        sources = open_runs(paths, set_attrs)
    try:
        _check_enough_runs(sources, ref)
        plan = plan_comparisons(sources.runs, ref, ref_input)
        if not plan.pairs:
            raise NothingToCompareError("no run can be compared: every run is a reference or has no reference "
                                        f"run on its input ({_uncompared_reasons(plan.uncompared)})")
        comparison = _measured(plan, rules, thresholds, steps or Steps.quiet(), memo)
        isolation = measure_isolated(sources.isolated, sources.runs, comparison, thresholds.tolerances)
    except BaseException:
        sources.close(keep_headers=False)
        raise
    with (steps or Steps.quiet()).step("finding failure sources and verdicts"):
        judge_layers(comparison, thresholds)
        judge_isolation(isolation, comparison, thresholds)
        attach_isolated(comparison.table, isolation)
        judgements = judge_all(comparison, declared, thresholds)
        verdicts = pair_verdicts(comparison, thresholds, judgements)
        findings = merge_findings(all_findings(comparison, sources.runs, thresholds, judgements, verdicts),
                                  isolation.findings)
        summary = run_summary(comparison, sources.runs, findings, thresholds, judgements, verdicts)
        dataset = dataset_view(comparison, summary, findings)
        repeat_ops = repeat_spread_per_op(comparison)
        fleet = fleet_view(sources.runs, summary)
        findings = insert_by_kind(findings, dataset_findings(dataset) + varying_op_findings(repeat_ops)
                                  + fleet_findings(fleet))
    comparison.graphs.clear()  # they served the findings; the report does not need them (Comparison.graph rebuilds)
    problems = sources.problems + comparison.problems + isolation.problems + fed_input_problems(sources.runs)
    problems += [f"{label}: not compared: {why}" for label, why in plan.uncompared.items()]
    return Analysis(sources, comparison, findings, summary, thresholds, problems, isolation, dataset, repeat_ops, fleet)


def _uncompared_reasons(uncompared: dict[str, str]) -> str:
    """Why each run was left out, each reason said once with the runs it holds for ('cpu/low, vulkan/low: no
    run of the reference configuration on input x'; a sweep's runs on one input share one)."""
    if not uncompared:
        return "all runs are references"
    runs_of: dict[str, list[str]] = {}
    for label, why in uncompared.items():
        runs_of.setdefault(why, []).append(label)
    return "; ".join(f"{', '.join(labels)}: {why}" for why, labels in runs_of.items())


def fed_input_problems(runs: list[Run]) -> list[str]:
    """One line per run whose engine received another input than the one given (its `input_fed_check`)."""
    lines = []
    for run in runs:
        check = str(run.attrs.get("input_fed_check", "") or "")
        if not fed_ok(check):
            lines.append(f"{run.label}: {check}")
    return lines


def _measured(plan, rules: NameRules, thresholds: Thresholds,
              steps: Steps, memo: MeasureMemo | None = None) -> Comparison:
    """compare_all, or its stored result when these very dumps were measured with these options
    (a sweep's own report, then `analyze` of the same runs, or of them with other thresholds: measured
    once, see layerdiff.analyzer.measure.resultcache). Only the tolerances enter the key: the thresholds judge."""
    tolerances = thresholds.tolerances
    key = resultcache.cache_key(plan, rules, tolerances)
    comparison = resultcache.load(plan, key)
    if comparison is None:
        from layerdiff.analyzer.measure.compare import compare_all  # the kernels: only when measuring

        comparison = compare_all(plan, rules, tolerances, steps, memo)
        resultcache.store(comparison, key)
    return comparison


def _check_enough_runs(sources: SourceSet, ref: Path | str | None) -> None:
    """Refuse early, in one line, when there is nothing to compare (isolated dumps are not runs)."""
    if ref is not None and any(r.names(ref) for r in sources.isolated):
        raise UsageError(f"--ref {ref}: an isolated dump (collect isolate) cannot be the reference; "
                             "pass the dump it was isolated against")
    if len(sources.runs) < 2:
        found = "no readable dump" if not sources.runs else f"only one readable dump ({sources.runs[0].path})"
        detail = f": {sources.problems[0]}" if sources.problems else ""
        isolated = (f" (the {len(sources.isolated)} isolated dump(s) are shown next to a cumulative run of the "
                    "same setting, which must be among the inputs too)" if sources.isolated else "")
        raise NothingToCompareError(f"{found} among the inputs{detail}; analyze needs at least two runs{isolated}")


def merge_findings(findings: list[Finding], isolation: list[Finding]) -> list[Finding]:
    """Isolation findings go right after the first-divergence ones: they settle what those suspect.

    `findings` is sorted by `KIND_ORDER`, so the cut is after every kind ranked up to first_divergence.
    """
    before = set(KIND_ORDER[:KIND_ORDER.index("first_divergence") + 1])
    cut = sum(1 for f in findings if f.kind in before)
    return findings[:cut] + sorted(isolation, key=_isolation_rank) + findings[cut:]


def insert_by_kind(findings: list[Finding], new: list[Finding]) -> list[Finding]:
    """`new` findings placed by `KIND_ORDER` among `findings` (already in report order), which keep their order."""
    out = list(findings)
    for finding in new:
        rank = KIND_ORDER.index(finding.kind)
        at = next((i for i, f in enumerate(out) if f.kind in KIND_ORDER and KIND_ORDER.index(f.kind) > rank), len(out))
        out.insert(at, finding)
    return out


def _isolation_rank(finding: Finding) -> tuple:
    """Kernels that are off first (fail before warn), then the layers cleared, in execution order."""
    severity = {"fail": 0, "warn": 1}.get(finding.severity, 2)
    position = finding.numbers.get("position")
    return (severity, finding.run, position if isinstance(position, (int, float)) and position == position else 1e9)
