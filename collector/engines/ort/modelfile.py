"""What an ONNX model declares before any run: its graph inputs (shape, dtype), read with `onnx`."""
from __future__ import annotations

from pathlib import Path

from layerdiff.errors import ModelFormatError
from layerdiff.collector.engines.base import InputSpecs


def input_specs(path: Path) -> InputSpecs:
    """Graph inputs that are not initializers; symbolic dimensions are dynamic (-1)."""
    import onnx
    from onnx import helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf raises DecodeError and friends
        raise ModelFormatError(f"{path}: not a readable ONNX model ({str(err)[:200] or type(err).__name__})") from None
    weights = {init.name for init in model.graph.initializer}
    specs: InputSpecs = {}
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim) \
            if tensor.HasField("shape") else None
        specs[value.name] = (shape, str(helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    return specs


def model_precision(model) -> str:
    """The precision the model's own tensors set (ONNX Runtime computes a float16 tensor in float16):
    `fp16` when every float graph input and weight is float16, `fp16+fp32` when both kinds are there,
    else `fp32`. An fp16 copy of a model is an fp16 run whatever precision was asked for."""
    from onnx import TensorProto

    kinds = [init.data_type for init in model.graph.initializer]
    kinds += [value.type.tensor_type.elem_type for value in model.graph.input]
    half = TensorProto.FLOAT16 in kinds or TensorProto.BFLOAT16 in kinds
    full = TensorProto.FLOAT in kinds or TensorProto.DOUBLE in kinds
    if half and full:
        return "fp16+fp32"
    return "fp16" if half else "fp32"
