"""Write a `Network` as an ncnn model (.param text + .bin weights), with numpy only.

Why by hand instead of pnnx/onnx2ncnn: the converters fuse, rename and (pnnx) store weights as fp16
by default; writing the files ourselves keeps one ncnn layer per network layer, names unchanged,
and lets us choose the weight storage (fp32 raw, or fp16 for the storage-drift scenario).

Format (ncnn wiki "param and model file structure"):
    7767517
    <layer count> <blob count>
    <type> <name> <n inputs> <n outputs> <input blobs...> <output blobs...> <k=v ...>
ncnn needs a `Split` layer whenever one blob feeds several layers; blobs are named after layers.
Weights in .bin, per layer in load order: conv/inner-product weight = 4-byte tag + data (tag 0 =
fp32 raw, 0x01306B47 = fp16, padded to 4 bytes), then bias as raw fp32 without tag; a GridSample's
grid is a MemoryData layer just before it (raw fp32 without tag).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
import numpy as np

from layerdiff.samples.netdef import Layer, Network, validate

MAGIC = 7767517
TAG_FP32 = 0x00000000
TAG_FP16 = 0x01306B47
WEIGHT_STORAGES = ("fp32", "fp16")

_BINARY_OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3}
_UNARY_TYPES = {"relu": "ReLU", "sigmoid": "Sigmoid", "tanh": "TanH", "exp": "Exp"}


def fmt_float(value: float) -> str:
    """A float as ncnn's param parser wants it: contains '.' or 'e', at most 15 characters.

    9 significant digits round-trip float32 exactly; '-1.23456789e-01' is exactly 15 characters.
    """
    return f"{float(np.float32(value)):.8e}"


def _params(layer: Layer) -> dict[int, int | float]:
    """The layer-specific `k=v` pairs of an ncnn layer (see ncnn's operation-param-weight-table)."""
    a = layer.attrs
    if layer.kind == "input":
        _, c, h, w = layer.shape
        return {0: w, 1: h, 2: c}
    if layer.kind == "conv":
        k, s, p = a["kernel"], a["stride"], a["pad"]
        out_c = layer.weights["weight"].shape[0]
        act = {None: 0, "relu": 1}[a["activation"]]
        return {0: out_c, 1: k, 11: k, 2: 1, 12: 1, 3: s, 13: s, 4: p, 14: p, 15: p, 16: p,
                5: 1, 6: int(layer.weights["weight"].size), 9: act}
    if layer.kind in ("maxpool", "avgpool"):
        return {0: 0 if layer.kind == "maxpool" else 1, 1: a["kernel"], 11: a["kernel"],
                2: a["stride"], 12: a["stride"], 3: 0, 5: 1}  # 5=1: valid padding (floor), as ONNX
    if layer.kind == "gap":  # a whole-map average pool keeps (C, 1, 1), where global pooling gives (C,)
        return {0: 1, 1: a["kernel_w"], 11: a["kernel_h"], 2: a["kernel_w"], 12: a["kernel_h"], 3: 0, 5: 1}
    if layer.kind == "hardswish":
        return {0: 1.0 / 6.0, 1: 0.5}
    if layer.kind == "clip":
        return {0: a["low"], 1: a["high"]}
    if layer.kind == "interp":
        return {0: 2 if a["mode"] == "bilinear" else 1, 1: float(a["scale"]), 2: float(a["scale"]), 6: 0}
    if layer.kind in _BINARY_OPS:
        return {0: _BINARY_OPS[layer.kind]}
    if layer.kind == "concat":
        return {0: 0}
    if layer.kind == "dense":
        w = layer.weights["weight"]
        return {0: w.shape[0], 1: 1, 2: int(w.size)}
    if layer.kind == "softmax":
        return {0: 0, 1: 1}  # InnerProduct gives a 1-D blob: softmax over axis 0; 1=1 fixed semantics
    if layer.kind == "grid_sample":  # 0=sample_type (1 bilinear) 1=padding_mode (1 zeros) 2=align_corner
        return {0: 1, 1: 1, 2: int(a["align_corners"]), 3: 0}
    return {}


def _grid_blob(layer: Layer) -> tuple[str, dict[int, int]]:
    """A GridSample's constant grid as an ncnn MemoryData blob (w=2, h=out width, c=out height)."""
    _, out_h, out_w, _ = layer.weights["grid"].shape
    return f"{layer.name}/grid", {0: 2, 1: out_w, 2: out_h}


def _layer_type(layer: Layer) -> str:
    types = {"input": "Input", "conv": "Convolution", "maxpool": "Pooling", "avgpool": "Pooling",
             "gap": "Pooling", "hardswish": "HardSwish", "clip": "Clip", "interp": "Interp",
             "concat": "Concat", "dense": "InnerProduct", "softmax": "Softmax", "reduce_sum": "Reduction",
             "grid_sample": "GridSample"}
    if layer.kind in _BINARY_OPS:
        return "BinaryOp"
    return types.get(layer.kind) or _UNARY_TYPES[layer.kind]


def _reduction_params(layer: Layer) -> str:
    # sum (0=0) over h and w of a (c, h, w) blob, keep dims (4=1); axes in the blob's own dims (5=1)
    return "0=0 1=0 -23303=2,1,2 4=1 5=1"


def _param_line(layer_type: str, name: str, bottoms: list[str], tops: list[str], params: str) -> str:
    parts = [f"{layer_type:<16}", f"{name:<24}", str(len(bottoms)), str(len(tops)), *bottoms, *tops]
    if params:
        parts.append(params)
    return " ".join(parts).rstrip()


def _format_params(params: dict[int, int | float]) -> str:
    return " ".join(f"{k}={fmt_float(v) if isinstance(v, float) else int(v)}" for k, v in params.items())


def param_text(net: Network) -> str:
    """The .param file's text, with a Split layer after every blob that has several consumers."""
    validate(net)
    consumers = net.consumers()
    pending: dict[str, list[str]] = {}  # blob -> split outputs not yet handed to a consumer
    lines: list[str] = []
    blob_count = 0
    split_index = 0
    for layer in net.layers:
        bottoms = [pending[src].pop(0) if src in pending else src for src in layer.inputs]
        if layer.kind == "grid_sample":
            grid, shape = _grid_blob(layer)
            lines.append(_param_line("MemoryData", grid, [], [grid], _format_params(shape)))
            blob_count += 1
            bottoms.append(grid)
        params = _reduction_params(layer) if layer.kind == "reduce_sum" else _format_params(_params(layer))
        lines.append(_param_line(_layer_type(layer), layer.name, bottoms, [layer.name], params))
        blob_count += 1
        users = len(consumers[layer.name])
        if users > 1:
            outs = [f"{layer.name}_splitncnn_{i}" for i in range(users)]
            lines.append(_param_line("Split", f"splitncnn_{split_index}", [layer.name], outs, ""))
            pending[layer.name] = outs
            blob_count += users
            split_index += 1
    return f"{MAGIC}\n{len(lines)} {blob_count}\n" + "\n".join(lines) + "\n"


def float32_to_float16_ncnn(values: np.ndarray) -> np.ndarray:
    """fp32 -> fp16 bits exactly as ncnn's `float32_to_float16` (used by its fp16 model writers).

    Why not numpy's astype: ncnn *truncates* the mantissa (round toward zero) and flushes results
    below fp16's smallest normal to zero; MNN's converter `--fp16` truncates too. The drift a user
    sees from fp16-stored weights comes from this rule, so the samples use it.
    """
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    sign = ((bits >> 16) & 0x8000).astype(np.uint16)
    exponent = ((bits >> 23) & 0xFF).astype(np.int32)
    significand = bits & 0x7FFFFF
    new_exp = exponent - 127 + 15
    normal = (sign | (np.clip(new_exp, 0, 31).astype(np.uint16) << 10) | (significand >> 13).astype(np.uint16))
    out = np.where(new_exp >= 31, sign | 0x7C00, normal)
    out = np.where(new_exp <= 0, sign, out)
    nan_or_inf = sign | 0x7C00 | np.where(significand != 0, 0x200, 0).astype(np.uint16)
    return np.where(exponent == 0xFF, nan_or_inf, out).astype(np.uint16)


def fp16_stored(values: np.ndarray) -> np.ndarray:
    """The float32 values ncnn reads back from fp16 storage (see `float32_to_float16_ncnn`)."""
    return float32_to_float16_ncnn(values).view(np.float16).astype(np.float32)


def _tagged_weight(weight: np.ndarray, storage: str) -> bytes:
    """A weight blob as ncnn reads it with type 0: tag, then fp32 or fp16 data padded to 4 bytes."""
    flat = np.ascontiguousarray(weight, dtype=np.float32).ravel()
    if storage == "fp32":
        return struct.pack("<I", TAG_FP32) + flat.astype("<f4").tobytes()
    half = float32_to_float16_ncnn(flat).astype("<u2").tobytes()
    return struct.pack("<I", TAG_FP16) + half + b"\0" * (-len(half) % 4)


def weight_bytes(net: Network, storage: str = "fp32") -> bytes:
    """The .bin file's bytes: for each conv/dense layer in order, tagged weight then raw fp32 bias."""
    if storage not in WEIGHT_STORAGES:
        raise ValueError(f"weight storage must be one of {WEIGHT_STORAGES}, got {storage!r}")
    chunks: list[bytes] = []
    for layer in net.layers:
        if layer.kind in ("conv", "dense"):
            chunks.append(_tagged_weight(layer.weights["weight"], storage))
            chunks.append(np.ascontiguousarray(layer.weights["bias"], dtype="<f4").tobytes())
        elif layer.kind == "grid_sample":  # the MemoryData before it: raw fp32, no tag
            chunks.append(np.ascontiguousarray(layer.weights["grid"], dtype="<f4").tobytes())
    return b"".join(chunks)


def stored_weights(net: Network, storage: str) -> Network:
    """The network with weights as `storage` keeps them (fp16: truncated like ncnn and MNN do;
    biases stay fp32 in both engines)."""
    if storage == "fp32":
        return net
    rounded = []
    for layer in net.layers:
        if layer.kind in ("conv", "dense"):
            weights = dict(layer.weights, weight=fp16_stored(layer.weights["weight"]))
            layer = Layer(layer.name, layer.kind, layer.inputs, layer.attrs, weights, layer.shape)
        rounded.append(layer)
    return Network(net.name, tuple(rounded), net.output_name)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write under a temporary name then rename, so a crash never leaves half a model file."""
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_ncnn(net: Network, param_path: str | os.PathLike, bin_path: str | os.PathLike,
               storage: str = "fp32") -> None:
    """Write `net` as ncnn `.param` + `.bin` (weights stored as `storage`: "fp32" or "fp16")."""
    data = weight_bytes(net, storage)
    _write_atomic(Path(param_path), param_text(net).encode("utf-8"))
    _write_atomic(Path(bin_path), data)

