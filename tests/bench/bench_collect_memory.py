"""Benchmark: peak memory of `collect` on the local device (issue 15; goal <= 2 x largest layer + 300 MB).

    python tests/bench/bench_collect_memory.py [--size 512] [--layers 24] [--engine ncnn] [--backend cpu|vulkan]

A conv+ReLU stack with big activations (tests/bench/bench_harness_dump.py's model: 32 channels at
`size` x `size`, so a dump of `layers` x 32 x size^2 x 4 bytes) is collected with
`python -m collector.cli`, and the resident memory of the whole process tree (collect, the host
engine it starts) is sampled every 20 ms from /proc. Printed: dump size, largest layer, the peak of
the tree, the peak of the largest single process (getrusage), and the ratio of the tree's peak to
the goal. `--engine mnn` converts the model's ONNX twin first; `--engine onnxruntime` runs it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from analyzer.dumpfile import DumpFile  # noqa: E402
from tests.bench.bench_harness_dump import write_model  # noqa: E402

MB = 1 << 20


def tree_rss(root: int) -> int:
    """Resident bytes of `root` and all its descendants, read from /proc."""
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            total += next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def collect_peak(argv: list[str]) -> tuple[int, int, float]:
    """(peak RSS of the process tree, peak RSS of its largest process, seconds) for one command."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"collect failed ({proc.returncode}): {stderr.strip()[-600:]}")
    import resource

    largest_process = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return peak[0], largest_process, time.monotonic() - start


def onnx_twin(param: Path, size: int, layers: int) -> Path:
    """The same conv stack as ONNX (for the MNN and onnxruntime engines)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    raw = np.frombuffer(param.with_suffix(".bin").read_bytes(), dtype="<f4")
    nodes, inits, previous, channels_in, offset = [], [], "data", 3, 0
    for i in range(layers):
        count = 32 * channels_in * 9
        offset += 1  # the ncnn weight flag word
        weight = raw[offset : offset + count].reshape(32, channels_in, 3, 3)
        offset += count + 32
        inits += [numpy_helper.from_array(weight.copy(), f"w{i}"), numpy_helper.from_array(np.zeros(32, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [previous, f"w{i}", f"b{i}"], [f"conv{i}/c"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"conv{i}/c"], [f"conv{i}"])]
        previous, channels_in = f"conv{i}", 32
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info(previous, TensorProto.FLOAT, None)], inits)
    path = param.with_suffix(".onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--engine", default="ncnn", choices=["ncnn", "mnn", "onnxruntime"])
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-collect-memory-") as tmp:
        folder = Path(tmp)
        param, _, data = write_model(folder, args.size, args.layers)
        model = param
        if args.engine != "ncnn":
            model = onnx_twin(param, args.size, args.layers)
            if args.engine == "mnn":
                from samples.onnx_emit import convert_onnx_to_mnn

                convert_onnx_to_mnn(model, folder / "bench.mnn")
                model = folder / "bench.mnn"
        argv = [sys.executable, "-m", "collector.cli", "--device", "local", "--model", str(model), "--input", str(data),
                "--backend", args.backend, "--out", str(folder / "runs"), "--no-report"]
        env_root = str(Path(__file__).resolve().parents[2])
        os.environ["PYTHONPATH"] = env_root + os.pathsep + os.environ.get("PYTHONPATH", "")
        tree, largest_process, seconds = collect_peak(argv)
        h5 = next((folder / "runs").glob("*.h5"))
        with DumpFile(h5) as dump:
            sizes = [int(dump.tensor(row.order).nbytes) for row in dump.layers.itertuples()]
        goal = 2 * max(sizes) + 300 * MB
        print(f"{args.engine}/{args.backend} {args.size}x{args.size} x{args.layers}: dump {sum(sizes) / MB:.0f} MB, "
              f"largest layer {max(sizes) / MB:.0f} MB, {seconds:.1f} s")
        print(f"peak RSS: process tree {tree / MB:.0f} MB, largest single process {largest_process / MB:.0f} MB; "
              f"goal 2 x layer + 300 MB = {goal / MB:.0f} MB; ratio {tree / goal:.2f} (<= 1 meets it)")


if __name__ == "__main__":
    main()
