"""Benchmark: structural matching time against the number of layers (near-linear, not quadratic).

Run by hand:  python tests/bench/bench_align_scaling.py [--blocks 40 400] [--rounds 3]
              [--real GOLDEN.h5 NCNN.h5 --copies 1 5]

A renamed golden/ncnn pair of any length (tests/scaling.py: MobileNetV3-style blocks, 9 golden and 4
ncnn layers each, one tensor shape throughout, so every match is a choice values and edges settle)
is aligned with `align_layers` as `analyze` does (fp32 pair, value errors through
`layerdiff.analyzer.align.values`). Printed per size: layers, CPU seconds of the alignment alone
(median of --rounds, `time.process_time`: the machine is shared), value pairs asked, and the ratio
to the smallest size against the ratio of layers. Linear means the time ratio stays near the layer
ratio (the order-preserving DP is n x m numpy cells, a small constant at these sizes).
`--real` does the same with a real golden/ncnn pair (e.g. bench_golden_speed.py's PP-OCR det runs)
repeated `--copies` times as one longer model (tests/scaling.py `tiled`): the real graph's patterns
at ~1,500 layers, tensors read from the real dumps.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from layerdiff.analyzer.align.byname import NameRules, align_layers  # noqa: E402
from layerdiff.analyzer.align.values import ValueErrors  # noqa: E402
from tests.scaling import expected, renamed_pair, tiled  # noqa: E402


def measure(blocks: int, rounds: int) -> tuple[int, float, int, int]:
    golden, ncnn, golden_tensors, ncnn_tensors = renamed_pair(blocks)
    times, asked, right = [], 0, 0
    for _ in range(rounds):
        errors = ValueErrors(golden_tensors.__getitem__, ncnn_tensors.__getitem__)
        start = time.process_time()
        result = align_layers(golden, ncnn, NameRules(), errors, fp32=True)
        times.append(time.process_time() - start)
        asked = errors.pairs_asked
        got = dict(zip(result.matched["other_key"], result.matched["key"]))
        right = sum(got.get(k) == v for k, v in expected(golden, ncnn).items())
    return len(golden) + len(ncnn), statistics.median(times), asked, right


def measure_real(golden_path: Path, ncnn_path: Path, copies: int) -> tuple[int, float, int, int]:
    """(layers, CPU s, value pairs, matched) aligning the real pair repeated `copies` times."""
    from layerdiff.analyzer.formats.dumpfile import DumpFile

    with DumpFile(golden_path) as golden, DumpFile(ncnn_path) as ncnn:
        base, base_rows = tiled(golden.layers, copies)
        other, other_rows = tiled(ncnn.layers, copies)
        orders_a, orders_b = list(golden.layers["order"]), list(ncnn.layers["order"])
        errors = ValueErrors(lambda i: golden.tensor(int(orders_a[base_rows[i]])),
                             lambda j: ncnn.tensor(int(orders_b[other_rows[j]])))
        start = time.process_time()
        result = align_layers(base, other, NameRules(), errors, fp32=True)
        seconds = time.process_time() - start
    return len(base) + len(other), seconds, errors.pairs_asked, len(result.matched)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[40, 400])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--real", type=Path, nargs=2, metavar=("GOLDEN", "NCNN"))
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 5])
    args = parser.parse_args()
    first = None
    if args.real:
        for copies in args.copies:
            layers, seconds, asked, matched = measure_real(*args.real, copies)
            first = first or (layers, seconds)
            print(f"{copies:3d} copies: {layers:6d} layers, {seconds:6.2f} s CPU, {asked:6d} value pairs, {matched} "
                  f"matched; x{layers / first[0]:.0f} layers -> x{seconds / first[1]:.1f} time")
        return 0
    for blocks in args.blocks:
        layers, seconds, asked, right = measure(blocks, args.rounds)
        first = first or (layers, seconds)
        print(f"{blocks:5d} blocks: {layers:6d} layers, {seconds:6.2f} s CPU, {asked:6d} value pairs, "
              f"{right}/{blocks * 4 + 1} right; x{layers / first[0]:.0f} layers -> x{seconds / first[1]:.1f} time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
