"""How every benchmark here measures: whole child processes, alternated with their floor, median ratio.

Why this method:
- The machine is shared and noisy, so wall time lies; CPU time (user + system) of a child process
  does not depend on what else runs. It is read from the kernel's accounting of the children this
  process waited for: `resource.getrusage(RUSAGE_CHILDREN)` before and after each child (the
  difference is that child's CPU, its own children included).
- Peak RSS is the command's own `ru_maxrss`. Two kernel habits are avoided: the RUSAGE_CHILDREN
  figure is the largest of *all* children so far (it cannot tell the floor's peak from the
  command's), and a child's `ru_maxrss` starts from its parent's high-water mark at fork/exec (a
  benchmark holding 200 MB of test data would be billed to every child). So each command runs under
  `WRAPPER`, a minimal Python that forks+execs it, waits for it with `os.wait4` and reports that
  child's own ru_maxrss and CPU (from its getrusage(RUSAGE_CHILDREN), i.e. the command and its children).
- The command and its floor run alternately (floor, command, floor, command, ...) after one warm-up
  of each, so both see the same page cache and the same background load; each round gives one
  ratio, and the figure printed is the median of those ratios (robust to one disturbed round).
"""
from __future__ import annotations

import json
import os
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


WRAPPER = r"""
import json, os, resource, sys
fd = int(sys.argv[1])
pid = os.fork()
if pid == 0:
    os.close(fd)
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, own = os.wait4(pid, 0)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
os.write(fd, json.dumps({"rc": os.waitstatus_to_exitcode(status), "maxrss_kb": own.ru_maxrss,
                        "cpu": kids.ru_utime + kids.ru_stime}).encode())
"""


def run_child(argv: Sequence[str], *, env: dict | None = None, cwd: Path | None = None,
              check: bool = True) -> Usage:
    """Run one command to completion (output discarded) under `WRAPPER`; return its resource usage."""
    read_end, write_end = os.pipe()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-S", "-c", WRAPPER, str(write_end), *map(str, argv)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd, pass_fds=(write_end,))
    os.close(write_end)
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    with os.fdopen(read_end, "rb") as f:
        raw = f.read()
    report = json.loads(raw) if raw else {"rc": proc.returncode or -1, "maxrss_kb": 0, "cpu": 0.0}
    if check and report["rc"] not in (0, 2):  # analyze exits 2 for "report written with problems"
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {report['rc']}: {err.decode(errors='replace')[-2000:]}")
    return Usage(cpu=report["cpu"], wall=wall, peak_rss=report["maxrss_kb"] * 1024, returncode=report["rc"])


def python(*args: str) -> list[str]:
    """A Python child that imports this checkout (PYTHONPATH set by `child_env`)."""
    return [sys.executable, *args]


def child_env() -> dict:
    """This checkout first on the path, and bytecode caching on as in an installed package (pip writes
    .pyc files; a session with PYTHONDONTWRITEBYTECODE=1 recompiled ~1,000 modules per child, 0.4 s CPU)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
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
