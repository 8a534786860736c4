"""Which run is the reference, and which pairs of runs get compared.

A run is only comparable with a reference fed the *same input*; in a sweep over 20 inputs and two
configurations the reference is therefore a configuration (cpu + high, or the one `--ref` names),
and each run is compared with that configuration's run on the same input. Repeated runs of one
configuration are also compared with each other (nondeterminism), independently of the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.errors import NothingToCompareError, UsageError
from layerdiff.analyzer.formats.enginefacts import facts_of
from layerdiff.analyzer.runs.sources import Run


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
    """The `--ref` run (its dump or the foreign file it came from), else the first cpu + high run of a
    golden engine (its dump's `engine_facts` says so: a framework the mobile engines are judged against), else
    the first cpu + high run, else the first run; with the reason in words."""
    if not runs:
        raise NothingToCompareError("no dumps to analyze")
    if ref_path is not None:
        for run in runs:
            if run.names(ref_path):
                return run, f"--ref {Path(ref_path).name}"
        raise UsageError(
            f"--ref {ref_path}: not among the dumps being analyzed (or not a readable dump); "
            "pass it also as an input, or pick one of the files listed"
        )
    cpu_high = [run for run in runs if str(run.attrs.get("backend_requested", "")).lower() == "cpu"
                and run.precision.lower() == "high"]
    for run in cpu_high:
        engine = str(run.attrs.get("engine", "")).lower()
        if facts_of(run.attrs).golden:
            return run, f"automatic: the golden ({engine}) run with backend cpu and precision high"
    if cpu_high:
        return cpu_high[0], "automatic: the first run with backend cpu and precision high"
    return runs[0], "automatic: no cpu + high run, so the first run given"


def plan_comparisons(runs: list[Run], ref_path: Path | str | None = None, ref_input: str | None = None) -> Plan:
    """Reference per input (same configuration as the chosen reference) and the pairs to compare.

    `ref_input` names the input (label or sha256 prefix) a reference without input hash was made
    from, e.g. an ONNX Runtime golden `.npz`; without it such a reference stands for the input of
    the other runs when they were all fed one input."""
    reference, reason = choose_reference(runs, ref_path)
    reason += _pair_hashless_reference(reference, runs, ref_input)
    plan = Plan(reference=reference, reason=reason)
    plan.references = _references_per_input(runs, reference)
    for run in runs:
        base = plan.references.get(run.input_key)
        if base is None:
            plan.uncompared[run.label] = (
                f"no run of the reference configuration ({reference.config_label or reference.label}) on input "
                f"{run.input_description}; the reference was fed {reference.input_description}"
                + _hashless_hint(reference, runs))
        elif base is not run:
            plan.pairs.append(Pair(base=base, other=run, kind="reference"))
    plan.pairs.extend(_repeat_pairs(runs, plan))
    return plan


def _pair_hashless_reference(reference: Run, runs: list[Run], ref_input: str | None) -> str:
    """Give a reference that records no input hash the input key of the runs it stands for."""
    if reference.attrs.get("input_sha256") and not ref_input:
        return ""
    others = [r for r in runs if r is not reference]
    if ref_input:
        keys = {r.input_key for r in others if _is_input(r, ref_input)}
        if not keys:
            labels = sorted({r.input_name for r in others})
            raise UsageError(f"--ref-input {ref_input}: no run was fed an input with that label or sha256 "
                                 f"prefix (inputs: {', '.join(labels) or 'none'})")
        if len(keys) > 1:
            raise UsageError(f"--ref-input {ref_input}: names {len(keys)} different inputs; give a longer "
                                 "sha256 prefix")
        reference.input_override = keys.pop()
        return f"; it stands for input {ref_input} (--ref-input)"
    keys = {r.input_key for r in others if r.attrs.get("input_sha256")}
    if len(keys) == 1 and reference.input_key not in {r.input_key for r in others}:
        reference.input_override = keys.pop()
        return "; it records no input hash and the other runs were fed one input, so it stands for that one"
    return ""


def _is_input(run: Run, wanted: str) -> bool:
    sha = str(run.attrs.get("input_sha256") or "")
    return str(run.attrs.get("input_label") or "") == wanted or (len(wanted) >= 6 and sha.startswith(wanted.lower()))


def _hashless_hint(reference: Run, runs: list[Run]) -> str:
    if reference.attrs.get("input_sha256") or reference.input_override:
        return ""
    labels = sorted({str(r.attrs.get("input_label") or "?") for r in runs if r is not reference})
    return (f"; the reference records no input hash, so name the input it was made from with "
            f"--ref-input LABEL (labels: {', '.join(labels)})")


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
