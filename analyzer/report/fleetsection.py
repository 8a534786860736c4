"""The report's 'Fleet' section: verdicts per GPU x driver x engine version x configuration.

It shows what findings/fleet.py grouped, only when the runs span two or more GPU/driver identities;
results.json gets the same table under `fleet`, present only then, so other documents stay as they were.
"""
from __future__ import annotations

from layerdiff.analyzer.report.results import records
from layerdiff.analyzer.report.tables import to_html
from layerdiff.safetext import html_text


def fleet_document(analysis) -> dict:
    """results.json's `fleet` (one record per group), only when there is a fleet view."""
    view = getattr(analysis, "fleet", None)
    return {"fleet": records(view)} if view is not None and len(view) else {}


def fleet_html(analysis) -> list[str]:
    """The 'Fleet' section: the grouped table, after the fleet findings' sentences; nothing without groups."""
    view = getattr(analysis, "fleet", None)
    if view is None or not len(view):
        return []
    sentences = [f.sentence for f in analysis.findings if str(f.kind) == "fleet"]
    said = "".join(f"<li>{html_text(s)}</li>" for s in sentences)
    return ["<h2>Fleet</h2>",
            "<p>The runs grouped by the GPU and driver that computed them (driver version and the driver library "
            "the engine's process mapped; a phone's build fingerprint), engine version and backend/precision, "
            "with each group's pass / warn / fail counts.</p>",
            f"<ul>{said}</ul>" if said else "<p>No configuration's verdicts differ between drivers.</p>",
            to_html(view)]
