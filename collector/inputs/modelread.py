"""Reading a model file's declared inputs in a child process with memory and time limits.

A model file is untrusted: the engines' own readers (pymnn's interpreter, protobuf, flatbuffers) are
native code that can crash, allocate what a damaged header declares, or spin on it. A crash inside
`collect` itself would end it with no message (a segfault) and lose nothing but the user's trust; in
a child it is one line naming the file. The child is forked (2 ms) when this process runs one thread,
and started as `python -m` otherwise (forking a threaded process can deadlock the child).

Limits (docs/limits-and-faults.md): address space LAYERDIFF_MODEL_READ_MEMORY (default: the larger of 4 GiB
and half of RAM), time LAYERDIFF_MODEL_READ_SECONDS (default 120 s).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from layerdiff import errors
from layerdiff.errors import InputError, ModelFormatError
from layerdiff.analyzer.formats.limits import human_bytes
from layerdiff.collector.engines.base import InputSpecs
from layerdiff.collector.engines.readlimits import read_memory_limit, read_seconds_limit

MAX_ANSWER_BYTES = 64 << 20  # a model declaring inputs enough to fill this is not a model


def read_specs_isolated(engine: str, path: Path) -> InputSpecs:
    """`ENGINES[engine].input_specs(path)` run in a limited child; its failures as typed one-liners.

    A file read before (same engine, path, size, mtime, inode, ctime) is answered from the cache
    without a child: the fork costs 5-30 ms on a busy machine, every collect reads its model, and a
    sweep re-run reads the same one."""
    key = _cache_key(engine, path)
    kept = _cached(key)
    if kept is not None:
        return kept
    memory, seconds = read_memory_limit(), read_seconds_limit()
    if threading.active_count() == 1 and hasattr(os, "fork"):
        status, payload = _forked(lambda: _answer(engine, path, memory, seconds), seconds)
    else:
        status, payload = _spawned(engine, path, memory, seconds)
    specs = _specs_from(status, payload, engine, path, memory, seconds)
    _keep(key, specs)
    return specs


CACHE_FOLDER = "model-inputs"
MAX_CACHED = 256


def _cache_key(engine: str, path: Path) -> str | None:
    import hashlib

    from layerdiff.identity import file_stat

    try:
        stat = file_stat(path)
    except OSError:
        return None
    text = json.dumps([engine, str(Path(path).resolve()), stat])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cache_dir() -> Path:
    from layerdiff.cache import user_cache_root

    return user_cache_root() / CACHE_FOLDER


def _cached(key: str | None) -> InputSpecs | None:
    """The kept answer for `key`, or None (absent, unreadable or not of the shape _keep writes)."""
    if key is None:
        return None
    try:
        doc = json.loads((_cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
        return {str(name): (tuple(int(d) for d in shape) if shape is not None else None, str(dtype))
                for name, shape, dtype in doc["specs"]}
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None


def _keep(key: str | None, specs: InputSpecs) -> None:
    """Write the answer for the next collect (atomically); a cache that cannot be written is skipped."""
    if key is None:
        return
    folder = _cache_dir()
    doc = {"specs": [[name, list(shape) if shape is not None else None, dtype] for name, (shape, dtype) in specs.items()]}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{key}.{os.getpid()}.partial"
        partial.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(partial, folder / f"{key}.json")
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
        for stale in entries[:-MAX_CACHED]:
            stale.unlink(missing_ok=True)
    except OSError:
        pass


def _answer(engine: str, path: Path, memory: int, seconds: float) -> bytes:
    """The child's work: limits on, read, and the answer (or the typed error) as JSON."""
    _limit_self(memory, seconds)
    from layerdiff.collector.engines import ENGINES

    try:
        specs = ENGINES[engine].input_specs(path)
        doc = {"specs": [[name, list(shape) if shape is not None else None, str(dtype)]
                         for name, (shape, dtype) in specs.items()]}
    except errors.LayerdiffError as err:
        doc = {"error": type(err).__name__, "message": str(err)}
    except MemoryError:
        doc = {"error": "MemoryError", "message": ""}
    except ImportError as err:  # the engine's library itself: missing, or its mapping over the memory limit
        doc = {"error": "ImportError", "message": str(err)[:300]}
    except RecursionError:
        doc = {"error": "RecursionError", "message": ""}
    except Exception as err:  # noqa: BLE001 - any failure of an engine's reader on a hostile file
        doc = {"error": "Exception", "message": f"{type(err).__name__}: {err}"[:500]}
    return json.dumps(doc).encode()


def _limit_self(memory: int, seconds: float) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(seconds) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def _forked(work: Callable[[], bytes], seconds: float) -> tuple[int, bytes]:
    """Run `work` in a forked child; (wait status, what it wrote). Never returns in the child."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's clean-up may run here
        code = 0
        try:
            os.close(read_fd)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)  # engines print banners; the parent's stdout is for progress and --json
            os.dup2(devnull, 2)
            data = work()
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
            os.close(write_fd)  # the parent reads the end of the answer now, not after this process is torn down
        except BaseException:  # noqa: BLE001 - the parent reads a missing answer as a failed read
            code = 1
        os._exit(code)
    os.close(write_fd)
    _reap_finished()
    try:
        payload = _read_until(read_fd, time.monotonic() + seconds, pid)
        status = _status_when_answered(pid, payload)
    except BaseException:
        _kill_and_reap(pid)
        raise
    finally:
        os.close(read_fd)
    return status, payload


_UNREAPED: list[int] = []  # children that answered and were still exiting: reaped on a later call


def _status_when_answered(pid: int, payload: bytes) -> int:
    """The child's wait status; a child that wrote a whole answer is not waited for (its exit, the
    unmapping of a copy of this process, took up to 20 ms): 0, and it is reaped later."""
    if payload.endswith(b"}"):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        _UNREAPED.append(pid)
        return 0
    return os.waitpid(pid, 0)[1]


def _reap_finished() -> None:
    for pid in list(_UNREAPED):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _UNREAPED.remove(pid)


def _read_until(fd: int, deadline: float, pid: int) -> bytes:
    """What the child writes until it closes the pipe; past the deadline it is killed (SIGKILL)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            return b"".join(chunks)
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > MAX_ANSWER_BYTES:
            os.kill(pid, signal.SIGKILL)
            return b""
        chunks.append(chunk)


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _spawned(engine: str, path: Path, memory: int, seconds: float) -> tuple[int, bytes]:
    """The same child as `python -m` (for a process running threads); its status as os.waitpid gives it."""
    cmd = [sys.executable, "-m", "layerdiff.collector.inputs.modelread", engine, str(path), str(memory), repr(seconds)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        payload = _read_until(proc.stdout.fileno(), started + seconds, proc.pid)
        proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
    code = proc.returncode
    return (-code if code < 0 else code << 8), payload


def _specs_from(status: int, payload: bytes, engine: str, path: Path, memory: int, seconds: float) -> InputSpecs:
    """The child's answer, or the one line that says why there is none."""
    try:
        doc = json.loads(payload) if payload else None
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("specs"), list):
        return {name: (tuple(shape) if shape is not None else None, dtype) for name, shape, dtype in doc["specs"]}
    if isinstance(doc, dict) and doc.get("error"):
        raise _typed_error(doc, engine, path, memory)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGKILL, signal.SIGXCPU) and not payload:
        raise ModelFormatError(
            f"{path}: reading its inputs with {engine} took longer than {seconds:g} s (stopped); the file is damaged "
            "or huge; check it, or raise LAYERDIFF_MODEL_READ_SECONDS")
    how = f"killed by {_signal_name(os.WTERMSIG(status))}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    raise ModelFormatError(
        f"{path}: {engine}'s reader crashed on this file ({how}, memory limit {human_bytes(memory)}); the file is "
        f"damaged or not a {engine} model: re-export it, or raise LAYERDIFF_MODEL_READ_MEMORY if it is genuinely this large")


def _typed_error(doc: dict, engine: str, path: Path, memory: int) -> Exception:
    kind, message = str(doc["error"]), str(doc.get("message", ""))
    if kind == "MemoryError":
        return ModelFormatError(f"{path}: reading its inputs with {engine} needs more than the {human_bytes(memory)} "
                                "memory limit; the file is damaged, or raise LAYERDIFF_MODEL_READ_MEMORY")
    if kind == "RecursionError":
        return ModelFormatError(f"{path}: nested too deeply for {engine}'s reader; the file is damaged or hostile")
    if kind == "ImportError":
        return ModelFormatError(f"{path}: {engine}'s library did not load to read the model ({message}); install it, or "
                                f"raise LAYERDIFF_MODEL_READ_MEMORY (now {human_bytes(memory)}) if the load ran out of memory")
    if kind == "Exception":
        return ModelFormatError(f"{path}: {engine} could not read this model ({message}); check the file")
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.LayerdiffError)) or cls is errors.HarnessExit:
        cls = InputError
    return cls(message)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child_main(argv: list[str]) -> None:
    engine, path, memory, seconds = argv[0], Path(argv[1]), int(argv[2]), float(argv[3])
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # engine banners must not mix with the answer
    data = _answer(engine, path, memory, seconds)
    view = memoryview(data)
    while view:
        view = view[os.write(out, view):]


if __name__ == "__main__":
    _child_main(sys.argv[1:])
