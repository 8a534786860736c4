"""The `collect` and `analyze` console scripts: the commands' `main`, with nothing before it uncovered.

Importing a command's module takes a few hundred milliseconds (typer, rich, numpy, ...) and reads
the `LAYERDIFF_*` limits; a Ctrl-C in that time, or a limit that does not parse, would otherwise end
in a traceback from the import, before the command's own handling exists. Here the import itself is
covered: Ctrl-C is one line and exit 130 at any moment, a `LayerdiffError` one line and its exit
code. SIGTERM and SIGHUP (a closed terminal, `kill`) take Ctrl-C's path, so the sweep records its
in-flight runs and removes half-written files the same way, and exit with 128 + the signal number.
"""
from __future__ import annotations

import importlib
import signal
import sys

from layerdiff.errors import EXIT_INTERRUPTED, LayerdiffError

_STOPPED_BY: list[int] = []  # the signal that asked us to stop (SIGTERM / SIGHUP), if any


# Python's cyclic garbage collector runs after every 700 net allocations of container objects by default.
# A command allocates hundreds of thousands of them while importing its libraries and building tables,
# almost none in cycles, and each pass walks the young objects again (a tenth of a re-judged analysis's
# CPU). Collecting after 20,000 still frees every cycle, only later.
COLLECT_AFTER_ALLOCATIONS = 20_000


def fewer_collections() -> None:
    """Let the garbage collector run less often in a command's own process (never in a program that
    imports layerdiff: only the commands' entry points call this)."""
    import gc

    _, older, oldest = gc.get_threshold()
    gc.set_threshold(COLLECT_AFTER_ALLOCATIONS, older, oldest)


def collect() -> None:
    _run("collect", "layerdiff.collector.cli")


def analyze() -> None:
    _run("analyze", "layerdiff.analyzer.cli.app", skip_teardown=True)


def _stop_like_ctrl_c(signum: int, frame) -> None:
    _STOPPED_BY.append(signum)
    raise KeyboardInterrupt


def _run(tool: str, module: str, skip_teardown: bool = False) -> None:
    fewer_collections()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(signum, _stop_like_ctrl_c)
        except (ValueError, OSError):
            pass  # not the main thread, or a platform without it
    try:
        main = importlib.import_module(module).main
        returned = main(sys.argv[1:])
        code = returned if isinstance(returned, int) else 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if done.code is not None and not isinstance(done.code, int):
            _line(tool, str(done.code))
    except KeyboardInterrupt:
        _line(tool, "interrupted; what was already written is kept")
        code = EXIT_INTERRUPTED
    except LayerdiffError as err:
        _line(tool, str(err))
        code = err.exit_code
    except Exception as err:
        if not _caused_by_ctrl_c(err):
            raise
        _line(tool, "interrupted; what was already written is kept")  # a Ctrl-C Python wrapped (an import's
        code = EXIT_INTERRUPTED  # __set_name__ turns it into a RuntimeError)
    if code == EXIT_INTERRUPTED and _STOPPED_BY:
        code = 128 + _STOPPED_BY[0]
    _exit(code, skip_teardown)


def _caused_by_ctrl_c(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is somewhere in the exception's chain of causes."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def _line(tool: str, text: str) -> None:
    try:
        print(f"{tool}: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError, KeyboardInterrupt):
        pass


def _exit(code: int, skip_teardown: bool = False) -> None:
    """Leave without letting a late Ctrl-C turn the interpreter's own shutdown into a traceback:
    from here on SIGINT ends the process as the shell expects (it was already recorded or done).
    `skip_teardown`: see `exit_without_teardown`."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except (ValueError, OSError):
        pass
    if skip_teardown:
        exit_without_teardown(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError, KeyboardInterrupt):
        pass
    sys.exit(code)


def exit_without_teardown(code: int) -> None:
    """End a finished `analyze` process now: stdout and stderr flushed, then `os._exit`.

    The interpreter's own shutdown frees every object the analysis made (pandas frames, the findings,
    the imported libraries' modules) one by one: about 0.15 s of CPU, a fifth of a re-judged analysis,
    for nothing, because when the command has returned every file it wrote is closed and renamed into
    place and every dump it read is closed; analyze starts no thread or process that outlives it and
    registers no exit handler."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, KeyboardInterrupt):
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover - the console scripts call collect()/analyze()
    {"collect": collect, "analyze": analyze}[sys.argv.pop(1)]()
