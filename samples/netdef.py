"""One engine-neutral description of a small network.

Why: the sample models exist in three forms (ncnn .param/.bin, ONNX -> .mnn, and a numpy reference).
If each form were written by hand they would drift apart; instead every form is *emitted* from the
single `Network` built here, so layer names, weights and graph edges are identical by construction.

Conventions (shared by every emitter):
- Tensors are NCHW float32 with batch 1; the classifier head keeps 4-D: (1, C, 1, 1).
- Every layer has exactly one output, and that output's blob/tensor name equals the layer name, so
  the alignment key of a layer is `<name>:0` in every engine.
- The first layer is the model input (kind "input"); layers are stored in topological order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

INPUT_KIND = "input"

#: every layer kind an emitter must understand, with its number of inputs (None = any >= 2)
KINDS: Mapping[str, int | None] = MappingProxyType({
    "input": 0, "conv": 1, "relu": 1, "sigmoid": 1, "tanh": 1, "hardswish": 1, "clip": 1,
    "exp": 1, "maxpool": 1, "avgpool": 1, "gap": 1, "interp": 1, "reduce_sum": 1,
    "add": 2, "sub": 2, "mul": 2, "div": 2, "concat": None, "dense": 1, "softmax": 1, "grid_sample": 1,
})

#: activations a conv can carry inside itself (ncnn Convolution activation_type; MNN fuses Conv+Relu)
CONV_ACTIVATIONS = (None, "relu")


@dataclass(frozen=True)
class Layer:
    """One layer: its name (also its output's name), kind, input layer names, attributes, weights."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    weights: Mapping[str, np.ndarray] = field(default_factory=dict)
    shape: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """Alignment key of this layer's (only) output."""
        return f"{self.name}:0"


@dataclass(frozen=True)
class Network:
    """A validated, topologically ordered network with one input and one output."""

    name: str
    layers: tuple[Layer, ...]
    output_name: str

    @property
    def input_layer(self) -> Layer:
        return self.layers[0]

    @property
    def input_name(self) -> str:
        return self.layers[0].name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.layers[0].shape

    def layer(self, name: str) -> Layer:
        """The layer called `name` (KeyError naming the network if absent)."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"network {self.name!r} has no layer {name!r}")

    def keys(self) -> list[str]:
        """Alignment keys of every layer output, in execution order."""
        return [layer.key for layer in self.layers]

    def consumers(self) -> dict[str, list[str]]:
        """For each layer, the layers that read its output (in order; repeats kept)."""
        users: dict[str, list[str]] = {layer.name: [] for layer in self.layers}
        for layer in self.layers:
            for src in layer.inputs:
                users[src].append(layer.name)
        return users


def validate(net: Network) -> None:
    """Refuse a network the emitters could not represent faithfully (ValueError naming the layer)."""
    seen: set[str] = set()
    if not net.layers or net.layers[0].kind != INPUT_KIND:
        raise ValueError(f"network {net.name!r}: the first layer must be the input")
    for layer in net.layers:
        arity = KINDS.get(layer.kind, -1)
        if arity == -1:
            raise ValueError(f"network {net.name!r}, layer {layer.name!r}: unknown kind {layer.kind!r}")
        if arity is None and len(layer.inputs) < 2 or arity is not None and len(layer.inputs) != arity:
            raise ValueError(f"network {net.name!r}, layer {layer.name!r}: wrong number of inputs")
        if layer.name in seen:
            raise ValueError(f"network {net.name!r}: duplicate layer name {layer.name!r}")
        if any(ch.isspace() for ch in layer.name):
            raise ValueError(f"network {net.name!r}, layer {layer.name!r}: ncnn names cannot hold spaces")
        for src in layer.inputs:
            if src not in seen:
                raise ValueError(f"network {net.name!r}, layer {layer.name!r}: input {src!r} not defined before")
        seen.add(layer.name)
    if net.output_name not in seen:
        raise ValueError(f"network {net.name!r}: output {net.output_name!r} is not a layer")


class NetBuilder:
    """Builds a `Network` layer by layer, inferring shapes and drawing deterministic weights.

    Why a builder: shapes decide weight sizes, and drawing weights from one seeded generator in
    construction order makes the same recipe produce the same bytes on every machine.
    """

    def __init__(self, name: str, input_shape: Sequence[int], seed: int, input_name: str = "data"):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.layers: list[Layer] = []
        self._add(Layer(input_name, "input", (), {}, {}, tuple(int(d) for d in input_shape)))

    # --- plumbing -------------------------------------------------------------------------
    def _add(self, layer: Layer) -> str:
        self.layers.append(layer)
        return layer.name

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of a layer's output already built."""
        for layer in self.layers:
            if layer.name == name:
                return layer.shape
        raise KeyError(f"{self.name}: no layer {name!r} yet")

    def _unary(self, kind: str, name: str, src: str, **attrs: Any) -> str:
        return self._add(Layer(name, kind, (src,), attrs, {}, self.shape(src)))

    def build(self, output_name: str | None = None) -> Network:
        """Freeze into a validated `Network` (output defaults to the last layer)."""
        net = Network(self.name, tuple(self.layers), output_name or self.layers[-1].name)
        validate(net)
        return net

    # --- layers with weights --------------------------------------------------------------
    def conv(self, name: str, src: str, out_channels: int, kernel: int = 3, stride: int = 1,
             pad: int | None = None, activation: str | None = None, gain: float = 1.0,
             bias_scale: float = 0.1) -> str:
        """Square conv; He-initialised weights times `gain`; optional fused ReLU."""
        if activation not in CONV_ACTIVATIONS:
            raise ValueError(f"{self.name}/{name}: conv activation must be one of {CONV_ACTIVATIONS}")
        n, c, h, w = self.shape(src)
        pad = kernel // 2 if pad is None else pad
        fan_in = c * kernel * kernel
        weight = self.rng.standard_normal((out_channels, c, kernel, kernel)) * np.sqrt(2.0 / fan_in) * gain
        bias = self.rng.standard_normal(out_channels) * bias_scale
        oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
        attrs = {"kernel": kernel, "stride": stride, "pad": pad, "activation": activation}
        weights = {"weight": weight.astype(np.float32), "bias": bias.astype(np.float32)}
        return self._add(Layer(name, "conv", (src,), attrs, weights, (n, out_channels, oh, ow)))

    def dense(self, name: str, src: str, out_features: int, gain: float = 1.0) -> str:
        """Fully connected layer on a pooled (1, C, 1, 1) tensor, giving (1, out_features, 1, 1).

        Why 4-D and no flatten: MNN's converter drops Flatten and renames Gemm
        (`<name>__matmul_converted`), which would break name alignment; a dense layer on a 1x1 map
        is emitted as ncnn InnerProduct and as an ONNX 1x1 Conv, both keeping the layer's name.
        """
        n, c, h, w = self.shape(src)
        if (h, w) != (1, 1):
            raise ValueError(f"{self.name}/{name}: dense expects a (1, C, 1, 1) input, got {self.shape(src)}")
        weight = self.rng.standard_normal((out_features, c)) * np.sqrt(1.0 / c) * gain
        bias = self.rng.standard_normal(out_features) * 0.1
        weights = {"weight": weight.astype(np.float32), "bias": bias.astype(np.float32)}
        return self._add(Layer(name, "dense", (src,), {}, weights, (n, out_features, 1, 1)))

    # --- element-wise activations ---------------------------------------------------------
    def relu(self, name: str, src: str) -> str:
        return self._unary("relu", name, src)

    def sigmoid(self, name: str, src: str) -> str:
        return self._unary("sigmoid", name, src)

    def tanh(self, name: str, src: str) -> str:
        return self._unary("tanh", name, src)

    def hardswish(self, name: str, src: str) -> str:
        """x * clip(x/6 + 1/2, 0, 1): ONNX HardSwish (ncnn HardSwish alpha=1/6, beta=1/2)."""
        return self._unary("hardswish", name, src)

    def clip(self, name: str, src: str, low: float, high: float) -> str:
        return self._unary("clip", name, src, low=float(low), high=float(high))

    def exp(self, name: str, src: str) -> str:
        return self._unary("exp", name, src)

    # --- pooling, resampling, reductions --------------------------------------------------
    def _pool(self, kind: str, name: str, src: str, kernel: int, stride: int | None) -> str:
        n, c, h, w = self.shape(src)
        stride = kernel if stride is None else stride
        shape = (n, c, (h - kernel) // stride + 1, (w - kernel) // stride + 1)
        return self._add(Layer(name, kind, (src,), {"kernel": kernel, "stride": stride}, {}, shape))

    def maxpool(self, name: str, src: str, kernel: int = 2, stride: int | None = None) -> str:
        return self._pool("maxpool", name, src, kernel, stride)

    def avgpool(self, name: str, src: str, kernel: int = 2, stride: int | None = None) -> str:
        return self._pool("avgpool", name, src, kernel, stride)

    def gap(self, name: str, src: str) -> str:
        """Global average pool to (1, C, 1, 1), emitted as an average pool whose kernel is the
        whole map (MNN renames a GlobalAveragePool to `<name>_raster_0`; a plain pool keeps it)."""
        n, c, h, w = self.shape(src)
        return self._add(Layer(name, "gap", (src,), {"kernel_h": h, "kernel_w": w}, {}, (n, c, 1, 1)))

    def interp(self, name: str, src: str, scale: int, mode: str = "bilinear") -> str:
        """Integer up-scaling; bilinear uses half-pixel centres (ONNX Resize, ncnn Interp)."""
        if mode not in ("bilinear", "nearest"):
            raise ValueError(f"{self.name}/{name}: interp mode must be bilinear or nearest")
        n, c, h, w = self.shape(src)
        return self._add(Layer(name, "interp", (src,), {"scale": int(scale), "mode": mode}, {},
                               (n, c, h * scale, w * scale)))

    def grid_sample(self, name: str, src: str, wobble_px: float = 0.3) -> str:
        """Bilinear GridSample (zeros padding, align_corners=0) with a constant near-identity grid:
        every output pixel reads its own position moved by a smooth sub-pixel wobble, the warp a
        rectification or optical-flow model applies. The grid is a weight (ONNX initializer, ncnn
        MemoryData), normalised to [-1, 1]; in fp16 its unnormalised x keeps only 2 fraction bits
        past 256 pixels, which is what breaks it at low precision on wide maps."""
        n, c, h, w = self.shape(src)
        ys = (2.0 * np.arange(h) + 1.0) / h - 1.0
        xs = (2.0 * np.arange(w) + 1.0) / w - 1.0
        gy, gx = np.meshgrid(ys, xs, indexing="ij")
        gx = gx + 2.0 * wobble_px / w * np.sin(np.arange(w) / 7.0)[None, :]
        gy = gy + 2.0 * wobble_px / h * np.cos(np.arange(h) / 5.0)[:, None]
        grid = np.stack([gx, gy], axis=-1)[None].astype(np.float32)  # (1, H, W, 2): x then y
        return self._add(Layer(name, "grid_sample", (src,), {"mode": "bilinear", "padding": "zeros",
                                                             "align_corners": False}, {"grid": grid}, (n, c, h, w)))

    def reduce_sum(self, name: str, src: str) -> str:
        """Sum over H and W, keeping dims: (1, C, 1, 1). Sums are where dynamic range bites."""
        n, c, _, _ = self.shape(src)
        return self._add(Layer(name, "reduce_sum", (src,), {}, {}, (n, c, 1, 1)))

    # --- joins and the head ---------------------------------------------------------------
    def _binary(self, kind: str, name: str, a: str, b: str) -> str:
        """Element-wise op; `b` may also be per-channel (1, C, 1, 1), broadcast over H and W."""
        sa, sb = self.shape(a), self.shape(b)
        per_channel = len(sa) == 4 and sb == (sa[0], sa[1], 1, 1)
        if sa != sb and not per_channel:
            raise ValueError(f"{self.name}/{name}: {kind} needs equal shapes or a per-channel second "
                             f"input, got {sa} and {sb}")
        return self._add(Layer(name, kind, (a, b), {}, {}, sa))

    def add(self, name: str, a: str, b: str) -> str:
        return self._binary("add", name, a, b)

    def sub(self, name: str, a: str, b: str) -> str:
        return self._binary("sub", name, a, b)

    def mul(self, name: str, a: str, b: str) -> str:
        return self._binary("mul", name, a, b)

    def div(self, name: str, a: str, b: str) -> str:
        return self._binary("div", name, a, b)

    def concat(self, name: str, srcs: Sequence[str]) -> str:
        """Concatenate along channels."""
        shapes = [self.shape(s) for s in srcs]
        if len({(s[0],) + s[2:] for s in shapes}) != 1:
            raise ValueError(f"{self.name}/{name}: concat inputs differ outside channels: {shapes}")
        channels = sum(s[1] for s in shapes)
        shape = (shapes[0][0], channels) + shapes[0][2:]
        return self._add(Layer(name, "concat", tuple(srcs), {}, {}, shape))

    def softmax(self, name: str, src: str) -> str:
        """Softmax over the channels of a (1, C, 1, 1) tensor."""
        if self.shape(src)[2:] != (1, 1):
            raise ValueError(f"{self.name}/{name}: softmax expects a (1, C, 1, 1) input")
        return self._unary("softmax", name, src)
