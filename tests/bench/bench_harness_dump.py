"""Benchmark: what dumping every layer costs the C++ harness (goal <= 1.5).

    python tests/bench/bench_harness_dump.py [--size 224] [--layers 12] [--repeat 5]

ratio = run time with the full dump / (run time without dump + time to write the same bytes)

The model is generated here (ncnn .param/.bin written with numpy: 3x3 convolutions + ReLU at
`size` x `size` with 32 channels), big enough that tensors, not process start-up, dominate.
"Without dump" runs the same binary with a layer filter matching nothing: all layers still run.
Times are the footers' `infer_ms` (model run plus dump writing), median over `repeat` runs.
Builds the host harness through layerdiff.collector.harness.build (cached) on first use.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from layerdiff.analyzer.formats.rawdump import read_raw_dump  # noqa: E402
from layerdiff.collector.engines.ncnn.harness import ncnn_spec  # noqa: E402
from layerdiff.collector.harness.build import ensure_built  # noqa: E402

CHANNELS = 32


def write_model(folder: Path, size: int, layers: int) -> tuple[Path, Path, Path]:
    """A plain conv+relu stack as ncnn files, and a random input for it."""
    rng = np.random.default_rng(0)
    lines = ["Input data 0 1 data 0=%d 1=%d 2=3" % (size, size)]
    blobs, weights, previous, channels_in = 1, [], "data", 3
    for i in range(layers):
        count = CHANNELS * channels_in * 9
        lines.append(f"Convolution conv{i} 1 1 {previous} conv{i} 0={CHANNELS} 1=3 4=1 5=1 6={count} 9=1")
        weights += [np.zeros(1, "<u4").tobytes(), (rng.standard_normal(count) * 0.1).astype("<f4").tobytes(),
                    np.zeros(CHANNELS, "<f4").tobytes()]
        previous, channels_in, blobs = f"conv{i}", CHANNELS, blobs + 1
    param = folder / "bench.param"
    param.write_text("7767517\n%d %d\n%s\n" % (len(lines), blobs, "\n".join(lines)))
    (folder / "bench.bin").write_bytes(b"".join(weights))
    np.save(folder / "bench.npy", rng.standard_normal((1, 3, size, size)).astype("<f4"))
    return param, folder / "bench.bin", folder / "bench.npy"


def run_times(binary: Path, files: tuple[Path, Path, Path], out: Path, repeat: int, *extra: str) -> tuple[float, int]:
    """Median infer_ms over `repeat` runs and the dump's byte count."""
    param, weights, data = files
    cmd = [str(binary), "--engine", "ncnn", "--model", str(param), "--model", str(weights), "--input",
           f"data={data}", "--backend", "cpu", "--precision", "high", "--repeat", str(repeat), "--out", str(out), *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dumps = [read_raw_dump(out / f"r{i}") for i in range(repeat)]
    return statistics.median(d.footer["infer_ms"] for d in dumps), dumps[0].footer["bytes"]


def write_time_ms(folder: Path, data: bytes, repeat: int) -> float:
    """Median time to write `data` (the dump's own tensors.bin bytes) to a new file and close it."""
    view = memoryview(data)
    times = []
    for i in range(repeat):
        target = folder / f"write{i}.bin"
        start = time.perf_counter()
        with open(target, "wb") as handle:
            for at in range(0, len(view), 1 << 20):
                handle.write(view[at:at + (1 << 20)])
        times.append((time.perf_counter() - start) * 1000)
        target.unlink()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    binary = ensure_built(ncnn_spec("host", vulkan=True, test_build=True))
    with tempfile.TemporaryDirectory(prefix="ld-bench-") as tmp:
        folder = Path(tmp)
        files = write_model(folder, args.size, args.layers)
        full_ms, nbytes = run_times(binary, files, folder / "full", args.repeat)
        bare_ms, _ = run_times(binary, files, folder / "bare", args.repeat, "--layers", "(?!)")
        write_ms = write_time_ms(folder, (folder / "full" / "r0" / "tensors.bin").read_bytes(), args.repeat)
    ratio = full_ms / (bare_ms + write_ms)
    print(f"model: {args.layers} conv3x3+relu layers, {CHANNELS}x{args.size}x{args.size}, cpu/high, 1 thread")
    print(f"dump bytes:              {nbytes / 2**20:9.1f} MiB")
    print(f"run with full dump:      {full_ms:9.1f} ms (median of {args.repeat})")
    print(f"run without dump:        {bare_ms:9.1f} ms")
    print(f"write same bytes:        {write_ms:9.1f} ms")
    print(f"dump overhead ratio:     {ratio:9.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
