"""Benchmark: the whole `analyze` command (report included) vs the floor, at three dump shapes.

Run by hand:  python tests/bench/bench_analyze.py [--case 2000x64 200x1MB 500x1MB 10000x64 20000x64 8x256MB 50000x64]
              [--rounds 3] [--dir /tmp] [--blas-threads 1] [--parts fresh rejudge stack]

Method (see tests/bench/measure.py):
- Two synthetic dumps (a cpu/high reference and a vulkan/low run = reference + 1e-3 noise; odd
  layers ReLU-like with half zeros) are written with the project's own `DumpWriter` into a
  temporary directory, removed at the end.
- command: `python -m layerdiff.analyzer.cli.app ref.h5 run.h5 -o REPORT` in a child process, the whole command:
  start-up, alignment, metrics, findings, tables, plots, HTML and results.json.
- floor: a child Python that imports numpy and h5py and reads each layer of both dumps once,
  computing max |run - ref| and the relative L2 error: the least any comparison tool must do.
- The analyzer's stored results (layerdiff.analyzer.measure.resultcache) go to a cache folder of the temporary
  directory (LAYERDIFF_CACHE_DIR) that is deleted before every measured run, so each round is a full
  analysis; one extra run at the end shows the cost of analyzing the same runs
  again (a sweep's own report followed by `analyze`), and its peak RSS against the same bound.
- Both are timed by CPU time (user + sys, from getrusage(RUSAGE_CHILDREN)) and peak RSS (the
  child's ru_maxrss from wait4), alternately after one warm-up each; the ratio printed is the
  median over rounds of command CPU / floor CPU.
- again: after one full analysis has stored its measurement, `analyze` of the same runs alternates
  with the floor of reading that stored table (tests/bench/analyze_floors.py STORED_FLOOR: the cache
  entries into DataFrames).
- a threshold change: `analyze --warn-rel-l2 X` and a task change `analyze --task text-det:thresh=X` (a
  new X every round, so no finished report is reused) alternate with the same floor: the stored
  measurement is re-judged, no tensor read; each is also shown against `analyze again`.
- stack imports: `import numpy, h5py` alternates with `import numpy, h5py, pandas`; the difference is
  what pandas' import alone costs on the host now, and the line shows what analyze's ratio would be
  without it (an estimate from medians of separate alternations): the share of the gap that belongs
  to the declared stack's table library rather than to layerdiff's own work (the 200 x 1 MB case).
Targets: a fresh analysis at most 1.5x its floor wherever that floor is at least 2 s of CPU (8 x 256 MB),
else CPU ratio <= 2 at 2,000 x 64 floats, 200 x 1 MB and 500 x 1 MB (<= 3 at 10,000 x 64); again, a
threshold change and a task change <= 1.3x the stored-table floor (500 x 1 MB: the ~1 GB set); peak RSS
<= 2 x the largest layer + 300 MB in every case. 50,000 x 64 must run and stay in the RSS bound.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from layerdiff.analyzer.formats.dumpfile import DumpWriter  # noqa: E402
from tests.bench.analyze_floors import fresh_line, rejudge_lines, stored_floor_runner  # noqa: E402
from tests.bench.measure import MiB, alternate, child_env, python, run_child, verdict  # noqa: E402

# name -> (layers, float32 elements per layer, CPU ratio target or None for "must run")
CASES = {
    "2000x64": (2_000, 64, 2.0),
    "200x1MB": (200, 1 << 18, 2.0),
    "500x1MB": (500, 1 << 18, 2.0),  # ~1 GB of dumps: where a threshold or task change is held to 1.3x
    "10000x64": (10_000, 64, 3.0),
    "20000x64": (20_000, 64, 3.0),  # with 2000x64: how the whole command scales with 10x the layers
    "8x256MB": (8, 1 << 26, 2.0),
    "50000x64": (50_000, 64, None),
}

FLOOR = """
import os, sys
import h5py, numpy as np
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    ta, tb = a["tensors"], b["tensors"]
    worst = 0.0
    for name in ta:
        x = ta[name][()]
        y = tb[name][()]
        d = y - x
        max_abs = float(np.abs(d).max())
        rel_l2 = float(np.linalg.norm(d) / max(float(np.linalg.norm(x)), 1e-30))
        worst = max(worst, rel_l2)
print(worst, flush=True)
os._exit(0)  # analyze ends without the interpreter's teardown (layerdiff/console.py): so does the floor
"""

# For big layers the floor must not pay for whole-tensor copies: the tight floor reads each layer in
# 16 MB pieces into buffers it reuses (h5py read_direct) and keeps the same two numbers.
TIGHT_FLOOR = """
import os, sys
import h5py, numpy as np
CHUNK = 1 << 22
bx, by, d = (np.empty(CHUNK, np.float32) for _ in range(3))
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    ta, tb = a["tensors"], b["tensors"]
    worst = 0.0
    for name in ta:
        x, y = ta[name], tb[name]
        dd = xx = 0.0
        max_abs = 0.0
        for start in range(0, x.shape[0], CHUNK):
            n = min(CHUNK, x.shape[0] - start)
            x.read_direct(bx, np.s_[start:start + n], np.s_[0:n])
            y.read_direct(by, np.s_[start:start + n], np.s_[0:n])
            np.subtract(by[:n], bx[:n], out=d[:n])
            dd += float(np.dot(d[:n], d[:n]))
            xx += float(np.dot(bx[:n], bx[:n]))
            max_abs = max(max_abs, float(np.abs(d[:n], out=d[:n]).max()))
        worst = max(worst, (dd ** 0.5) / max(xx ** 0.5, 1e-30))
print(worst, flush=True)
os._exit(0)  # analyze ends without the interpreter's teardown (layerdiff/console.py): so does the floor
"""
TIGHT_FROM = 1 << 24  # elements per layer from which the tight floor is the one to beat


def make_dumps(folder: Path, layers: int, numel: int) -> tuple[Path, Path]:
    """Two dumps of `layers` float32 layers of `numel` elements, a chain, written by DumpWriter."""
    rng = np.random.default_rng(0)
    paths = (folder / "ref.h5", folder / "run.h5")
    writers = [DumpWriter(paths[0], {"engine": "ncnn", "backend_requested": "cpu", "precision_requested": "high"}),
               DumpWriter(paths[1], {"engine": "ncnn", "backend_requested": "vulkan", "precision_requested": "low"})]
    previous = "data"
    for i in range(layers):
        ref = rng.standard_normal(numel, dtype=np.float32)
        if i % 2:
            np.maximum(ref, 0, out=ref)
        run = rng.standard_normal(numel, dtype=np.float32)
        run *= np.float32(1e-3)
        run += ref
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
    return paths


def bench_case(name: str, rounds: int, folder: Path, blas_threads: int | None = None,
               parts: tuple[str, ...] = ("fresh", "rejudge", "stack")) -> dict:
    layers, numel, target = CASES[name]
    t0 = time.perf_counter()
    ref, run = make_dumps(folder, layers, numel)
    print(f"[{name}] dumps written in {time.perf_counter() - t0:.1f} s "
          f"({(ref.stat().st_size + run.stat().st_size) / MiB:.0f} MiB)", flush=True)
    env = child_env()
    if blas_threads:  # both children: OpenBLAS's idle workers spin (sched_yield) after each threaded dot,
        env["OPENBLAS_NUM_THREADS"] = str(blas_threads)  # CPU time no comparison needs (the tightest floor)
    env["LAYERDIFF_CACHE_DIR"] = str(folder / "cache")  # the stored results (layerdiff.analyzer.measure.resultcache) live here
    floor_script = folder / "floor.py"
    floor_script.write_text(TIGHT_FLOOR if numel >= TIGHT_FROM else FLOOR)
    floor_name = "tight floor (16 MB reused buffers)" if numel >= TIGHT_FROM else "floor (h5py + numpy, whole layers)"
    counter = iter(range(10**6))
    measured_rounds = rounds if target is not None else 1

    def analyze(keep_cache: bool = False, *options: str):
        if not keep_cache:  # every measured round analyzes from scratch (layerdiff.analyzer.measure.resultcache)
            shutil.rmtree(folder / "cache", ignore_errors=True)
        out = folder / f"report{next(counter)}"
        usage = run_child(python("-m", "layerdiff.analyzer.cli.app", str(ref), str(run), "-o", str(out), *options), env=env)
        shutil.rmtree(out, ignore_errors=True)
        return usage

    def floor():
        return run_child(python(str(floor_script), str(ref), str(run)), env=env)

    largest = numel * 4
    rss_goal = 2 * largest + 300 * MiB
    outcome = {"case": name, "rss_goal": rss_goal}
    if "fresh" in parts:
        result = alternate(floor, analyze, measured_rounds, warmup=target is not None)
        ratio = result.ratio("cpu")
        peak = result.peak("command")
        lines = [
            f"[{name}] {floor_name}: {result.median('floor'):.2f} s CPU, peak {result.peak('floor') / MiB:.0f} MiB",
            f"[{name}] analyze: {result.median('command'):.2f} s CPU ({result.median('command', 'wall'):.2f} s wall), "
            f"peak {peak / MiB:.0f} MiB",
            fresh_line(name, floor_name, result.median("floor"), result.median("command"), ratio, target)
            + f" (median of {len(result.floor)} alternating rounds)",
            f"[{name}] peak RSS {peak / MiB:.0f} MiB (target <= 2 x {largest / MiB:.3g} MiB + 300 MiB = "
            f"{rss_goal / MiB:.0f} MiB) -> {verdict(peak <= rss_goal)}",
        ]
        print("\n".join(lines), flush=True)
        outcome.update(ratio=ratio, peak=peak, cpu=result.median("command"))
        if "stack" in parts:
            print(stack_import_line(name, result, measured_rounds, env), flush=True)
    if "rejudge" in parts:
        analyze(keep_cache=False)  # one full analysis stores the measurement; then re-analyses alternate with the floor
        tasks = (f"text-det:thresh={0.3 + k * 1e-4:.4f}" for k in range(10**6))
        rejudge_lines(name, lambda *options: analyze(True, *options), stored_floor_runner(folder, folder / "cache", env),
                      measured_rounds, tasks, warmup=target is not None)
    return outcome


def stack_import_line(name: str, result, rounds: int, env: dict) -> str:
    """What `import pandas` costs after numpy and h5py, and analyze's ratio without that cost (estimate)."""
    plain = alternate(lambda: run_child(python("-c", "import numpy, h5py"), env=env),
                      lambda: run_child(python("-c", "import numpy, h5py, pandas"), env=env), rounds)
    pandas_cpu = plain.median("command") - plain.median("floor")
    floor_cpu, command_cpu = result.median("floor"), result.median("command")
    return (f"[{name}] stack imports: `import numpy, h5py` {plain.median('floor'):.2f} s CPU, pandas' import on top "
            f"{pandas_cpu:.2f} s ({pandas_cpu / floor_cpu:.0%} of the floor); analyze without it "
            f"~{(command_cpu - pandas_cpu) / floor_cpu:.2f}x the floor (estimate from the medians)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", choices=list(CASES), default=["2000x64", "200x1MB", "500x1MB", "8x256MB"])
    parser.add_argument("--parts", nargs="+", choices=("fresh", "rejudge", "stack"), default=["fresh", "rejudge", "stack"],
                        help="fresh analysis vs its floor; again / threshold / task change vs the stored table; "
                             "what importing pandas costs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary dumps go (removed after)")
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="OPENBLAS_NUM_THREADS for floor and command alike (1: the tightest floor; default: as set)")
    args = parser.parse_args()
    outcomes = {}
    for name in args.case:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="layerdiff-bench-") as tmp:
            outcomes[name] = bench_case(name, args.rounds, Path(tmp), args.blas_threads, tuple(args.parts))
    small, large = outcomes.get("2000x64", {}), outcomes.get("20000x64", {})
    if "cpu" in small and "cpu" in large:
        print(f"[scaling] 10x the layers (2,000 -> 20,000 x 64 floats): {large['cpu'] / small['cpu']:.1f}x the CPU "
              f"({small['cpu']:.2f} -> {large['cpu']:.2f} s), peak RSS {small['peak'] / MiB:.0f} -> "
              f"{large['peak'] / MiB:.0f} MiB (target: at most ~10x, linear)", flush=True)


if __name__ == "__main__":
    main()
