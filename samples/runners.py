"""Run the generated sample models on the host's real engines and return every layer's output.

Why here and not in the collector: samples must prove themselves (ncnn and MNN give what the numpy
reference says) without depending on the tool they are meant to test. These runners are small and
direct: pip `ncnn` (CPU, or Vulkan on Mesa lavapipe) and pymnn (CPU), keyed `<op name>:0`.

Precision settings are layerdiff.vocabulary's ncnn table, as the collector's: high = every fp16/bf16
option off; low = fp16 packed, storage and arithmetic on where the backend has fp16 (Vulkan, an fp16
CPU), bf16 storage on other CPUs (x86 has no fp16 arithmetic, so ncnn uses bf16); normal = ncnn's defaults.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from layerdiff.collector.engines.ncnn.options import ncnn_cpu_has_fp16, ncnn_precision_flags
from layerdiff.vocabulary import PRECISIONS

BACKENDS = ("cpu", "vulkan")  # the backends pip ncnn has here (MNN's wheel runs on the CPU only)


def _ncnn_options(opt, backend: str, precision: str) -> None:
    """Set an ncnn Option for a backend/precision (see module docstring for the mapping)."""
    import ncnn

    opt.use_vulkan_compute = backend == "vulkan"
    opt.num_threads = 1
    opt.lightmode = False
    for flag, value in ncnn_precision_flags(precision, fp16=backend == "vulkan" or ncnn_cpu_has_fp16(ncnn)).items():
        if hasattr(opt, flag):  # pip ncnn has no use_fp16_uniform (Vulkan-only; ncnn clears it with arithmetic)
            setattr(opt, flag, value)


def _blob_shape(mat) -> tuple[int, ...]:
    """ncnn blob dims without batch, in C, (D,) H, W order."""
    return {1: (mat.w,), 2: (mat.h, mat.w), 3: (mat.c, mat.h, mat.w), 4: (mat.c, mat.d, mat.h, mat.w)}[mat.dims]


def run_ncnn(param_path: str | os.PathLike, bin_path: str | os.PathLike, data: np.ndarray,
             backend: str = "cpu", precision: str = "high", input_name: str = "data") -> dict[str, np.ndarray]:
    """Run an ncnn model; returns each layer's outputs as float32 keyed `<layer>:<top index>`.

    Blobs are extracted one by one with light mode off (so every intermediate stays alive) and
    type 0 (ncnn unpacks elempack and converts fp16/bf16 to fp32). A batch-1 NCHW input is fed as CHW.
    """
    import ncnn

    if backend not in BACKENDS or precision not in PRECISIONS:
        raise ValueError(f"backend must be one of {BACKENDS} and precision one of {PRECISIONS}")
    if backend == "vulkan" and ncnn.get_gpu_count() < 1:
        raise RuntimeError("no Vulkan device: install mesa-vulkan-drivers (lavapipe)")
    net = ncnn.Net()
    _ncnn_options(net.opt, backend, precision)
    if net.load_param(str(param_path)) != 0 or net.load_model(str(bin_path)) != 0:
        raise RuntimeError(f"ncnn could not load {param_path} / {bin_path}")
    outputs: dict[str, np.ndarray] = {}
    try:
        ex = net.create_extractor()
        ex.set_light_mode(False)
        ex.input(input_name, ncnn.Mat(np.ascontiguousarray(data[0], dtype=np.float32)))
        for layer in net.layers():
            for index, blob in enumerate(layer.tops):
                ret, mat = ex.extract(net.blobs()[blob].name)
                if ret != 0:
                    raise RuntimeError(f"ncnn failed to extract layer {layer.name!r} output {index}")
                outputs[f"{layer.name}:{index}"] = np.array(mat, dtype=np.float32).reshape(_blob_shape(mat))
        del ex
    finally:
        net.clear()
    return outputs


def run_mnn(mnn_path: str | os.PathLike, data: np.ndarray, precision: str = "high") -> dict[str, np.ndarray]:
    """Run an .mnn model on MNN's CPU backend; returns each op's outputs keyed `<op>:<index>`.

    Outputs are copied inside the after-op callback (MNN reuses buffers) as NCHW float32.
    Ops with several outputs keep their order; MNN's own `_raster_` helper ops are included.
    """
    import MNN

    interpreter = MNN.Interpreter(str(mnn_path))
    session = interpreter.createSession({"backend": "CPU", "precision": precision, "numThread": 1})
    tensor = interpreter.getSessionInput(session)
    host = MNN.Tensor(tuple(data.shape), MNN.Halide_Type_Float,
                      np.ascontiguousarray(data, dtype=np.float32), MNN.Tensor_DimensionType_Caffe)
    tensor.copyFrom(host)
    outputs: dict[str, np.ndarray] = {}

    def before(tensors, info) -> bool:
        return True

    def after(tensors, info) -> bool:
        for index, t in enumerate(tensors):
            shape = tuple(t.getShape())
            if not shape or int(np.prod(shape)) <= 0:
                continue
            copy = MNN.Tensor(shape, MNN.Halide_Type_Float, np.zeros(shape, np.float32),
                              MNN.Tensor_DimensionType_Caffe)
            t.copyToHostTensor(copy)
            outputs[f"{info.getName()}:{index}"] = np.array(copy.getNumpyData(), dtype=np.float32).reshape(shape)
        return True

    interpreter.runSessionWithCallBackInfo(session, before, after)
    return outputs


def compare(reference: Mapping[str, np.ndarray], run: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per shared key: max |a - b| / max(|reference|, tiny), comparing element-wise after flattening.

    Shapes may differ by singleton axes (ncnn drops the batch axis): keys are compared when their
    element counts agree, and a count mismatch is reported as infinity.
    """
    errors: dict[str, float] = {}
    for key, ref in reference.items():
        if key not in run:
            continue
        got = run[key]
        if got.size != ref.size:
            errors[key] = float("inf")
            continue
        scale = max(float(np.max(np.abs(ref))), 1e-30)
        errors[key] = float(np.max(np.abs(got.ravel().astype(np.float64) - ref.ravel())) / scale)
    return errors
