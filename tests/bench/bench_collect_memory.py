"""Benchmark: peak memory of `collect` on the local device (<= 2 x largest layer + 300 MB; and
<= the engine's own plain-inference peak + 2 x largest layer + 100 MB, both printed).

    python tests/bench/bench_collect_memory.py [--model conv|ocr_det] [--size 512] [--layers 24]
        [--engine ncnn|mnn|onnxruntime] [--backend cpu|vulkan] [--precision high|normal|low]

`--model conv` (default): a conv+ReLU stack with big activations (tests/bench/bench_harness_dump.py's
model: 32 channels at `size` x `size`, so a dump of `layers` x 32 x size^2 x 4 bytes). `--model
ocr_det`: the PP-OCRv4 text detector of the test corpus (tests/corpus.py) at `size` x `size`, fed a
rendered page of text (pnnx for ncnn, MNN's converter for MNN, the ONNX itself for onnxruntime); at
640 this is the issue's case (a 563 MB ncnn dump). `--engine mnn` converts the conv model's ONNX twin
first; `--engine onnxruntime` runs it.

The model is collected with `python -m layerdiff.collector.cli`, and the resident memory of the whole process
tree (collect, the host engine it starts) is sampled every 20 ms from /proc. Printed: dump size,
largest layer, the peak of the tree, the peak of the largest single process (getrusage), the ratio
of the tree's peak to the goal, and the engine's own floor: the peak of one plain inference with the
same loader and options and no dump (tests/bench/engine_floor.py), with what collect adds over it.
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
from layerdiff.analyzer.formats.dumpfile import DumpFile  # noqa: E402
from tests.bench.bench_harness_dump import write_model  # noqa: E402

MB = 1 << 20


def _status_kb(status: str, field: str) -> int:
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith(field))


def tree_rss(root: int) -> tuple[int, int]:
    """(resident bytes of `root` and all its descendants, the largest VmHWM among them), from /proc."""
    total, largest, pending = 0, 0, [root]
    while pending:
        pid = pending.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            total += _status_kb(status, "VmRSS:")
            largest = max(largest, _status_kb(status, "VmHWM:"))
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total, largest


def collect_peak(argv: list[str]) -> tuple[int, int, float]:
    """(peak RSS of the process tree, peak RSS of its largest process, seconds) for one command.

    The largest process's peak is its own high-water mark (VmHWM) as last sampled, so only the
    command's processes count (not converters the benchmark ran before it)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0, 0]

    def sample() -> None:
        while proc.poll() is None:
            total, largest = tree_rss(proc.pid)
            peak[:] = max(peak[0], total), max(peak[1], largest)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"collect failed ({proc.returncode}): {stderr.strip()[-600:]}")
    return peak[0], peak[1], time.monotonic() - start


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


def conv_model(folder: Path, engine: str, size: int, layers: int) -> tuple[Path, Path]:
    """The conv stack for `engine` and its input as an .npz."""
    import numpy as np

    param, _, data = write_model(folder, size, layers)
    inputs = folder / "bench_in.npz"
    np.savez(inputs, data=np.load(data))
    if engine == "ncnn":
        return param, inputs
    model = onnx_twin(param, size, layers)
    if engine == "mnn":
        from layerdiff.samples.onnx_emit import convert_onnx_to_mnn

        convert_onnx_to_mnn(model, folder / "bench.mnn")
        model = folder / "bench.mnn"
    return model, inputs


def ocr_det_model(folder: Path, engine: str, size: int) -> tuple[Path, Path]:
    """The corpus's PP-OCR detector converted for `engine` at size x size, and a page of text as input."""
    import numpy as np

    from tests.corpus import MODELS, _nchw, convert_with_pnnx, text_image, wheel_file

    det = next(m for m in MODELS if m.stem == "ocr_det")
    onnx_path = folder / "det.onnx"
    onnx_path.write_bytes(wheel_file(det).read_bytes())
    page = np.concatenate([text_image(size // 8, size, f"layerdiff line {i}") for i in range(8)])
    x = _nchw(page, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    inputs = folder / f"det_in_{engine}.npz"
    np.savez(inputs, **{"in0" if engine == "ncnn" else "x": x})
    if engine == "ncnn":
        return convert_with_pnnx(onnx_path, f"[1,3,{size},{size}]f32", folder), inputs
    if engine == "mnn":
        from layerdiff.samples.onnx_emit import convert_onnx_to_mnn

        convert_onnx_to_mnn(onnx_path, folder / "det.mnn")
        return folder / "det.mnn", inputs
    return onnx_path, inputs


def engine_floor(engine: str, model: Path, inputs: Path, backend: str, precision: str) -> int:
    """Peak RSS of one plain inference in the engine's own process (no dump), in bytes."""
    from layerdiff.collector.transport.devices import HOST_ENGINE_ENV

    script = Path(__file__).with_name("engine_floor.py")
    proc = subprocess.run([sys.executable, str(script), engine, str(model), str(inputs), backend, precision],
                          capture_output=True, text=True, env={**os.environ, **HOST_ENGINE_ENV})
    if proc.returncode != 0:
        raise SystemExit(f"plain inference failed: {proc.stderr.strip()[-600:]}")
    return int(proc.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="conv", choices=["conv", "ocr_det"])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--engine", default="ncnn", choices=["ncnn", "mnn", "onnxruntime"])
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--precision", default="high")
    args = parser.parse_args()
    env_root = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = env_root + os.pathsep + os.environ.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="bench-collect-memory-") as tmp:
        folder = Path(tmp)
        if args.model == "conv":
            model, inputs = conv_model(folder, args.engine, args.size, args.layers)
        else:
            model, inputs = ocr_det_model(folder, args.engine, args.size)
        argv = [sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model", str(model), "--input", str(inputs),
                "--backend", args.backend, "--precision", args.precision, "--out", str(folder / "runs"), "--no-report"]
        tree, largest_process, seconds = collect_peak(argv)
        h5 = next((folder / "runs").glob("*.h5"))
        with DumpFile(h5) as dump:
            sizes = [int(dump.tensor(row.order).nbytes) for row in dump.layers.itertuples()]
        floor = engine_floor(args.engine, model, inputs, args.backend, args.precision)
        goal = 2 * max(sizes) + 300 * MB
        name = f"{args.model} {args.size}x{args.size}" + (f" x{args.layers}" if args.model == "conv" else "")
        print(f"{args.engine}/{args.backend}/{args.precision} {name}: dump {sum(sizes) / MB:.0f} MB in {len(sizes)} "
              f"layers, largest layer {max(sizes) / MB:.0f} MB, {seconds:.1f} s")
        print(f"peak RSS: process tree {tree / MB:.0f} MB, largest single process {largest_process / MB:.0f} MB; "
              f"goal 2 x layer + 300 MB = {goal / MB:.0f} MB; ratio {tree / goal:.2f} (<= 1 meets it)")
        print(f"engine floor (one plain inference, no dump): {floor / MB:.0f} MB; the engine process adds "
              f"{(largest_process - floor) / MB:.0f} MB over it (2 x largest layer = {2 * max(sizes) / MB:.0f} MB)")
        # the bound counts what layerdiff adds: a software GPU's device memory is the engine's, not ours
        bound = floor + 2 * max(sizes) + 100 * MB
        print(f"the bound: engine floor + 2 x largest layer + 100 MB = {bound / MB:.0f} MB; process tree "
              f"{tree / MB:.0f} MB -> {'met' if tree <= bound else 'NOT MET'} ({tree / bound:.2f})")


if __name__ == "__main__":
    main()
