"""Child processes the collector starts (harness runs, harness builds), each in a process group of
its own, so that Ctrl-C can end each one with everything it spawned (cmake → ninja → cc1plus).

Children live in their own session so the terminal's Ctrl-C reaches only the collector, which then
decides: it terminates every registered group (SIGTERM, then SIGKILL after a short grace) and marks
the runs interrupted. Nothing outlives `collect` as an orphan.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

_CHILDREN: set[subprocess.Popen] = set()
_LOCK = threading.Lock()
GRACE_S = 2.0


def register(proc: subprocess.Popen) -> None:
    with _LOCK:
        _CHILDREN.add(proc)


def unregister(proc: subprocess.Popen) -> None:
    with _LOCK:
        _CHILDREN.discard(proc)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal the child's whole process group (it leads one: started with start_new_session)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except OSError:
            pass


def terminate_children(grace_s: float = GRACE_S) -> None:
    """End every registered child group: SIGTERM, then SIGKILL whatever is left after `grace_s`."""
    with _LOCK:
        children = list(_CHILDREN)
    for proc in children:
        kill_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in children:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        kill_group(proc, signal.SIGKILL)  # the leader may be gone while its group (ninja's compilers) lives on


def end_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM the child's group, SIGKILL it after `grace_s`, and reap the child."""
    kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    kill_group(proc, signal.SIGKILL)
    proc.wait()


# A guard that leads the child's process group and outlives nothing: if the collector that started
# it dies without ending it (SIGKILL, a crashed terminal, a test timeout killing pytest), the guard
# sees its parent change and ends the whole group (a harness build's cmake, ninja and compilers
# otherwise compiled on for ten minutes as orphans). Stdlib only, run with `python -S -c`.
GUARD = r"""
import os, signal, subprocess, sys, time
parent = int(sys.argv[1])
child = subprocess.Popen(sys.argv[2:])
def end(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, end)
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    try:
        code = child.wait(timeout=0.5)
        break
    except subprocess.TimeoutExpired:
        if os.getppid() != parent:
            end()
sys.exit(code if code >= 0 else 128 - code)
"""


def guarded(cmd: list[str]) -> list[str]:
    """`cmd` run under `GUARD` (start it with start_new_session=True): the group ends with us."""
    import sys

    return [sys.executable, "-S", "-c", GUARD, str(os.getpid()), *cmd]
