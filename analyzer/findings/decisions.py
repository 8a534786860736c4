"""The finding that says what a declared task's decoded outputs show (outputs/judge.py makes the judgement).

Its own module: the per-layer findings (divergence.py) ask where a run breaks; this one answers what
the user of the model gets, in boxes, pixels or classes, and it is the first thing said about a run.
"""
from __future__ import annotations

from layerdiff.analyzer.findings.finding import Finding

MAX_OUTPUTS_NAMED = 3


def output_decision(pair, judgement) -> list[Finding]:
    """What the declared task's decoded outputs say: boxes moved, lost, gained; pixels; classes."""
    if judgement is None or judgement.status == "none":
        return []
    severity = {"pass": "info", "error": "warn"}.get(judgement.status, judgement.status)
    against = f"against {pair.base.label}"
    text = (f"Decoded outputs of {pair.other.label} ({judgement.task}, {against}): {judgement.reason}."
            if judgement.status != "error" else f"Outputs of {pair.other.label}: {judgement.reason}.")
    return [Finding("output_decision", pair.other.label, ", ".join(judgement.outputs[:MAX_OUTPUTS_NAMED]), "", text,
                    severity=severity, numbers={"task": judgement.task, "status": judgement.status, **judgement.numbers})]
