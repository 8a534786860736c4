"""Helpers of the fault-injection suite: crafted files, and CLI runs that must end in one line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from layerdiff.analyzer.formats.dumpfile import DumpWriter

REPO = Path(__file__).resolve().parents[2]


def cli(tool: str, *args: str, env: dict | None = None, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`collect`/`analyze` from this checkout as a user would run it."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", **(env or {})}
    module = {"collect": "layerdiff.collector.cli", "analyze": "layerdiff.analyzer.cli.app"}[tool]
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                           env=full_env, timeout=timeout, cwd=cwd)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 1) -> str:
    """The run failed with `code`, printing one line (no traceback) that contains every needle."""
    err = proc.stderr.strip()
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write_dump(path: Path, arrays: list[np.ndarray], *, inputs: dict[str, np.ndarray] | None = None,
               attrs: dict | None = None) -> Path:
    """A genuine small layerdiff dump written by the real writer."""
    with DumpWriter(path, {"engine": "mnn", "backend_requested": "cpu", "precision_requested": "high",
                           **(attrs or {})}) as writer:
        for order, array in enumerate(arrays):
            writer.add_tensor({"order": order, "op": f"op{order}", "op_type": "Conv", "inputs": [] if order == 0 else [f"op{order - 1}"],
                               "name": f"op{order}"}, array)
        for name, array in (inputs or {}).items():
            writer.add_input(name, array)
        writer.set_log("ok\n")
    return path


