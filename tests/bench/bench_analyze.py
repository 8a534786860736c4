"""Benchmark: the analyzer's full metric suite vs the floor "read both tensors + one subtraction".

Run by hand: `python tests/bench/bench_analyze.py [--total-gb 1.0] [--layers 16] [--dir /tmp/x]`.
Writes two synthetic dumps (reference and a perturbed run; half the layers ReLU-like with 50%
zeros, so the zero-collapse path is exercised) totalling --total-gb, then measures in one run:
- floor: for every layer, h5py reads both tensors and numpy subtracts them (best of --repeat, warm cache);
- suite: `analyze_paths` (open, align, every metric, findings, summary) in a child process, whose
  peak RSS is read from the kernel (ru_maxrss); best time of --repeat children.
Prints throughput ratio floor_time / suite_time (goal >= 0.5) and peak RSS against the goal of
2 x the largest layer + 300 MB.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from analyzer.dumpfile import DumpWriter  # noqa: E402


def make_dumps(folder: Path, total_bytes: int, layers: int) -> tuple[Path, Path, int]:
    """Two dumps of `layers` float32 layers each; returns their paths and the layer size in bytes."""
    per_layer = total_bytes // (2 * layers) // 4
    rng = np.random.default_rng(0)
    paths = (folder / "ref.h5", folder / "run.h5")
    writers = [DumpWriter(paths[0], {"backend_requested": "cpu", "precision_requested": "high"}),
               DumpWriter(paths[1], {"backend_requested": "vulkan", "precision_requested": "low"})]
    previous = "data"
    for i in range(layers):
        ref = rng.standard_normal(per_layer, dtype=np.float32)
        if i % 2:
            np.maximum(ref, 0, out=ref)  # ReLU-like: half zeros
        run = ref + rng.standard_normal(per_layer, dtype=np.float32) * np.float32(1e-3)
        if i % 2:
            np.maximum(run, 0, out=run)
        meta = {"order": i, "op": f"block{i}/op", "op_type": "ReLU" if i % 2 else "Convolution",
                "name": f"t{i}", "inputs": [previous]}
        writers[0].add_tensor(meta, ref)
        writers[1].add_tensor(meta, run)
        previous = f"t{i}"
        del ref, run
    for w in writers:
        w.close()
    return paths[0], paths[1], per_layer * 4


def floor_seconds(ref: Path, run: Path) -> float:
    """Read both tensors of every layer with h5py and subtract once: the least any comparison costs."""
    start = time.perf_counter()
    with h5py.File(ref, "r") as a, h5py.File(run, "r") as b:
        for name in a["tensors"]:
            x = a["tensors"][name][()]
            y = b["tensors"][name][()]
            d = y - x
            del x, y, d
    return time.perf_counter() - start


SUITE = """
import json, sys, time
sys.path.insert(0, {repo!r})
from analyzer.analysis import analyze_paths
start = time.perf_counter()
analysis = analyze_paths([{ref!r}, {run!r}])
elapsed = time.perf_counter() - start
layers = len(analysis.comparison.table)
analysis.close()
print(json.dumps({{"seconds": elapsed, "layers": layers}}))
"""


def suite_in_child(ref: Path, run: Path) -> tuple[float, int, int]:
    """Run the suite in a fresh process so its peak RSS is the suite's own."""
    code = SUITE.format(repo=str(REPO), ref=str(ref), run=str(run))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["seconds"], max(peak_kb, before) * 1024, result["layers"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-gb", type=float, default=1.0)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3, help="best of N for both timings (shared machines are noisy)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        t0 = time.perf_counter()
        ref, run, layer_bytes = make_dumps(Path(tmp), int(args.total_gb * 2**30), args.layers)
        total = ref.stat().st_size + run.stat().st_size
        print(f"dumps: 2 x {args.layers} layers, {total / 2**30:.2f} GiB total, largest layer "
              f"{layer_bytes / 2**20:.0f} MiB (written in {time.perf_counter() - t0:.1f} s)")
        floor_seconds(ref, run)  # warm the page cache
        floor = min(floor_seconds(ref, run) for _ in range(args.repeat))
        trials = [suite_in_child(ref, run) for _ in range(args.repeat)]
        suite, peak, layers = min(t[0] for t in trials), max(t[1] for t in trials), trials[0][2]
        goal_rss = 2 * layer_bytes + 300 * 2**20
        print(f"floor (read both + subtract): {floor:.2f} s = {total / floor / 2**30:.2f} GiB/s")
        print(f"full metric suite ({layers} layers): {suite:.2f} s = {total / suite / 2**30:.2f} GiB/s")
        print(f"throughput ratio suite/floor: {floor / suite:.2f} (goal >= 0.5)")
        print(f"peak RSS: {peak / 2**20:.0f} MiB (goal <= 2 x largest layer + 300 MiB = {goal_rss / 2**20:.0f} MiB)"
              f" -> {'ok' if peak <= goal_rss else 'OVER'}")


if __name__ == "__main__":
    main()
