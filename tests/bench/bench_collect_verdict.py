"""Benchmark: `collect` to its verdict (two configurations and the sweep's report) vs one process doing the same work.

Run by hand:  python tests/bench/bench_collect_verdict.py [--rounds 3]

Method (see tests/bench/measure.py): CPU time (user + sys, the command's whole process tree) of whole
processes, the command and its floor alternated after one warm-up each, ratio = median over rounds.
- command: `collect --device local --config cpu/high,vulkan/low -o OUT` on the bundled sample model
  (samples/models/convnet.param, input `random:0`): start-up, planning, both engine runs (ncnn's Vulkan
  on Mesa's lavapipe), raw dumps, HDF5, index, and the sweep's report (verdict, findings, page).
- floor: one Python process with pip ncnn: the model at fp32 on the CPU and at fp16 on Vulkan, every
  blob extracted in order on both, the relative L2 error of each blob in numpy: the least any tool that
  answers "which layer first diverges on Vulkan fp16" must do.
- time to the verdict: in one extra run, the wall time until the verdict row (the vulkan/low row of the
  console table) is printed, against the run's whole wall time: nothing is drawn before it.
Target: command CPU <= 2 x floor CPU.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.measure import REPO, alternate, child_env, python, run_child, verdict  # noqa: E402

MODEL = REPO / "samples" / "models" / "convnet.param"
TARGET = 2.0

FLOOR = r"""
import sys
import numpy as np
import ncnn
param = sys.argv[1]
data = np.random.default_rng(0).random((3, 32, 32), dtype=np.float32)

def blobs(vulkan):
    net = ncnn.Net()
    net.opt.use_vulkan_compute = vulkan
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = vulkan
    net.opt.use_bf16_storage = False
    net.opt.lightmode = False
    net.load_param(param)
    net.load_model(param[:-len(".param")] + ".bin")
    ex = net.create_extractor()
    ex.input(net.input_names()[0], ncnn.Mat(data))
    names = [net.blobs()[top].name for layer in net.layers() for top in layer.tops]
    out = {}
    for name in names:
        status, mat = ex.extract(name, 0)
        out[name] = np.array(mat, dtype=np.float32, copy=True)
    return out

ref, run = blobs(False), blobs(True)
worst = 0.0
for name, x in ref.items():
    d = run[name].reshape(-1) - x.reshape(-1)
    worst = max(worst, float(np.linalg.norm(d) / max(float(np.linalg.norm(x)), 1e-30)))
print(worst)
"""


def collect_args(out: Path) -> list[str]:
    return python("-m", "layerdiff.collector.cli", "--device", "local", "--config", "cpu/high,vulkan/low",
                  "--model", str(MODEL), "--input", "random:0", "-o", str(out))


def time_to_verdict(out: Path, env: dict) -> tuple[float, float]:
    """(seconds until the vulkan/low verdict row is printed, seconds until the command ends)."""
    start = time.perf_counter()
    proc = subprocess.Popen(collect_args(out), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=REPO)
    seen = None
    for line in proc.stdout:
        if seen is None and "vulkan/low" in line and any(v in line for v in ("pass", "warn", "fail")):
            seen = time.perf_counter() - start
    proc.wait()
    return (seen if seen is not None else float("nan")), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="layerdiff-bench-verdict-") as tmp:
        folder = Path(tmp)
        script = folder / "floor.py"
        script.write_text(FLOOR)
        counter = iter(range(10**6))

        def collect():
            out = folder / f"runs{next(counter)}"
            usage = run_child(collect_args(out), env=env, cwd=REPO)
            shutil.rmtree(out, ignore_errors=True)
            return usage

        def floor():
            return run_child(python(str(script), str(MODEL)), env=env)

        result = alternate(floor, collect, args.rounds)
        verdict_s, total_s = time_to_verdict(folder / "timed", env)
    ratio = result.ratio()
    print(f"floor (one process: pip ncnn fp32 cpu + fp16 Vulkan, every blob, rel L2 in numpy): "
          f"{result.median('floor'):.2f} s CPU ({result.median('floor', 'wall'):.2f} s wall)")
    print(f"collect --config cpu/high,vulkan/low to its verdict and report: {result.median('command'):.2f} s CPU "
          f"({result.median('command', 'wall'):.2f} s wall)")
    print(f"CPU ratio collect/floor (median of {args.rounds} alternating rounds): {ratio:.2f} (target <= {TARGET}) "
          f"-> {verdict(ratio <= TARGET)}")
    print(f"verdict row printed after {verdict_s:.2f} s of {total_s:.2f} s wall (the page is written after it)")


if __name__ == "__main__":
    main()
