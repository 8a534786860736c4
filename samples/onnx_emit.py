"""Write a `Network` as ONNX (with the `onnx` package) and convert it to `.mnn` with MNN's converter.

Naming rule: each ONNX node is named exactly like the network layer and so is its output value.
MNN names an op after its *output value*, so MNN op names equal ncnn layer names and runs align on
`<name>:0`. A conv with a fused ReLU becomes Conv (node and output named like the layer) + Relu
(node and output `<layer>/relu`, which later layers read): MNN's converter folds the Relu into the
Conv and keeps the Conv output's name, so MNN's op `<layer>` outputs the activated values, exactly
like ncnn's Convolution with activation_type=1 and like the numpy reference.
Layouts MNN would rename are avoided: the global pool is an AveragePool over the whole map, the
dense layer a 1x1 Conv (Gemm becomes `<name>__matmul_converted`), and ReLU never follows Add
(MNN fuses it into the Add).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from layerdiff.errors import ConversionError
from layerdiff.samples.netdef import Layer, Network, validate

OPSET = 14  # HardSwish needs 14
GRID_SAMPLE_OPSET = 16  # GridSample exists from 16; only networks using it get it (others keep their bytes)
IR_VERSION = 8
PRODUCER = "layerdiff-samples"

_SIMPLE = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "hardswish": "HardSwish",
           "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}


def _const(name: str, value: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(value), name)


def value_name(layer: Layer) -> str:
    """The ONNX value holding a layer's final output (a fused ReLU's output for conv+relu)."""
    return f"{layer.name}/relu" if layer.kind == "conv" and layer.attrs["activation"] == "relu" else layer.name


def _nodes(layer: Layer, ins: list[str]) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    """ONNX nodes and initializers for one layer reading values `ins`."""
    a, name = layer.attrs, layer.name
    if layer.kind in _SIMPLE:
        return [helper.make_node(_SIMPLE[layer.kind], ins, [name], name=name)], []
    if layer.kind == "conv":
        k, s, p = a["kernel"], a["stride"], a["pad"]
        inits = [_const(f"{name}/weight", layer.weights["weight"]), _const(f"{name}/bias", layer.weights["bias"])]
        nodes = [helper.make_node("Conv", ins + [f"{name}/weight", f"{name}/bias"], [name], name=name,
                                  kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])]
        if a["activation"] == "relu":
            nodes.append(helper.make_node("Relu", [name], [value_name(layer)], name=value_name(layer)))
        return nodes, inits
    if layer.kind in ("maxpool", "avgpool"):
        op = "MaxPool" if layer.kind == "maxpool" else "AveragePool"
        k, s = a["kernel"], a["stride"]
        return [helper.make_node(op, ins, [name], name=name, kernel_shape=[k, k], strides=[s, s])], []
    if layer.kind == "gap":
        kernel = [a["kernel_h"], a["kernel_w"]]
        return [helper.make_node("AveragePool", ins, [name], name=name, kernel_shape=kernel, strides=kernel)], []
    if layer.kind == "clip":
        inits = [_const(f"{name}/min", np.array(a["low"], np.float32)),
                 _const(f"{name}/max", np.array(a["high"], np.float32))]
        return [helper.make_node("Clip", ins + [f"{name}/min", f"{name}/max"], [name], name=name)], inits
    if layer.kind == "interp":
        scale = float(a["scale"])
        inits = [_const(f"{name}/scales", np.array([1.0, 1.0, scale, scale], np.float32))]
        mode = {"bilinear": dict(mode="linear", coordinate_transformation_mode="half_pixel"),
                "nearest": dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                                nearest_mode="floor")}[a["mode"]]
        return [helper.make_node("Resize", ins + ["", f"{name}/scales"], [name], name=name, **mode)], inits
    if layer.kind == "reduce_sum":
        inits = [_const(f"{name}/axes", np.array([2, 3], np.int64))]
        return [helper.make_node("ReduceSum", ins + [f"{name}/axes"], [name], name=name, keepdims=1)], inits
    if layer.kind == "concat":
        return [helper.make_node("Concat", ins, [name], name=name, axis=1)], []
    if layer.kind == "dense":
        weight = layer.weights["weight"]
        inits = [_const(f"{name}/weight", weight.reshape(weight.shape + (1, 1))),
                 _const(f"{name}/bias", layer.weights["bias"])]
        return [helper.make_node("Conv", ins + [f"{name}/weight", f"{name}/bias"], [name], name=name,
                                 kernel_shape=[1, 1])], inits
    if layer.kind == "softmax":
        return [helper.make_node("Softmax", ins, [name], name=name, axis=1)], []
    if layer.kind == "grid_sample":
        inits = [_const(f"{name}/grid", layer.weights["grid"])]
        return [helper.make_node("GridSample", ins + [f"{name}/grid"], [name], name=name, mode=a["mode"],
                                 padding_mode=a["padding"], align_corners=int(a["align_corners"]))], inits
    raise ValueError(f"{layer.name}: no ONNX mapping for kind {layer.kind!r}")


def to_onnx(net: Network) -> onnx.ModelProto:
    """The network as a checked ONNX model (opset 14, 16 with GridSample) with static shapes."""
    validate(net)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    values = {layer.name: value_name(layer) for layer in net.layers}
    for layer in net.layers[1:]:
        layer_nodes, layer_inits = _nodes(layer, [values[src] for src in layer.inputs])
        nodes += layer_nodes
        inits += layer_inits
    out_shape = list(net.layer(net.output_name).shape)
    graph = helper.make_graph(
        nodes, net.name,
        [helper.make_tensor_value_info(net.input_name, TensorProto.FLOAT, list(net.input_shape))],
        [helper.make_tensor_value_info(values[net.output_name], TensorProto.FLOAT, out_shape)],
        initializer=inits)
    opset = GRID_SAMPLE_OPSET if any(layer.kind == "grid_sample" for layer in net.layers) else OPSET
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def write_onnx(net: Network, path: str | os.PathLike) -> None:
    """Serialise `to_onnx(net)` to `path` (written under a temporary name, then renamed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_bytes(to_onnx(net).SerializeToString(deterministic=True))
    os.replace(tmp, path)


# The converter the `mnnconvert` console script wraps. We call it directly because the console
# script's wrapper (MNN/tools/utils/log.py) runs `pip install -U aliyun-log-python-sdk` when that
# package is missing (downgrading protobuf below what `onnx` needs) and then sends telemetry.
# One child process converts a batch (importing MNN costs ~0.5 s) and reports, on marked lines,
# the UUID MNN stamped into each model (MNN prints a banner on import, hence the markers). The
# converter prints with C stdio, which a pipe buffers: it is flushed after each model, so what it
# said about a model comes before that model's marker line.
_CONVERT = """
import ctypes, json, os, sys, MNN, _tools
libc = ctypes.CDLL(None)
for index, argv in enumerate(json.loads(sys.argv[1])):
    sys.stdout.flush()
    _tools.mnnconvert(argv)
    libc.fflush(None)
    target = argv[argv.index("--MNNModel") + 1]
    uuid = MNN.get_model_uuid(target) if os.path.exists(target) else "none"
    print(f"UUID={index}=" + uuid, flush=True)
"""
# What MNN's converter prints when it drops or refuses operators, yet exits 0 (sometimes with a file).
_REFUSALS = ("NOT_SUPPORTED_OP", "These Op Not Support", "Converted Failed", "Convert error")


def convert_onnx_to_mnn(onnx_path: str | os.PathLike, mnn_path: str | os.PathLike,
                        biz_code: str = "layerdiff", fp16_weights: bool = False) -> None:
    """Convert one model; see `convert_many`."""
    convert_many([(onnx_path, mnn_path, fp16_weights)], biz_code)


def convert_many(jobs: Sequence[tuple[str | os.PathLike, str | os.PathLike, bool]],
                 biz_code: str = "layerdiff", source_format: str = "ONNX") -> None:
    """Convert (source, mnn, fp16_weights) jobs with MNN's converter, deterministically.

    Same flags as `mnnconvert -f ONNX --modelFile X --MNNModel Y --bizCode B [--fp16]` (`source_format`
    TFLITE for `.tflite` files); `--fp16` stores conv weights as half floats (truncated). The
    converter stamps a random UUID into each model; we replace it by a UUID derived from the source
    file's sha256 (same length, same place) so regenerating gives identical bytes. Models are written
    under a temporary name, then renamed. A conversion the converter says it refused or cut short
    (`NOT_SUPPORTED_OP`, exit status 0 all the same) is a failed one: no model is left, and the
    error names the operators.
    """
    paths = [(Path(o), Path(m), Path(m).with_name(f".{Path(m).name}.partial"), fp16) for o, m, fp16 in jobs]
    argvs = []
    for onnx_path, _, tmp, fp16 in paths:
        tmp.unlink(missing_ok=True)
        argvs.append(["mnnconvert", "-f", source_format, "--modelFile", str(onnx_path), "--MNNModel", str(tmp),
                      "--bizCode", biz_code] + (["--fp16"] if fp16 else []))
    proc = subprocess.run([sys.executable, "-c", _CONVERT, json.dumps(argvs)], capture_output=True, text=True)
    said = _said_per_job(proc.stdout + "\n" + proc.stderr)
    uuids = dict(line[5:].split("=", 1) for line in proc.stdout.splitlines() if line.startswith("UUID="))
    for index, (onnx_path, mnn_path, tmp, _) in enumerate(paths):
        refusal = converter_refusal(said.get(index, ""))
        if str(index) not in uuids or uuids[str(index)] == "none" or not tmp.exists() or refusal:
            for _, _, leftover, _ in paths:
                leftover.unlink(missing_ok=True)
            crashed = f" (the converter crashed, exit status {proc.returncode})" if proc.returncode else ""
            tail = refusal or (proc.stdout + proc.stderr).strip()[-800:]
            raise ConversionError(f"MNN could not convert {onnx_path}{crashed}: {tail}")
        digest = hashlib.sha256(onnx_path.read_bytes()).digest()
        _replace_uuid(tmp, uuids[str(index)], str(uuid.UUID(bytes=digest[:16], version=4)))
        os.replace(tmp, mnn_path)


def _said_per_job(text: str) -> dict[int, str]:
    """The converter's words about each job: the text before that job's `UUID=<index>=` marker."""
    said: dict[int, str] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("UUID="):
            said[int(line.split("=", 2)[1])] = "\n".join(current)
            current = []
        else:
            current.append(line)
    said.setdefault(len(said), "\n".join(current))  # a crash mid-job: what it said before dying
    return said


def converter_refusal(text: str) -> str:
    """'' when MNN's converter reported no refusal, else one line naming the operators it refused."""
    if not any(marker in text for marker in _REFUSALS):
        return ""
    ops: list[str] = []
    for match in re.finditer(r"NOT_SUPPORTED_OP: \[ ([^\]]+?) \]|These Op Not Support: (.*)", text):
        for op in (match.group(1) or match.group(2) or "").split():
            if op not in ops:
                ops.append(op)
    named = f"operators it does not support: {', '.join(ops)}" if ops else "it reported a failed conversion"
    return f"MNN's converter refused the model ({named}); it exits 0 all the same, so no model is kept"


def _replace_uuid(mnn_path: Path, old_uuid: str, new_uuid: str) -> None:
    """Swap the converter's random UUID string for `new_uuid` in place (it must occur exactly once)."""
    old = old_uuid.encode("ascii")
    data = mnn_path.read_bytes()
    if len(old) != len(new_uuid) or data.count(old) != 1:
        mnn_path.unlink(missing_ok=True)
        raise ConversionError(f"{mnn_path}: model UUID {old_uuid!r} not found exactly once; cannot make it stable")
    mnn_path.write_bytes(data.replace(old, new_uuid.encode("ascii")))
