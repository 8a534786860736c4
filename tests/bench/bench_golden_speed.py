"""Benchmark: a golden analysis of a real detector (ONNX Runtime vs MNN and ncnn) against its floors.

Run by hand:  python tests/bench/bench_golden_speed.py [--size 608x800] [--rounds 3] [--dir /tmp/golden-bench]
                  [--parts fresh rejudge]

PP-OCRv4 det (the biggest real model the corpus wheels ship, H/W dynamic) at HxW: copied out of the
rapidocr-onnxruntime wheel, converted with MNN's converter (through its `_tools` module) and with pnnx
for ncnn (tests/corpus.py), collected on ONNX Runtime (the golden), MNN and ncnn cpu/high on the local
device. `--dir` keeps the converted models and runs between invocations (collection is skipped when
the runs exist). 608x800 makes ~2 GB of dumps, 416x544 ~0.9 GB.

Printed, each beside its floor (method: tests/bench/measure.py, child processes alternated with their
floor after a warm-up, CPU time, median of the per-round ratios; floors: tests/bench/analyze_floors.py):
- a fresh `analyze DIR --ref golden.h5` (its result cache emptied every round) against the tight floor:
  the layer pairs the analysis matched, read with numpy + h5py into reused buffers, each reference
  tensor once, and max |diff| + relative L2 per pair. Target 1.5x wherever that floor is >= 2 s CPU.
- `analyze` again, a threshold change (`--warn-rel-l2`, a new value every round) and a task change
  (`--task text-det:thresh=X`, a new X every round) against reading the stored measurement into
  DataFrames. Target 1.3x.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.analyze_floors import (fresh_line, pairs_floor_runner, pairs_plan, rejudge_lines,  # noqa: E402
                                        stored_floor_runner)
from tests.bench.measure import MiB, alternate, child_env, python, run_child  # noqa: E402
from tests.corpus import MODELS, convert_corpus, det_page  # noqa: E402


def collect(workdir: Path, height: int, width: int) -> dict[str, Path]:
    """The three runs of PP-OCR det at height x width (reused when already on disk)."""
    import dataclasses

    import numpy as np

    from layerdiff.collector.inputs.inputset import resolve_inputs
    from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
    from layerdiff.collector.run.pipeline import RunSpec, collect_run
    from layerdiff.collector.transport.devices import LocalDevice

    runs = workdir / "runs"
    found = {p.name.split("_")[0]: p for p in runs.glob("*.h5")} if runs.is_dir() else {}
    if len(found) == 3:
        return found
    det = dataclasses.replace(next(m for m in MODELS if m.stem == "ocr_det"), pnnx_shapes=f"[1,3,{height},{width}]f32")
    start = time.monotonic()
    converted = convert_corpus(workdir / "models", (det,))["ocr_det"]
    print(f"conversion: {time.monotonic() - start:.1f} s", flush=True)
    lines = max(1, height // 64)
    page = det_page(max(height, width), lines)[:, :, :height, :width]
    np.savez(converted.inputs, x=np.ascontiguousarray(page))
    np.savez(converted.ncnn_inputs, in0=np.ascontiguousarray(page))
    device = LocalDevice()
    for engine, model_file in (("onnxruntime", converted.onnx), ("mnn", converted.mnn), ("ncnn", converted.ncnn)):
        model = resolve_model(model_file)
        inputs = converted.ncnn_inputs if engine == "ncnn" else converted.inputs
        sets, errors = resolve_inputs([str(inputs)], input_shapes(model))
        assert not errors, errors
        sets[0].label = "page"
        start = time.monotonic()
        outcome = collect_run(device, RunSpec(model, "cpu", "high", sets[0]), runs)
        assert outcome.status in ("done", "skipped"), f"{engine}: {outcome.message}"
        print(f"collect {engine}: {time.monotonic() - start:.1f} s", flush=True)
        found[engine] = outcome.paths[0]
    return found


def layer_count(path: Path) -> int:
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    with DumpFile(path) as dump:
        return len(dump.layers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="608x800", help="HxW of the detector's input")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/layerdiff-golden-bench"))
    parser.add_argument("--parts", nargs="+", choices=("fresh", "rejudge"), default=["fresh", "rejudge"],
                        help="a fresh analysis vs its tight floor; again / threshold / task change vs the stored measurement")
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    workdir = args.dir / f"{height}x{width}"
    runs = collect(workdir, height, width)
    total = sum(path.stat().st_size for path in runs.values())
    for engine, path in sorted(runs.items()):
        print(f"{engine}: {layer_count(path)} layers ({path.stat().st_size / MiB:.0f} MiB)")
    name = f"detector {args.size}, {total / MiB:.0f} MiB"
    cache, report = workdir / "cache", workdir / "report"
    env = child_env()
    env["LAYERDIFF_CACHE_DIR"] = str(cache)
    counter = iter(range(10**6))

    def analyze(*options: str, fresh: bool = False):
        if fresh:
            shutil.rmtree(cache, ignore_errors=True)
        out = workdir / f"report-{next(counter)}"
        usage = run_child(python("-m", "layerdiff.analyzer.cli.app", str(workdir / "runs"),
                                 "--ref", str(runs["onnxruntime"]), "-o", str(out), *options), env=env)
        shutil.rmtree(out, ignore_errors=True)
        return usage

    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(report, ignore_errors=True)
    start = time.monotonic()
    first = run_child(python("-m", "layerdiff.analyzer.cli.app", str(workdir / "runs"), "--ref",
                             str(runs["onnxruntime"]), "-o", str(report)), env=env)
    print(f"[{name}] first analyze: {first.cpu:.2f} s CPU, {time.monotonic() - start:.1f} s wall, "
          f"peak {first.peak_rss / MiB:.0f} MiB")
    _print_alignment(report / "results.json")
    if "fresh" in args.parts:
        plan = pairs_plan(cache, report, workdir / "pairs.json")
        fresh = alternate(pairs_floor_runner(workdir, plan, env), lambda: analyze(fresh=True), args.rounds)
        print(fresh_line(name, "tight floor (matched pairs, reused buffers)", fresh.median("floor"),
                         fresh.median("command"), fresh.ratio(), None)
              + f"; peak {fresh.peak('command') / MiB:.0f} MiB vs the floor's {fresh.peak('floor') / MiB:.0f} MiB",
              flush=True)
    if "rejudge" not in args.parts:
        return 0
    analyze(fresh=True)  # one stored measurement and nothing else in the cache for the floor to read
    tasks = (f"text-det:thresh={0.3 + k * 1e-4:.4f}" for k in range(10**6))
    rejudge_lines(name, analyze, stored_floor_runner(workdir, cache, env), args.rounds, tasks)
    return 0


def _print_alignment(results: Path) -> None:
    """Matched layers per run, from the report's results.json (when it says)."""
    try:
        doc = json.loads(results.read_text())
    except (OSError, json.JSONDecodeError):
        return
    for run in doc.get("runs", []):
        if isinstance(run, dict) and "summary" in run and run.get("role") == "compared":
            print(f"{run.get('run')}: {run['summary'].get('layers_compared')} layers compared")


if __name__ == "__main__":
    sys.exit(main())
