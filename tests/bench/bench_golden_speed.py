"""Benchmark: a golden analysis of a real detector at a large input.

Run by hand:  python tests/bench/bench_golden_speed.py [--size 608x800] [--dir /tmp/golden-bench] [--keep]

PP-OCRv4 det (the biggest real model the corpus wheels ship, H/W dynamic) at 608x800 (HxW): copied
out of the rapidocr-onnxruntime wheel, converted with MNN's converter (through its `_tools` module)
and with pnnx for ncnn (tests/corpus.py), collected on ONNX Runtime (the golden), MNN and ncnn cpu/high
on the local device, then `analyze DIR --ref golden.h5 --json` in a child process. Printed: the layer
count of each run, the collection times, and the analyze command's wall and CPU seconds (target < 120 s
wall on the host). `--dir` keeps the converted models and runs between invocations (collection
is skipped when the runs exist), so only the analysis is re-timed.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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
    parser.add_argument("--dir", type=Path, default=Path("/tmp/layerdiff-golden-bench"))
    args = parser.parse_args()
    height, width = (int(v) for v in args.size.split("x"))
    workdir = args.dir / f"{height}x{width}"
    runs = collect(workdir, height, width)
    for engine, path in sorted(runs.items()):
        print(f"{engine}: {layer_count(path)} layers ({path.stat().st_size / 2**20:.0f} MiB)")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", str(workdir / "runs"),
                           "--ref", str(runs["onnxruntime"]), "-o", str(workdir / "report"), "--json"],
                          capture_output=True, text=True, env=_no_cache_env(workdir))
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 2):
        print(proc.stderr[-2000:])
        return 1
    _print_alignment(workdir / "report" / "results.json")
    print(f"analyze (golden vs MNN + ncnn, {args.size}): wall {wall:.1f} s, CPU {cpu:.1f} s "
          f"(target < 120 s wall): {'OK' if wall < 120 else 'SLOW'}")
    return 0


def _no_cache_env(workdir: Path) -> dict:
    """A fresh result cache for every invocation, so each is a full analysis."""
    import os
    import shutil

    cache = workdir / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    return {**os.environ, "LAYERDIFF_CACHE_DIR": str(cache)}


def _print_alignment(results: Path) -> None:
    """Matched layers per run, from the report's results.json (when it says)."""
    try:
        doc = json.loads(results.read_text())
    except (OSError, json.JSONDecodeError):
        return
    for run in doc.get("runs", []):
        if isinstance(run, dict) and "matched" in run:
            print(f"{run.get('label', run.get('run'))}: {run['matched']} matched layers")


if __name__ == "__main__":
    sys.exit(main())
