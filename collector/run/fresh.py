"""`--repeat N --fresh-process`: each repetition in a harness process of its own, for every engine.

Repeating inside one process shows run-to-run nondeterminism (LiteRT's split GPU graph on
pose_detection changes from run to run); some faults only change between processes (MNN's Arm82
GridSample bug: uninitialised memory, the same within a process). Every harness already speaks
`--out DIR` without `--repeat`, so a fresh-process repeat is the same command N times, each writing
the `r<k>` directory the in-process `--repeat` would have written: fetching and conversion are
shared, and each HDF5 records its repeat index and `fresh_process` in its provenance.
"""
from __future__ import annotations

from typing import Callable

from layerdiff.collector.transport.devices import Device, ExecResult


def single_run_argv(argv: list[str], run_dir: str, k: int) -> list[str]:
    """The harness arguments of repeat `k` alone: `--repeat N` dropped, `--out` pointed at `dump/r<k>`."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--repeat":
            skip = True
            continue
        if arg == "--out" and i + 1 < len(argv):
            out += ["--out", f"{run_dir}/dump/r{k}"]
            skip = True
            continue
        out.append(arg)
    return out


def execute_fresh(device: Device, command: list[str], argv: list[str], run_dir: str, repeat: int, *,
                  env: dict, deadline_s: float, on_stdout_line: Callable[[str], None] | None) -> ExecResult:
    """Run the harness once per repeat, stopping at the first failure; one ExecResult for them all
    (the failing process's status, every process's stderr in order, the summed duration)."""
    results: list[ExecResult] = []
    for k in range(repeat):
        result = device.execute(command + single_run_argv(argv, run_dir, k), env=env, deadline_s=deadline_s,
                                on_stdout_line=on_stdout_line)
        results.append(result)
        if result.exit_status != 0:
            break
    last = results[-1]
    stderr = "".join(f"--- repeat {k} (fresh process) ---\n{r.stderr}" for k, r in enumerate(results))
    return ExecResult(exit_status=last.exit_status, stderr=stderr, duration_s=sum(r.duration_s for r in results),
                      timed_out=last.timed_out, pid=last.pid, device_log=last.device_log)
