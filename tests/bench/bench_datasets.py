"""Benchmark: the data-set view of a large sweep, against the analysis it is part of.

One cpu/high and one opencl/low run on each of N inputs (written with the project's dump writer,
tests/analyze_dumps.py's graph; every 29th input fails), analyzed once; then the data-set view
(findings/datasets.py) and the per-op repeat numbers (measure/repeats.py) are built again from that
analysis, each timed over a few rounds. The figure printed is the view's median time as a share of
the whole analysis. Goal: <= 5%.

    python -m tests.bench.bench_datasets [--inputs 200] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.findings.datasets import dataset_view
from layerdiff.analyzer.measure.repeats import repeat_spread_per_op
from tests.test_datasets import _dataset_folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inputs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    labels = [f"img{i:04d}.png" for i in range(args.inputs)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = _dataset_folder(Path(tmp) / "runs", labels, failing={l for i, l in enumerate(labels) if i % 29 == 7})
        start = time.perf_counter()
        analysis = analyze_paths([folder])
        whole = time.perf_counter() - start
        try:
            times = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                dataset_view(analysis.comparison, analysis.summary, analysis.findings)
                repeat_spread_per_op(analysis.comparison)
                times.append(time.perf_counter() - start)
        finally:
            analysis.close()
    share = statistics.median(times) / whole
    print(f"{args.inputs} inputs: analysis {whole:.2f} s, data-set view {statistics.median(times):.3f} s "
          f"({share:.1%} of the analysis; goal <= 5%)")


if __name__ == "__main__":
    main()
