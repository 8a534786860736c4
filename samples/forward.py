"""Pure-numpy forward pass of a `layerdiff.samples.netdef.Network`: the independent reference.

Why numpy and float64: the engines under test are what we are checking, so the reference must not
share code with them. Every layer is computed in float64 from float64 inputs and handed back as
float32 (what engines dump), so its own rounding error is far below any engine's fp32 error.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from layerdiff.samples.netdef import Layer, Network


def forward(net: Network, data: np.ndarray | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `net` on its input; returns every layer's output as float32 keyed `<name>:0`.

    `data` is the input array (NCHW, the network's input shape) or a mapping holding it under the
    input's name. The input layer itself is included (its key is `<input name>:0`).
    """
    x = data[net.input_name] if isinstance(data, Mapping) else data
    x = np.asarray(x)
    if tuple(x.shape) != tuple(net.input_shape):
        raise ValueError(f"network {net.name!r}: input {net.input_name!r} must have shape "
                         f"{tuple(net.input_shape)}, got {tuple(x.shape)}")
    values: dict[str, np.ndarray] = {net.input_name: x.astype(np.float64)}
    for layer in net.layers[1:]:
        args = [values[src] for src in layer.inputs]
        out = _OPS[layer.kind](layer, *args)
        if out.shape != layer.shape:
            raise AssertionError(f"{net.name}/{layer.name}: computed shape {out.shape} != {layer.shape}")
        values[layer.name] = out
    return {f"{name}:0": value.astype(np.float32) for name, value in values.items()}


def _conv(layer: Layer, x: np.ndarray) -> np.ndarray:
    """Direct convolution via a strided window view and one tensordot (float64)."""
    weight = layer.weights["weight"].astype(np.float64)
    bias = layer.weights["bias"].astype(np.float64)
    k, s, p = layer.attrs["kernel"], layer.attrs["stride"], layer.attrs["pad"]
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s]
    # windows: (N, C, OH, OW, K, K); weight: (O, C, K, K)
    out = np.einsum("nchwij,ocij->nohw", windows, weight, optimize=True) + bias[None, :, None, None]
    if layer.attrs.get("activation") == "relu":
        out = np.maximum(out, 0.0)
    return out


def _pool(reduce: Callable[..., np.ndarray]) -> Callable[[Layer, np.ndarray], np.ndarray]:
    def run(layer: Layer, x: np.ndarray) -> np.ndarray:
        k, s = layer.attrs["kernel"], layer.attrs["stride"]
        windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::s, ::s]
        return reduce(windows, axis=(4, 5))
    return run


def _interp(layer: Layer, x: np.ndarray) -> np.ndarray:
    """Integer up-scaling; bilinear with half-pixel centres, edges clamped (ONNX/ncnn rules)."""
    scale = layer.attrs["scale"]
    if layer.attrs["mode"] == "nearest":
        return x.repeat(scale, axis=2).repeat(scale, axis=3)
    out = x
    for axis in (2, 3):
        size = out.shape[axis]
        pos = np.clip((np.arange(size * scale) + 0.5) / scale - 0.5, 0.0, size - 1)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, size - 1)
        frac = pos - lo
        shape = [1, 1, 1, 1]
        shape[axis] = -1
        frac = frac.reshape(shape)
        out = np.take(out, lo, axis=axis) * (1.0 - frac) + np.take(out, hi, axis=axis) * frac
    return out


def _softmax(layer: Layer, x: np.ndarray) -> np.ndarray:
    """Softmax over channels (axis 1)."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _hardswish(layer: Layer, x: np.ndarray) -> np.ndarray:
    return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)


def _dense(layer: Layer, x: np.ndarray) -> np.ndarray:
    flat = x.reshape(x.shape[0], -1) @ layer.weights["weight"].astype(np.float64).T
    return (flat + layer.weights["bias"].astype(np.float64))[:, :, None, None]


def _grid_sample(layer: Layer, x: np.ndarray) -> np.ndarray:
    """Bilinear GridSample, zeros padding, align_corners=0 (ONNX GridSample-16 / ncnn / MNN rules)."""
    grid = layer.weights["grid"].astype(np.float64)
    n, c, h, w = x.shape
    px = ((grid[..., 0] + 1.0) * w - 1.0) / 2.0  # (N, OH, OW) pixel coordinates
    py = ((grid[..., 1] + 1.0) * h - 1.0) / 2.0
    x0, y0 = np.floor(px).astype(int), np.floor(py).astype(int)
    out = np.zeros((n, c) + px.shape[1:], dtype=np.float64)
    for dy in (0, 1):
        for dx in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            weight = (1.0 - np.abs(px - xi)) * (1.0 - np.abs(py - yi))
            inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
            for b in range(n):
                values = x[b][:, np.clip(yi[b], 0, h - 1), np.clip(xi[b], 0, w - 1)]
                out[b] += values * (weight[b] * inside[b])[None]
    return out


_OPS: dict[str, Callable[..., np.ndarray]] = {
    "conv": _conv,
    "relu": lambda layer, x: np.maximum(x, 0.0),
    "sigmoid": lambda layer, x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": lambda layer, x: np.tanh(x),
    "hardswish": _hardswish,
    "clip": lambda layer, x: np.clip(x, layer.attrs["low"], layer.attrs["high"]),
    "exp": lambda layer, x: np.exp(x),
    "maxpool": _pool(np.max),
    "avgpool": _pool(np.mean),
    "gap": lambda layer, x: x.mean(axis=(2, 3), keepdims=True),
    "interp": _interp,
    "reduce_sum": lambda layer, x: x.sum(axis=(2, 3), keepdims=True),
    "add": lambda layer, a, b: a + b,
    "sub": lambda layer, a, b: a - b,
    "mul": lambda layer, a, b: a * b,
    "div": lambda layer, a, b: a / b,
    "concat": lambda layer, *xs: np.concatenate(xs, axis=1),
    "dense": _dense,
    "softmax": _softmax,
    "grid_sample": _grid_sample,
}
