"""The engine's own peak memory for one plain inference (no per-layer dump), for bench_collect_memory.

    python tests/bench/engine_floor.py ENGINE MODEL INPUT.npz BACKEND PRECISION

Loads the model with the host engine's own loader and options (collector/engines/*), feeds the
inputs, computes only the model's outputs, and prints the process's peak RSS (VmHWM) in bytes. This
is the floor no dumping can go under: the interpreter, the engine library, its weights and its
working memory (e.g. ncnn's Vulkan buffers on lavapipe). Run by the benchmark with the same
environment as the `local` device's engines (layerdiff.collector.transport.devices.HOST_ENGINE_ENV).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from layerdiff.collector.engines.harness_cli import HarnessArgs  # noqa: E402


def plain_ncnn(args: HarnessArgs, inputs: dict[str, np.ndarray]) -> None:
    from layerdiff.collector.engines.ncnn import engine as ncnn_engine

    ncnn = ncnn_engine._ncnn()
    net, _ = ncnn_engine.load_net(args, ncnn)
    ex = net.create_extractor()
    ncnn_engine.feed(ex, net, inputs, ncnn)
    for name in net.output_names():
        status, _ = ex.extract(name)
        assert status == 0, f"ncnn failed computing {name}"


def plain_onnxruntime(args: HarnessArgs, inputs: dict[str, np.ndarray]) -> None:
    from layerdiff.collector.engines.ort import engine as ort_engine

    session = ort_engine.create_session(args.models[0].read_bytes(), args)
    session.run(None, ort_engine.feeds_for(session, inputs))


def plain_mnn(args: HarnessArgs, inputs: dict[str, np.ndarray]) -> None:
    from layerdiff.collector.engines.mnn import engine as mnn_engine

    MNN = mnn_engine.mnn_module()
    interpreter, session = mnn_engine.create_session(MNN, args)
    mnn_engine.feed(MNN, interpreter, session, inputs)
    interpreter.runSession(session)


def main() -> None:
    engine, model, data, backend, precision = sys.argv[1:6]
    models = [Path(model)] + ([Path(model).with_suffix(".bin")] if engine == "ncnn" else [])
    args = HarnessArgs(engine, models, {}, backend, precision, Path("."))
    with np.load(data) as npz:
        inputs = {name: npz[name] for name in npz.files}
    {"ncnn": plain_ncnn, "onnxruntime": plain_onnxruntime, "mnn": plain_mnn}[engine](args, inputs)
    status = Path("/proc/self/status").read_text()
    print(next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")))


if __name__ == "__main__":
    main()
