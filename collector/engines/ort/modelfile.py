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
