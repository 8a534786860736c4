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
