"""Synthetic but real HDF5 dumps for the analyzer tests, written with the project's DumpWriter.

A small graph with the awkward names real engines produce (`/`, `:` and spaces) and real edges,
so each test can inject one known defect (an op that breaks, a NaN born at one layer, saturation at
65504, values flushed to zero) into a copy of the reference tensors and assert what the analyzer
says about it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from layerdiff.analyzer.formats.dumpfile import DumpWriter

# (op, op_type, input tensor names, shape); the tensor name of each op is the op name itself.
LAYERS = [
    ("conv1", "Convolution", ["data"], (1, 8, 6, 6)),
    ("relu1", "ReLU", ["conv1"], (1, 8, 6, 6)),
    ("block/conv 2", "Convolution", ["relu1"], (1, 8, 6, 6)),
    ("add:1", "BinaryOp", ["relu1", "block/conv 2"], (1, 8, 6, 6)),
    ("pool", "Pooling", ["add:1"], (1, 8, 3, 3)),
    ("fc", "InnerProduct", ["pool"], (1, 16)),
    ("prob", "Softmax", ["fc"], (1, 16)),
]
ORDER = [op for op, *_ in LAYERS]
DOWNSTREAM = {op: ORDER[i:] for i, op in enumerate(ORDER)}


def reference_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Plausible activations: positive after ReLU, a softmax that sums to 1, no zeros elsewhere."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for op, op_type, _, shape in LAYERS:
        values = rng.normal(0.0, 1.0, size=shape).astype(np.float32)
        if op_type == "ReLU":
            values = np.abs(values) + np.float32(0.1)
        if op_type == "Softmax":
            e = np.exp(values - values.max())
            values = (e / e.sum()).astype(np.float32)
        arrays[op] = values
    return arrays


def perturbed(arrays: dict[str, np.ndarray], rel: float, seed: int = 1, ops=None) -> dict[str, np.ndarray]:
    """A copy with multiplicative noise of relative size `rel` on `ops` (default: all)."""
    rng = np.random.default_rng(seed)
    out = {k: v.copy() for k, v in arrays.items()}
    for op in ops or ORDER:
        noise = rng.normal(0.0, rel, size=out[op].shape).astype(np.float32)
        out[op] = (out[op] * (1 + noise)).astype(np.float32)
    return out


def write_dump(path: Path, arrays: dict[str, np.ndarray], layers=None, extra_attrs: dict | None = None,
               backend: str = "cpu", precision: str = "high", layouts: dict | None = None, **attrs) -> Path:
    """One dump of `layers` (default LAYERS, only those present in `arrays`) with provenance attrs
    (`layouts`: op -> its recorded layout, default NCHW)."""
    header = {"engine": "ncnn", "engine_version": "test", "backend_requested": backend, "backend_actual": backend,
              "precision_requested": precision, "precision_effective": "fp32" if precision == "high" else "fp16",
              "threads": 1, "device_serial": "local", "device_model": "host", "model_name": "net.param",
              "model_sha256": "ab" * 32, "input_label": "x", "input_sha256": "cd" * 32, "harness": "tests",
              **attrs, **(extra_attrs or {})}
    with DumpWriter(path, header) as writer:
        for order, (op, op_type, inputs, _shape) in enumerate(layers or LAYERS):
            if op in arrays:
                writer.add_tensor({"order": order, "op": op, "op_type": op_type, "output_index": 0,
                                   "name": op, "inputs": inputs, "layout": (layouts or {}).get(op, "NCHW")}, arrays[op])
    return Path(path)


def cpu_and_vulkan_runs(folder: Path, rel: float = 1e-3) -> Path:
    """A folder with a cpu/high run and a vulkan/low run `rel` off it (fp16-like noise): two runs that pass."""
    folder.mkdir(parents=True, exist_ok=True)
    ref = reference_arrays(seed=1)
    write_dump(folder / "cpu.h5", ref)
    write_dump(folder / "vk.h5", perturbed(ref, rel, seed=2), backend="vulkan", precision="low")
    return folder
