"""Long steps show progress on stderr: a bar on a terminal, plain lines once a step runs long
elsewhere, and nothing at all for a quick command whose output is read by a program."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from layerdiff import progress
from layerdiff.progress import Steps
from tests.analyze_dumps import perturbed, reference_arrays, write_dump

REPO = Path(__file__).resolve().parent.parent


def test_quick_steps_off_a_terminal_write_nothing():
    stream = io.StringIO()
    steps = Steps("analyze", stream=stream, terminal=False)
    with steps.step("aligning", 10) as advance:
        for done in range(10):
            advance(done, 10)
    assert stream.getvalue() == ""


def test_slow_steps_off_a_terminal_say_where_they_are(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_AFTER", 0.0)
    stream = io.StringIO()
    with Steps("analyze", stream=stream, terminal=False).step("aligning b with a", 4) as advance:
        advance(1, 4)
        advance(2, 4)  # within PLAIN_EVERY of the last line: not repeated
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("analyze: aligning b with a: 1/4 (") and lines[-1].startswith("analyze: aligning b with a: done")
    assert len(lines) == 2


def test_a_terminal_gets_a_bar_that_leaves_no_trace_in_output():
    stream = io.StringIO()
    with Steps("analyze", stream=stream, terminal=True).step("measuring", 3) as advance:
        advance(3, 3)
    assert "Traceback" not in stream.getvalue()


def test_analyze_piped_prints_only_its_results(tmp_path):
    ref = reference_arrays()
    folder = tmp_path / "runs"
    folder.mkdir()
    write_dump(folder / "cpu_high.h5", ref)
    write_dump(folder / "vulkan_low.h5", perturbed(ref, 1e-4), backend="vulkan", precision="low")
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(folder), "-o", str(tmp_path / "r"),
                           "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and proc.stdout.lstrip().startswith("{")
