"""What a run's own harness header declares, read from the HDF5 provenance (never from tensors).

Several stages need the header's facts: alignment (tensors an engine says it cannot show are not
"missing"), the judge (zeros such an engine never wrote), the report. They read it here, once.
"""
from __future__ import annotations


def raw_header(run) -> dict:
    """The harness's own header, as the HDF5 provenance keeps it ({} for other sources)."""
    try:
        header = run.dump.provenance.get("raw_header", {})
    except Exception:  # noqa: BLE001 - a foreign dump without provenance declares nothing
        return {}
    return header if isinstance(header, dict) else {}


def declared_unobservable(run) -> dict[str, str] | None:
    """key -> why for the tensors the run's engine says it cannot show; None when it declares nothing."""
    entries = raw_header(run).get("not_observable")
    if not isinstance(entries, list):
        return None
    return {str(e.get("key")): str(e.get("why", "not observable on this backend")) for e in entries if isinstance(e, dict)}
