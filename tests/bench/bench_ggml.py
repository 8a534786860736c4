"""Benchmark: the ggml engine's build time, and run time + peak RSS of a ggml `collect`.

Run by hand:  python tests/bench/bench_ggml.py [--build host|aarch64|vulkan] [--rounds 3]
--build TARGET builds that layerdiff-ggml from scratch into a temporary cache ($LAYERDIFF_CACHE)
and prints its wall time and the compilers' CPU time (getrusage of the children): on 2 cores the
CPU time / 2 is the floor of the wall time, whatever else the machine does. `vulkan` is the host
build with ggml's Vulkan backend (needs glslc: Debian `apt-get install glslc`); CI never builds it.
Without --build it times `collect --device local --model tinyllama.gguf --backend cpu` (the
sample llama model, all of its nodes dumped) as a child process: wall, CPU and peak RSS of its
process tree (collector + harness), plus the harness alone.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def build(target: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-ggml-") as cache:
        env = {**os.environ, "LAYERDIFF_CACHE": cache}
        spec = {"host": [], "aarch64": ["--target", "aarch64"], "vulkan": ["--vulkan"]}[target]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "layerdiff.collector.engines.ggml.build", *spec], env=env,
                              capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        status = "built" if proc.returncode == 0 else f"FAILED ({proc.stderr.strip().splitlines()[-1:]})"
        print(f"build {target}: {status} in {wall:.0f} s wall, {cpu:.0f} s CPU (2-core floor {cpu / 2:.0f} s), "
              f"load average {os.getloadavg()[0]:.1f}")


def timed(cmd: list[str], env: dict) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB of the process tree) of one child command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024


def collect(rounds: int) -> None:
    from layerdiff.collector.engines.ggml.build import ensure_built
    from layerdiff.samples.ggml_models import write_all

    binary = ensure_built()
    with tempfile.TemporaryDirectory(prefix="bench-ggml-") as tmp:
        files = write_all(Path(tmp) / "samples")
        env = {**os.environ, "LAYERDIFF_GGML_BINARY": str(binary)}
        rows = []
        for k in range(rounds):
            out = Path(tmp) / f"c{k}"
            rows.append(timed([sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model",
                               str(files["tinyllama"]), "--input", str(files["tokens"]), "--backend", "cpu",
                               "--precision", "high", "-o", str(out), "--no-report"], env))
            harness = timed([str(binary), "--model", str(files["tinyllama"]), "--input", f"tokens={files['tokens']}",
                             "--out", str(Path(tmp) / f"raw{k}")], env)
        print(f"collect tinyllama cpu/high: wall {statistics.median(r[0] for r in rows):.2f} s, "
              f"CPU {statistics.median(r[1] for r in rows):.2f} s, peak RSS {max(r[2] for r in rows):.0f} MB "
              f"(ru_maxrss of the largest child); harness alone: {harness[0]:.3f} s wall")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=["host", "aarch64", "vulkan"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.build:
        build(args.build)
    else:
        collect(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
