"""Benchmark: raw dump → HDF5 conversion throughput vs plain file writes of the same bytes.

Run by hand:  python tests/bench/bench_convert.py [--mb 600] [--dir /tmp]
Method: conversion and plain copy alternate (plain, convert, plain, convert, ...), each in a fresh
child after an `os.sync()`, timed by wall clock inside the child (both wait for the disk); each
round gives one ratio plain_time / convert_time and the figure printed is the median of those
ratios (see tests/bench/measure.py). Goal: >= 0.9.
Prints the throughput ratio and the conversion's peak RSS against the largest tensor
(goal: bounded by the largest tensor, not the dump). Each measurement runs in a fresh child process
so peak RSS is the conversion's own, and both sides end with fsync so both reach the disk
(`--no-fsync` compares page-cache speed instead, the harder target on a fast disk).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from layerdiff.analyzer.formats.rawdump import RawDumpWriter  # noqa: E402


def make_dump(path: Path, total_mb: int) -> int:
    """A realistic mix: many small/medium feature maps and a few large ones; returns largest bytes."""
    rng = np.random.default_rng(0)
    writer = RawDumpWriter(path, {"engine": "synthetic", "backend_requested": "cpu", "backends_actual": ["cpu"]})
    shapes = [(1, 64, 112, 112), (1, 128, 56, 56), (1, 256, 28, 28), (1, 32, 224, 224), (1, 1000)]
    written, largest, i = 0, 0, 0
    while written < total_mb << 20:
        shape = shapes[i % len(shapes)]
        array = rng.standard_normal(shape, dtype=np.float32)
        if i % 7 == 0:
            array[0, :3] = np.nan
        writer.add(op=f"block{i // 5}/op{i}", op_type="Convolution", array=array)
        written += array.nbytes
        largest = max(largest, array.nbytes)
        i += 1
    writer.close(infer_ms=1.0)
    return largest


CHILD_CONVERT = """
import resource, sys, time, os
sys.path.insert(0, {repo!r})
from layerdiff.analyzer.formats.rawdump import convert_raw_dump
start = time.perf_counter()
out = convert_raw_dump({raw!r}, {out!r})
if {fsync}:
    fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

CHILD_PLAIN = """
import resource, sys, time, os
start = time.perf_counter()
with open({raw!r} + "/tensors.bin", "rb") as src, open({out!r}, "wb") as dst:
    while block := src.read(64 << 20):
        dst.write(block)
    dst.flush()
    if {fsync}: os.fsync(dst.fileno())
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

CHILD_BASELINE = """
import resource, sys
sys.path.insert(0, {repo!r})
import layerdiff.analyzer.formats.rawdump, h5py, numpy
print(0.0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def child(code: str, **fmt) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", code.format(repo=str(REPO), **fmt)], capture_output=True, text=True, check=True)
    seconds, rss = out.stdout.split()
    return float(seconds), int(rss)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=600)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-fsync", action="store_true", help="measure up to the page cache only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        raw = Path(tmp) / "raw"
        largest = make_dump(raw, args.mb)
        size = (raw / "tensors.bin").stat().st_size
        subprocess.run(["cat", str(raw / "tensors.bin")], stdout=subprocess.DEVNULL, check=True)  # warm the cache
        plain, convert = [], []
        for _ in range(args.rounds):  # alternate, each after a sync, so neither inherits the other's dirty pages
            os.sync()
            plain.append(child(CHILD_PLAIN, raw=str(raw), out=str(Path(tmp) / "plain.bin"), fsync=not args.no_fsync))
            os.remove(Path(tmp) / "plain.bin")
            os.sync()
            convert.append(child(CHILD_CONVERT, raw=str(raw), out=str(Path(tmp) / "run.h5"), fsync=not args.no_fsync))
            os.remove(Path(tmp) / "run.h5")
        plain_s = statistics.median(p[0] for p in plain)
        convert_s = statistics.median(c[0] for c in convert)
        ratio = statistics.median(p[0] / c[0] for p, c in zip(plain, convert))
        convert_rss = max(c[1] for c in convert)
        _, base_rss = child(CHILD_BASELINE)
    mb = size / 2**20
    result = {
        "dump_MB": round(mb, 1),
        "to_disk": not args.no_fsync,
        "plain_write_MBps": round(mb / plain_s, 1),
        "convert_MBps": round(mb / convert_s, 1),
        "ratio_convert_over_plain": round(ratio, 3),
        "goal": ">= 0.9",
        "met": ratio >= 0.9,
        "largest_tensor_MB": round(largest / 2**20, 1),
        "peak_rss_MB": round(convert_rss / 2**20, 1),
        "rss_over_interpreter_MB": round((convert_rss - base_rss) / 2**20, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
