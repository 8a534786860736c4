"""The one timestamp format of every file layerdiff writes (raw dumps, HDF5 dumps, results).

A module of its own so the raw-dump writer, which runs inside engine children, gets it without
importing h5py (see analyzer/formats/rawdump.py).
"""
from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
