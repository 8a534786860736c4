"""How every benchmark here measures: whole child processes, alternated with their floor, median ratio.

Why this method:
- The machine is shared and noisy, so wall time lies; CPU time (user + system) of a child process
  does not depend on what else runs. It is read from the kernel's accounting of the children this
  process waited for: `resource.getrusage(RUSAGE_CHILDREN)` before and after each child (the
  difference is that child's CPU, its own children included).
- Peak RSS is the child's own `ru_maxrss`, taken from `os.wait4` for that child:
  `getrusage(RUSAGE_CHILDREN).ru_maxrss` is the largest of *all* children so far, so it cannot tell
  the floor's peak from the command's.
- The command and its floor run alternately (floor, command, floor, command, ...) after one warm-up
  of each, so both see the same page cache and the same background load; each round gives one
  ratio, and the figure printed is the median of those ratios (robust to one disturbed round).
"""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Usage:
    """One child process: CPU seconds (user + sys), wall seconds, peak RSS in bytes, exit code."""

    cpu: float
    wall: float
    peak_rss: int
    returncode: int


def run_child(argv: Sequence[str], *, env: dict | None = None, cwd: Path | None = None,
              check: bool = True) -> Usage:
    """Run one command to completion, its output discarded, and return its resource usage."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    _, status, own = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.stderr and proc.stderr.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if check and proc.returncode not in (0, 2):  # analyze exits 2 for "report written with problems"
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {err.strip()[-2000:]}")
    return Usage(cpu=cpu, wall=wall, peak_rss=own.ru_maxrss * 1024, returncode=proc.returncode)


def python(*args: str) -> list[str]:
    """A Python child that imports this checkout (PYTHONPATH set by `child_env`)."""
    return [sys.executable, *args]


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@dataclass
class Alternation:
    """Rounds of (floor, command) usage; ratios are command / floor per round."""

    floor: list[Usage]
    command: list[Usage]

    def ratio(self, field: str = "cpu") -> float:
        return statistics.median(getattr(c, field) / getattr(f, field) for f, c in zip(self.floor, self.command))

    def median(self, side: str, field: str = "cpu") -> float:
        return statistics.median(getattr(u, field) for u in getattr(self, side))

    def peak(self, side: str) -> int:
        return max(u.peak_rss for u in getattr(self, side))


def alternate(floor: Callable[[], Usage], command: Callable[[], Usage], rounds: int,
              warmup: bool = True) -> Alternation:
    """Warm both once (page cache, import caches), then alternate floor and command `rounds` times."""
    if warmup:
        floor()
        command()
    result = Alternation([], [])
    for _ in range(rounds):
        result.floor.append(floor())
        result.command.append(command())
    return result


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


MiB = 2**20
