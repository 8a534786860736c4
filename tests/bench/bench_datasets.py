"""Benchmark: data sets, collected and analyzed.

`--collect` (the default): a sweep of the seed-003 sample (the `underflow` ncnn model on generated
photos, samples/images.py, prepared as the scenario prepares them) over N inputs at cpu/high, as
`collect --input DIR` runs it: one engine process for the configuration, each input its own HDF5 file.
Against the floor: that same engine process alone (`--each`, the model loaded once, N inferences with
every layer dumped, no collector), started by this script on the same inputs. Prints both times, the
ratio (goal <= 1.5x) and the peak resident memory of the sweep at N and at N/10 inputs (memory bounded
by one input's dump: the two are close).

`--view`: the data-set view of a large sweep against the analysis it is part of. One cpu/high and one
opencl/low run on each of N inputs (written with the project's dump writer, tests/analyze_dumps.py's
graph; every 29th input fails), analyzed once; then the data-set view (findings/datasets.py) and the
per-op repeat numbers (measure/repeats.py) are built again from that analysis, each timed over a few
rounds. The figure printed is the view's median time as a share of the whole analysis. Goal: <= 5%.

    python -m tests.bench.bench_datasets [--collect | --view] [--inputs 200] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.findings.datasets import dataset_view
from layerdiff.analyzer.measure.repeats import repeat_spread_per_op
from tests.test_datasets import _dataset_folder


REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "samples" / "models" / "underflow.param"
# the photos' brightest pixel values, in turn: well exposed, dim (fp16 subnormals), nearly black (fp16 zeros)
BRIGHTEST = (255, 3, 1)


def photos(folder: Path, count: int) -> Path:
    """`count` generated photos (samples/images.py's scenes, other seeds) as PNG files."""
    from PIL import Image

    from layerdiff.samples.images import scene

    folder.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        Image.fromarray(scene(1000 + k, BRIGHTEST[k % len(BRIGHTEST)])).save(folder / f"photo{k:04d}.png")
    return folder


def prepared_inputs(folder: Path, out: Path) -> list[dict]:
    """The photos as the sweep feeds them (the scenario's recipe), one .npy each, as `--each` cases."""
    from layerdiff.collector.inputs.inputset import resolve_inputs
    from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
    from layerdiff.collector.inputs.preprocess import parse_preprocess
    from layerdiff.samples.images import RECIPE

    files = resolve_model(MODEL, "auto")
    sets, errors = resolve_inputs([str(folder)], input_shapes(files), parse_preprocess(RECIPE))
    assert not errors, errors
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for k, inputs in enumerate(sets):
        staged = {}
        for name, array in inputs.arrays.items():
            path = out / f"case{k}-{len(staged)}.npy"
            np.save(path, np.asarray(array, dtype="<f4"))
            staged[name] = str(path)
        cases.append({"out": str(out / f"dump{k}"), "inputs": staged})
    return cases


def timed(argv: list[str], env: dict | None = None) -> tuple[float, int, float]:
    """Wall seconds, the peak resident memory (bytes) of the largest process the command ran, and the CPU
    seconds of all its processes (on a busy machine the CPU figure is the steadier of the two). Python's
    compiled modules are cached as an installed layerdiff has them (without, each start compiles every module)."""
    script = ("import resource, subprocess, sys, time; s = time.perf_counter(); "
              "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); t = time.perf_counter() - s; "
              "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
              "print(t, u.ru_maxrss * 1024, r.returncode, u.ru_utime + u.ru_stime)")
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, check=True,
                          env={**environ, **(env or {})})
    wall, peak, code, cpu = done.stdout.split()
    assert code == "0", f"{argv[:4]} exited {code}: {done.stderr[-500:]}"
    return float(wall), int(peak), float(cpu)


def floor(cases: list[dict], work: Path) -> tuple[float, int, float]:
    """The engine process alone: the model loaded once, every input run with every layer dumped."""
    from layerdiff.collector.transport.devices import HOST_ENGINE_ENV

    listing = work / "cases.jsonl"
    listing.write_text("\n".join(json.dumps(c) for c in cases) + "\n")
    argv = [sys.executable, "-m", "layerdiff.collector.engines.ncnn.engine", "--engine", "ncnn",
            "--model", str(MODEL), "--model", str(MODEL.with_suffix(".bin")), "--backend", "cpu",
            "--precision", "high", "--out", str(work / "unused"), "--each", str(listing)]
    return timed(argv, HOST_ENGINE_ENV)


def sweep(folder: Path, out: Path) -> tuple[float, int, float]:
    from layerdiff.samples.images import RECIPE

    return timed([sys.executable, "-m", "layerdiff.collector.cli", "--model", str(MODEL), "--input", str(folder),
                  "--preprocess", RECIPE, "--config", "cpu/high", "-o", str(out), "--no-report"])


def bench_collect(count: int, rounds: int) -> None:
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = photos(work / "photos", count)
        small = photos(work / "photos-small", max(count // 10, 2))
        cases = prepared_inputs(folder, work / "staged")
        _, small_peak, _ = sweep(small, work / "runs-small")  # also fills Python's compiled-module cache, as installed
        floors, sweeps = [], []
        for k in range(rounds):
            floors.append(floor([{**c, "out": f"{c['out']}-{k}"} for c in cases], work))
            sweeps.append(sweep(folder, work / f"runs{k}"))
        written = len(list((work / "runs0").glob("*.h5")))
    base, wall = statistics.median(t for t, _, _ in floors), statistics.median(t for t, _, _ in sweeps)
    base_cpu, cpu = statistics.median(c for _, _, c in floors), statistics.median(c for _, _, c in sweeps)
    peak = max(p for _, p, _ in sweeps)
    print(f"{count} inputs ({written} dumps written), cpu/high: sweep {wall:.2f} s, floor (one engine process, "
          f"{count} inferences, every layer dumped) {base:.2f} s: {wall / base:.2f}x wall (goal <= 1.5x); "
          f"CPU {cpu:.2f} vs {base_cpu:.2f} s ({cpu / base_cpu:.2f}x); peak memory {peak / 2**20:.0f} MiB at "
          f"{count} inputs, {small_peak / 2**20:.0f} MiB at {max(count // 10, 2)}; rounds (sweep/floor wall): "
          f"{', '.join(f'{s[0]:.2f}/{f[0]:.2f}' for s, f in zip(sweeps, floors))}; load average before "
          f"{before:.2f}, after {os.getloadavg()[0]:.2f} (the wall ratio means something only on an idle machine)")


def bench_view(count: int, rounds: int) -> None:
    labels = [f"img{i:04d}.png" for i in range(count)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = _dataset_folder(Path(tmp) / "runs", labels, failing={l for i, l in enumerate(labels) if i % 29 == 7})
        start = time.perf_counter()
        analysis = analyze_paths([folder])
        whole = time.perf_counter() - start
        try:
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                dataset_view(analysis.comparison, analysis.summary, analysis.findings)
                repeat_spread_per_op(analysis.comparison)
                times.append(time.perf_counter() - start)
        finally:
            analysis.close()
    share = statistics.median(times) / whole
    print(f"{count} inputs: analysis {whole:.2f} s, data-set view {statistics.median(times):.3f} s "
          f"({share:.1%} of the analysis; goal <= 5%)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--view", action="store_true", help="time the data-set view instead of the collection")
    parser.add_argument("--collect", action="store_true", help="time a sweep against its engine floor (default)")
    parser.add_argument("--inputs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.view:
        bench_view(args.inputs, args.rounds)
    else:
        bench_collect(args.inputs, args.rounds)


if __name__ == "__main__":
    main()
