"""Every exception layerdiff defines, in one tree, and the exit codes the CLIs give them.

Every failure a user can cause or fix (a bad file, a missing device, an unknown backend) is raised as
a subclass of `LayerdiffError` whose message names the thing and says what to do. The CLIs catch the
root and print it on one line with its `exit_code`; anything else is a bug and keeps its traceback.
The subclasses let a caller (a notebook, a script around `layerdiff.collect`) tell bad input from a
lost device from nothing-to-compare without parsing messages:

    LayerdiffError                 exit 1
    ├── UsageError                 exit 1  an option's value is wrong (checked after parsing)
    ├── InputError                 exit 1  a model, input, preprocessing, name map or results file is unusable
    │   └── ModelFormatError               an engine cannot read the model file (engines' own readers raise it)
    ├── DumpFormatError            exit 1  a file is not a valid layerdiff dump (raw or HDF5)
    │   └── NotLocalError                  an HDF5 object refers to data outside its file
    ├── StorageError               exit 1  the output location cannot take the output
    │   ├── NoSpaceError (OSError)         the file system is full
    │   ├── NotWritableError (OSError)     read-only or no permission
    │   └── OutdirBusyError                another process writes into the output directory
    ├── DeviceError                exit 1  a device cannot be reached or used
    │   ├── TransferLost                   the adb connection ended mid-transfer (internal; becomes a DeviceError line)
    │   ├── SyncFailed                     the device refused an adb sync request (internal, likewise)
    │   └── Arm64RuntimeError              the arm64 emulation runtime cannot be built or used
    ├── NothingToCompareError      exit 1  no run, or no pair of runs, is left to analyze, merge or isolate
    ├── Interrupted                exit 130 Ctrl-C; half-written files were removed
    ├── HarnessError               exit 1  no harness binary can be had (build or prebuilt)
    ├── EngineNotInstalledError    exit 1  a host engine's library is not installed (names the pip extra)
    ├── EngineVersionError         exit 1  `--engine NAME==VERSION`: that version cannot be had or run here
    ├── HarnessExit                exit = the harness contract code (device_scripts/HARNESS_CLI.md)
    └── ConversionError (RuntimeError) exit 1  a sample model conversion failed (samples/)

Exit codes that are not errors of ours: 2 is click's "Usage: ... Error: ..." (unknown option, wrong
type, bad choice), and for `analyze` also "report written but some inputs were unusable"; 3 is
`collect`'s "nothing failed but some requested combination is impossible".
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1  # any LayerdiffError but Interrupted: one line on stderr
EXIT_USAGE = 2  # click's own parse errors; analyze: report written but some inputs/layers unusable
EXIT_SOME_SKIPPED = 3  # collect: nothing failed, but a requested combination is impossible on some device
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class LayerdiffError(Exception):
    """A problem the user can act on; `str(err)` is the whole one-line message."""

    exit_code: int = EXIT_ERROR

    def __init__(self, message: str = "", *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(LayerdiffError):
    """An option's value is wrong (--threads 0, --rename without '=', --metric foo, --ref not an input).

    Exit 1 like every content error: click's own parse errors (unknown option, wrong type) exit 2
    before any layerdiff code runs and never become this class."""


class InputError(LayerdiffError):
    """A file or value the user gave is unusable: model, input array or image, preprocessing, name map."""


class ModelFormatError(InputError):
    """A model file is not of the format its engine reads (a .tflite flatbuffer, a Paddle program, ...)."""


class EngineNotInstalledError(LayerdiffError):
    """A host engine's Python library is missing: the message names the extra (`layerdiff[mnn]`) to install."""


class EngineVersionError(LayerdiffError):
    """`--engine NAME==VERSION` cannot run: no such version on the package index, no wheel for this
    Python, an engine whose releases can be neither installed nor built from source, a release whose source
    the harness does not build against, or a device that release does not run on."""


class DumpFormatError(LayerdiffError):
    """A file is not a valid layerdiff dump (raw or HDF5), or is of a newer format version."""


class NotLocalError(DumpFormatError):
    """An HDF5 object refers to data outside its own file (external storage, link or virtual map)."""


class StorageError(LayerdiffError):
    """Where the output goes cannot take it: full, read-only, not a directory, busy, unusable cache."""


class NoSpaceError(StorageError, OSError):
    """The file system holding the output is full (still an OSError for code that skips failed writes)."""


class NotWritableError(StorageError, OSError):
    """The output is on a read-only file system or not writable by this user (also an OSError)."""


class OutdirBusyError(StorageError):
    """Another process is writing into the output directory."""


class DeviceError(LayerdiffError):
    """A device cannot be reached or used (missing serial, unauthorized, offline, lost mid-run)."""


class TransferLost(DeviceError):
    """The adb connection ended in the middle of a transfer or command (device or server gone).

    Internal to the adb transport, which turns it into a DeviceError naming the device and its state."""


class SyncFailed(DeviceError):
    """The device refused an adb sync request; the message is the device's reason (internal, as above)."""


class Arm64RuntimeError(DeviceError):
    """The arm64 runtime cannot be built or used (no qemu-user, no apt/dpkg, a download failed)."""


class NothingToCompareError(LayerdiffError):
    """Nothing is left to work on: no dumps, fewer than two runs, no run with a reference, nothing to merge."""


class Interrupted(LayerdiffError):
    """The user asked to stop (Ctrl-C); whatever was half-written has been removed."""

    exit_code = EXIT_INTERRUPTED


class HarnessError(LayerdiffError):
    """No harness binary can be had for a device/engine; the message says what to run."""


class HarnessExit(LayerdiffError):
    """Ends a host-engine harness run with a documented exit code (HARNESS_CLI.md) and one stderr line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message, exit_code=code)
        self.code = code


class ConversionError(LayerdiffError, RuntimeError):
    """MNN's converter did not produce a sample model; the message holds its output."""


def os_error_line(err: OSError) -> str:
    """One line for an OS error that escaped the library: what failed, on which path, and what to do."""
    where = f" ({err.filename})" if err.filename else ""
    hint = {28: "free some space and re-run", 30: "write to another directory with -o",
            13: "check the permissions or write elsewhere"}.get(err.errno or 0, "check the path and re-run")
    return f"{err.strerror or err}{where}; {hint}"
