"""Which run is the reference, and which pairs of runs get compared.

A run is only comparable with a reference fed the *same input*; in a sweep over 20 inputs and two
configurations the reference is therefore a configuration (cpu + high, or the one `--ref` names),
and each run is compared with that configuration's run on the same input. Repeated runs of one
configuration are also compared with each other (nondeterminism), independently of the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from analyzer.errors import LayerdiffError
from analyzer.sources import Run


@dataclass
class Pair:
    """One comparison: `other` measured against `base`. kind: `reference` or `repeat`."""

    base: Run
    other: Run
    kind: str = "reference"


@dataclass
class Plan:
    """The reference choice (stated in the report) and every comparison to make."""

    reference: Run
    reason: str
    references: dict[str, Run] = field(default_factory=dict)  # input key -> reference run for it
    pairs: list[Pair] = field(default_factory=list)
    uncompared: dict[str, str] = field(default_factory=dict)  # run label -> why it has no reference


def choose_reference(runs: list[Run], ref_path: Path | str | None) -> tuple[Run, str]:
    """The `--ref` run, else the first cpu + high run, else the first run; with the reason in words."""
    if not runs:
        raise LayerdiffError("no dumps to analyze")
    if ref_path is not None:
        wanted = Path(ref_path).resolve()
        for run in runs:
            if run.path.resolve() == wanted:
                return run, f"--ref {Path(ref_path).name}"
        raise LayerdiffError(
            f"--ref {ref_path}: not among the dumps being analyzed (or not a readable dump); "
            "pass it also as an input, or pick one of the files listed"
        )
    for run in runs:
        if str(run.attrs.get("backend_requested", "")).lower() == "cpu" and run.precision.lower() == "high":
            return run, "automatic: the first run with backend cpu and precision high"
    return runs[0], "automatic: no cpu + high run, so the first run given"


def plan_comparisons(runs: list[Run], ref_path: Path | str | None = None) -> Plan:
    """Reference per input (same configuration as the chosen reference) and the pairs to compare."""
    reference, reason = choose_reference(runs, ref_path)
    plan = Plan(reference=reference, reason=reason)
    plan.references = _references_per_input(runs, reference)
    for run in runs:
        base = plan.references.get(run.input_key)
        if base is None:
            plan.uncompared[run.label] = (
                f"no run of the reference configuration ({reference.config_label}) on input "
                f"{run.attrs.get('input_label') or run.input_key[:12] or '?'}"
            )
        elif base is not run:
            plan.pairs.append(Pair(base=base, other=run, kind="reference"))
    plan.pairs.extend(_repeat_pairs(runs, plan))
    return plan


def _references_per_input(runs: list[Run], reference: Run) -> dict[str, Run]:
    chosen = {reference.input_key: reference}
    for run in runs:
        if run.config == reference.config and run.input_key not in chosen:
            candidates = [r for r in runs if r.config == reference.config and r.input_key == run.input_key]
            chosen[run.input_key] = min(candidates, key=lambda r: r.repeat)
    return chosen


def _repeat_pairs(runs: list[Run], plan: Plan) -> list[Pair]:
    """Repeats of one configuration on one input, each against the lowest repeat (not already paired)."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault((run.config, run.input_key), []).append(run)
    already = {(id(p.base), id(p.other)) for p in plan.pairs}
    pairs = []
    for members in groups.values():
        if len(members) < 2:
            continue
        first = min(members, key=lambda r: r.repeat)
        for run in members:
            if run is not first and (id(first), id(run)) not in already:
                pairs.append(Pair(base=first, other=run, kind="repeat"))
    return pairs
