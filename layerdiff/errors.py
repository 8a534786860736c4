"""The one exception type users see as a one-line message.

Every failure a user can cause or fix (a bad file, a missing device, an unknown backend) is raised as
a `LayerdiffError` whose message names the thing and says what to do. The CLIs catch exactly this
type and print it on one line; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class LayerdiffError(Exception):
    """A problem the user can act on; `str(err)` is the whole one-line message."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class Interrupted(LayerdiffError):
    """The user asked to stop (Ctrl-C); whatever was half-written has been removed."""

    exit_code = 130


class DumpFormatError(LayerdiffError):
    """A file is not a valid layerdiff dump (raw or HDF5), or is of a newer format version."""


def os_error_line(err: OSError) -> str:
    """One line for an OS error that escaped the library: what failed, on which path, and what to do."""
    where = f" ({err.filename})" if err.filename else ""
    hint = {28: "free some space and re-run", 30: "write to another directory with -o",
            13: "check the permissions or write elsewhere"}.get(err.errno or 0, "check the path and re-run")
    return f"{err.strerror or err}{where}; {hint}"
