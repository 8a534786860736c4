"""What a run's own harness header declares, read from the HDF5 provenance (never from tensors).

Several stages need the header's facts: alignment (tensors an engine says it cannot show are not
"missing"), the judge (zeros such an engine never wrote), the report. They read it here, once.
"""
from __future__ import annotations

import json

from layerdiff.vocabulary import OBSERVABILITY_WORDS, Observability


def raw_header(run) -> dict:
    """The harness's own header, as the HDF5 provenance keeps it ({} for other sources)."""
    try:
        header = run.dump.provenance.get("raw_header", {})
    except Exception:  # noqa: BLE001 - a foreign dump without provenance declares nothing
        return {}
    return header if isinstance(header, dict) else {}


def raw_footer(run) -> dict:
    """The harness's own footer, as the HDF5 provenance keeps it ({} for other sources or a run cut short)."""
    try:
        footer = run.dump.provenance.get("raw_footer") or {}
    except Exception:  # noqa: BLE001 - a foreign dump without provenance declares nothing
        return {}
    return footer if isinstance(footer, dict) else {}


def observability(run) -> dict:
    """How the run knows its dumped tensors were written (analyzer/FORMATS.md §1 `observability`): the record the
    run itself checked (footer), else the one its header declares, else the engine's declaration the collector
    stored (`observability` attribute); {} when nothing says."""
    for record in (raw_footer(run).get("observability"), raw_header(run).get("observability"), _declared(run)):
        if isinstance(record, dict):
            return record
    return {}


def _declared(run) -> dict | None:
    try:
        text = run.attrs.get("observability")
    except Exception:  # noqa: BLE001 - a source without attributes declares nothing
        return None
    if not isinstance(text, str) or not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def reads_back_indirectly(run) -> bool:
    """Whether the run's intermediates come back through the model's outputs rather than from the op that produced
    them (its record's `indirect`; a dump from before the record existed says so by listing `not_observable` in
    its header)."""
    record = observability(run)
    if "indirect" in record:
        return bool(record.get("indirect"))
    return isinstance(raw_header(run).get("not_observable"), list)


def declared_unobservable(run) -> dict[str, str] | None:
    """key -> why for the tensors the run says it could not observe (never written, fused away, stale, not
    readable: FORMATS.md §1 `not_observable`, in the header, the footer, or, as variable names, the header's
    `options.not_observable`); None when it declares nothing."""
    found: dict[str, str] | None = None
    for entries in (raw_header(run).get("not_observable"), raw_footer(run).get("not_observable")):
        if isinstance(entries, list):
            found = found or {}
            found.update((str(e.get("key")), _why(e)) for e in entries if isinstance(e, dict))
    options = raw_header(run).get("options")
    names = options.get("not_observable") if isinstance(options, dict) else None
    if isinstance(names, list):
        found = found or {}
        found.update((f"{n}:0", OBSERVABILITY_WORDS[Observability.NOT_READABLE]) for n in names if isinstance(n, str))
    return found


def _why(entry: dict) -> str:
    """The sentence for one entry: its own `why`, else the words of its state (an entry from another writer)."""
    why = entry.get("why")
    if isinstance(why, str) and why:
        return why
    try:
        return OBSERVABILITY_WORDS[Observability(str(entry.get("state")))]
    except (ValueError, KeyError):
        return "not observable on this backend"
