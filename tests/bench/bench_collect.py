"""Benchmark: `collect` of the bundled sample model on the local device vs pip ncnn doing the same work.

Run by hand:  python tests/bench/bench_collect.py [--rounds 5] [--no-report]

Method (see tests/bench/measure.py): CPU time (getrusage(RUSAGE_CHILDREN)) and peak RSS (ru_maxrss
of the command's own process tree, measured under a small wrapper) of whole processes, the command
and its floor alternated after one warm-up each, ratio = median over rounds.
- command: `collect --device local --backend cpu --precision high -o OUT` on samples/models/convnet.param
  (input `random:0`), as a child process: start-up, planning, the engine child, raw dump, HDF5
  conversion, index, and the sweep's own report unless --no-report.
- floor: one Python process that imports ncnn and numpy, loads the same model with the same
  options, feeds the same input, extracts every layer's blob in order (light mode off) and saves
  them all with numpy (`np.savez`): the least a tool that dumps every layer has to do.
Target: command CPU <= 2 x floor CPU + 0.5 s; peak RSS <= 2 x the largest layer + 300 MB.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.measure import MiB, REPO, alternate, child_env, python, run_child, verdict  # noqa: E402

MODEL = REPO / "samples" / "models" / "convnet.param"

FLOOR = r"""
import sys
import numpy as np
import ncnn
param, out = sys.argv[1], sys.argv[2]
net = ncnn.Net()
net.opt.use_vulkan_compute = False
net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = False
net.opt.use_bf16_storage = False
net.opt.lightmode = False
net.load_param(param)
net.load_model(param[:-len(".param")] + ".bin")
data = np.random.default_rng(0).random((3, 32, 32), dtype=np.float32)
ex = net.create_extractor()
ex.input(net.input_names()[0], ncnn.Mat(data))
blobs = net.blobs()
saved = {}
for layer in net.layers():
    for top in layer.tops:
        status, mat = ex.extract(blobs[top].name, 0)
        saved[f"{len(saved)}"] = np.array(mat, dtype=np.float32, copy=True)
np.savez(out, **saved)
"""


def largest_layer_bytes(out_dir: Path) -> int:
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    dump = next(out_dir.rglob("*.h5"))
    with DumpFile(dump) as f:
        return int((f.layers["numel"] * 4).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-report", action="store_true", help="collect without the sweep's own report")
    args = parser.parse_args()
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="layerdiff-bench-collect-") as tmp:
        folder = Path(tmp)
        script = folder / "floor.py"
        script.write_text(FLOOR)
        counter = iter(range(10**6))
        last = {}

        def collect():
            out = folder / f"runs{next(counter)}"
            usage = run_child(python("-m", "layerdiff.collector.cli", "--device", "local", "--backend", "cpu", "--precision",
                                     "high", "--model", str(MODEL), "-o", str(out),
                                     *(["--no-report"] if args.no_report else [])), env=env)
            if "out" in last:
                shutil.rmtree(last["out"], ignore_errors=True)
            last["out"] = out
            return usage

        def floor():
            return run_child(python(str(script), str(MODEL), str(folder / "blobs.npz")), env=env)

        result = alternate(floor, collect, args.rounds)
        largest = largest_layer_bytes(last["out"])
    floor_cpu, collect_cpu = result.median("floor"), result.median("command")
    budget = statistics.median(2 * f.cpu + 0.5 for f in result.floor)
    ok = statistics.median(c.cpu - (2 * f.cpu + 0.5) for f, c in zip(result.floor, result.command)) <= 0
    rss_goal = 2 * largest + 300 * MiB
    peak = result.peak("command")
    print(f"floor (pip ncnn, extract + np.savez every blob): {floor_cpu:.2f} s CPU, peak {result.peak('floor') / MiB:.0f} MiB")
    print(f"collect ({'no report' if args.no_report else 'with its report'}): {collect_cpu:.2f} s CPU "
          f"({result.median('command', 'wall'):.2f} s wall), peak {peak / MiB:.0f} MiB")
    print(f"CPU ratio collect/floor (median of {args.rounds} alternating rounds): {result.ratio():.2f}; "
          f"target collect <= 2 x floor + 0.5 s = {budget:.2f} s -> {verdict(ok)}")
    print(f"peak RSS {peak / MiB:.0f} MiB (target <= 2 x {largest / MiB:.2f} MiB + 300 MiB = {rss_goal / MiB:.0f} MiB)"
          f" -> {verdict(peak <= rss_goal)}")


if __name__ == "__main__":
    main()
