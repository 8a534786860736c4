"""Benchmark: what reading a model's declared inputs in a limited child costs over reading them in-process.

Run by hand:  python tests/bench/bench_model_read.py [--rounds 15]

Every `collect` reads the model's inputs once (collector/inputs/modelread.py): a forked child with
memory and time limits, so that an engine's reader crashing on a hostile file cannot take `collect`
with it. Method: for each bundled sample format, in one fresh interpreter per measurement (the engine
library imported as a real `collect` would import it: once, for this read), the wall time of
`read_specs_isolated` with an empty answer cache (cold: the child runs), with the answer kept by an
earlier collect (warm: no child), and of the engine's own `input_specs` (in-process); medians over
rounds. Target: the cold child adds at most 100 ms to a collect of the sample model; the warm read costs less than in-process.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLES = {"mnn": REPO / "samples" / "models" / "convnet.mnn", "ncnn": REPO / "samples" / "models" / "convnet.param",
           "onnxruntime": REPO / "samples" / "models" / "convnet.onnx"}

PROBE = r"""
import sys, time
from pathlib import Path
engine, path, how = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
from layerdiff.collector.engines import ENGINES
import layerdiff.collector.inputs.modelfiles  # what collect has imported when it reads the model
from layerdiff.collector.inputs.modelread import read_specs_isolated
start = time.perf_counter()
specs = read_specs_isolated(engine, path) if how != "in-process" else ENGINES[engine].input_specs(path)
print(time.perf_counter() - start)
"""


def once(engine: str, path: Path, how: str, cache: str) -> float:
    env = {**os.environ, "LAYERDIFF_CACHE": cache}
    out = subprocess.run([sys.executable, "-c", PROBE, engine, str(path), how], capture_output=True, text=True,
                         check=True, cwd=REPO, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    worst = 0.0
    for engine, path in SAMPLES.items():
        cold, warm, inproc = [], [], []
        with tempfile.TemporaryDirectory() as kept:
            for _ in range(rounds):
                with tempfile.TemporaryDirectory() as empty:
                    cold.append(once(engine, path, "cold", empty))
                warm.append(once(engine, path, "warm", kept))
                inproc.append(once(engine, path, "in-process", kept))
        c, w, i = statistics.median(cold), statistics.median(warm), statistics.median(inproc)
        worst = max(worst, c - i)
        print(f"{engine:12s} {path.name:16s} cold child {c * 1000:6.1f} ms  warm {w * 1000:6.1f} ms  "
              f"in-process {i * 1000:6.1f} ms  cold adds {(c - i) * 1000:+6.1f} ms")
    print(f"verdict: the cold child adds at worst {worst * 1000:.1f} ms per collect (target <= 100 ms): {'PASS' if worst <= 0.1 else 'FAIL'}")


if __name__ == "__main__":
    main()
