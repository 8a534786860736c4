"""Which estimated layers a sketch-first collection must pull whole before its answer can be trusted.

Estimates from summaries (analyzer/measure/estimate.py) come with a standard deviation; the judge
turns them into statuses with the usual thresholds. What a user acts on must not rest on an estimate
that could fall on the other side of a threshold, nor name a layer from estimates alone. So, reading
only the judged table and the findings (never a tensor), this names:
- the layers the headline findings name (first divergence, failure sources, NaN/Inf origins, saturation,
  zero-collapse origins) and, for failure sources and origins, the layers feeding them;
- borderline layers: an estimate within `SIGMAS` standard deviations of a threshold it is judged by.
The collector pulls those tensors, the analysis runs again, and the loop ends when nothing new is named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from layerdiff.analyzer.findings.finding import Finding, FindingKind
from layerdiff.analyzer.findings.thresholds import Thresholds

SIGMAS = 4.0
NAMED_KINDS = (FindingKind.FIRST_DIVERGENCE, FindingKind.FAILURE_SOURCE, FindingKind.NAN_ORIGIN,
               FindingKind.INF_ORIGIN, FindingKind.SATURATION, FindingKind.ZERO_COLLAPSE_ORIGIN)
SOURCE_KINDS = NAMED_KINDS[1:]  # their inputs are pulled too: the blame compares a layer with what fed it


@dataclass
class ExactNeeds:
    """Per run label, the layer keys (in that run's own names) whose tensors must be pulled, and why."""

    keys: dict[str, set[str]] = field(default_factory=dict)
    why: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, run: str, key: str, reason: str) -> None:
        if key not in self.keys.setdefault(run, set()):
            self.keys[run].add(key)
            self.why[run, key] = reason

    def __bool__(self) -> bool:
        return any(self.keys.values())


def exact_needs(table: pd.DataFrame, findings: list[Finding], thresholds: Thresholds,
                upstream: dict[str, "object"] | None = None) -> ExactNeeds:
    """The layers to pull whole, for both sides of every estimated pair.

    `upstream` maps a reference run label to its layer graph (`LayerGraph.upstream`) for the inputs of
    failure sources; without it only the named layers are asked for."""
    needs = ExactNeeds()
    if table.empty or "estimated" not in table:
        return needs
    estimated = table[table["estimated"].eq(True)]
    if estimated.empty:
        return needs
    named = _named_layers(findings, table, upstream or {})
    for row in estimated.itertuples(index=False):
        reason = named.get((row.run, row.key)) or _borderline(row, thresholds)
        if reason:
            needs.add(row.reference, row.key, reason)
            needs.add(row.run, row.run_key, reason)
    return needs


def _named_layers(findings: list[Finding], table: pd.DataFrame, graphs: dict) -> dict[tuple[str, str], str]:
    """(run, reference key) -> why, for every layer a headline finding names and the inputs of the sources."""
    out: dict[tuple[str, str], str] = {}
    for finding in findings:
        if finding.kind not in NAMED_KINDS or not finding.layer:
            continue
        out.setdefault((finding.run, finding.layer), f"named by the {finding.kind} finding")
        if finding.kind in SOURCE_KINDS:
            rows = table[(table["run"] == finding.run) & (table["key"] == finding.layer)]
            graph = graphs.get(str(rows["reference"].iloc[0])) if not rows.empty else None
            if graph is None:
                continue
            known = set(table.loc[table["run"] == finding.run, "key"])
            for key in graph.upstream(finding.layer, known):
                out.setdefault((finding.run, key), f"feeds {finding.layer}, named by the {finding.kind} finding")
    return out


def _borderline(row, t: Thresholds) -> str:
    """Why an estimate could be judged otherwise: within SIGMAS of a threshold it is compared with."""
    checks = (
        ("rel_l2", "rel_l2_sigma", (t.warn_rel_l2, t.fail_rel_l2)),
        ("pass_fraction", "pass_fraction_sigma", (t.min_pass_fraction,)),
        ("zero_collapse", "zero_collapse_sigma", (t.warn_zero_collapse, t.fail_zero_collapse)),
    )
    for metric, sigma_name, limits in checks:
        value, sigma = _number(getattr(row, metric, math.nan)), _number(getattr(row, sigma_name, math.nan))
        if not (math.isfinite(value) and math.isfinite(sigma)):
            continue
        for limit in limits:
            if abs(value - limit) <= SIGMAS * sigma:
                return f"{metric} {value:.3g} +- {sigma:.2g} is within {SIGMAS:g} sigma of {limit:g}"
    if _number(getattr(row, "n_saturated", 0)) > 0:
        return "values pinned at +-65504 in the sample"
    return ""


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
