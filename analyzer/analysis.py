"""One analysis from start to finish: open -> plan -> compare -> findings -> summary.

The CLI, the tests and any script call `analyze_paths`; the report writers only read its result.
Problems that leave part of the work possible (a file that is not a dump, a layer whose shape is
absurd, a run with no layer in common) are collected as one-line messages and the analysis goes on
with the rest; only a situation with nothing to compare raises.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from analyzer.align import NameRules
from analyzer.compare import Comparison, compare_all
from analyzer.errors import LayerdiffError
from analyzer.findings import Finding, all_findings
from analyzer.reference import plan_comparisons
from analyzer.sources import Run, SourceSet, open_runs
from analyzer.tables import run_summary
from analyzer.verdict import Thresholds


@dataclass
class Analysis:
    """Everything the report shows; `problems` are the one-line messages for stderr."""

    sources: SourceSet
    comparison: Comparison
    findings: list[Finding]
    summary: pd.DataFrame
    thresholds: Thresholds
    problems: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[Run]:
        return self.sources.runs

    def close(self) -> None:
        self.sources.close()


def analyze_paths(paths: Iterable[Path | str], *, ref: Path | str | None = None, rules: NameRules | None = None,
                  thresholds: Thresholds | None = None,
                  progress: Callable[[int, int], None] | None = None) -> Analysis:
    """Analyze every dump under `paths`; raises LayerdiffError only when nothing can be compared."""
    rules = rules or NameRules()
    thresholds = thresholds or Thresholds()
    sources = open_runs(paths)
    try:
        if len(sources.runs) < 2:
            found = "no readable dump" if not sources.runs else f"only one readable dump ({sources.runs[0].path})"
            detail = f": {sources.problems[0]}" if sources.problems else ""
            raise LayerdiffError(f"{found} among the inputs{detail}; analyze needs at least two runs")
        plan = plan_comparisons(sources.runs, ref)
        if not plan.pairs:
            raise LayerdiffError("no run can be compared: every run is a reference or has no reference "
                                 f"run on its input ({'; '.join(plan.uncompared.values()) or 'all runs are references'})")
        comparison = compare_all(plan, rules, thresholds, progress)
    except BaseException:
        sources.close()
        raise
    findings = all_findings(comparison, sources.runs, thresholds)
    summary = run_summary(comparison, sources.runs, findings)
    problems = sources.problems + comparison.problems
    problems += [f"{label}: not compared: {why}" for label, why in plan.uncompared.items()]
    return Analysis(sources, comparison, findings, summary, thresholds, problems)


def nothing_compared(analysis: Analysis) -> bool:
    """True when no layer of any run could be measured (the report then only lists what is missing)."""
    status = analysis.comparison.table.get("status")
    return status is None or not status.isin(["pass", "warn", "fail"]).any()
