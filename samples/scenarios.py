"""Networks for the five field reports (each shows its effect through real low-precision
arithmetic of an engine on the host; see samples/README.md for what was measured where).

1. `deepnet`    28 layers; cpu/high vs vulkan/low gives an error curve that grows with depth.
2. `convnet_fp16w` (in catalog.py): convnet with weights *stored* as fp16 (ncnn tag 0x01306B47,
   MNN converter `--fp16`), run at high precision next to the fp32-stored original.
3. `sepool`     a squeeze-excitation block whose whole-map average pool sums 16384 values: with fp16
   accumulation (ncnn Vulkan, low) that single op is off by ~60 % while its inputs are off by < 1 %.
4. `underflow`  an energy gate makes activations scale with the cube of the input's scale: a dark
   input drives them below fp16's smallest subnormal (6e-8) so fp16 flushes them to exact zeros.
5. `sizenet`    a spatial sum (ReduceSum) grows with the image area: finite in fp16 at 32x32, past
   65504 at 128x128, so fp16 turns it into inf and the next layer into NaN.
6. `gridwarp`   a near-identity GridSample warp of a wide (32x512) feature map: MNN's fp16 GridSample
   (arm64 cpu/low) places the samples on a quarter-pixel raster and fails while its inputs pass.
"""

from __future__ import annotations

from typing import Sequence

from layerdiff.samples.netdef import NetBuilder, Network

SMALL = (1, 3, 32, 32)


def deepnet(input_shape: Sequence[int] = SMALL) -> Network:
    """31 layers: stem, six residual stages at 16x16 (no pooling in between, so rounding errors
    keep accumulating), alternating hardswish / no activation after each add, softmax head."""
    b = NetBuilder("deepnet", input_shape, seed=20240611)
    x = b.conv("stem/conv", "data", 16, activation="relu")
    x = b.maxpool("stem/pool", x)                                       # 16 x 16 x 16
    for index in range(6):
        stage = f"stage{index + 1}"
        y = b.conv(f"{stage}/conv1", x, 16, activation="relu")
        y = b.conv(f"{stage}/conv2", y, 16, gain=0.7)
        x = b.add(f"{stage}/add", x, y)
        if index % 2 == 0:
            x = b.hardswish(f"{stage}/act", x)
    x = b.conv("head/conv", x, 32, kernel=1, activation="relu")
    x = b.gap("head/gap", x)
    x = b.dense("head/fc", x, 10, gain=0.2)
    b.softmax("prob", x)
    return b.build("prob")


def sepool(input_shape: Sequence[int] = (1, 3, 128, 128)) -> Network:
    """Two convs, a squeeze-excitation gate (whole-map average pool -> 1x1 convs -> sigmoid ->
    per-channel scale), then a benign tail. The pool is the one precision-sensitive op."""
    b = NetBuilder("sepool", input_shape, seed=20240613)
    x = b.conv("stem/conv", "data", 8, activation="relu")
    x = b.conv("block/conv", x, 8, activation="relu")
    g = b.gap("se/pool", x)
    g = b.conv("se/fc1", g, 8, kernel=1, activation="relu")
    g = b.conv("se/fc2", g, 8, kernel=1)
    g = b.sigmoid("se/gate", g)
    x = b.mul("se/scale", x, g)
    x = b.conv("tail/conv", x, 8, activation="relu")
    x = b.maxpool("tail/pool", x, kernel=4)
    x = b.conv("head/conv", x, 16, kernel=1, activation="relu")
    x = b.gap("head/gap", x)
    x = b.dense("head/fc", x, 10)
    b.softmax("prob", x)
    return b.build("prob")


def underflow(input_shape: Sequence[int] = SMALL) -> Network:
    """Bias-free convs (so activations scale with the input) and an energy gate
    gate/scale = features * conv(features * features): cubic in the input's scale."""
    b = NetBuilder("underflow", input_shape, seed=20240614)
    x = b.conv("stem/conv", "data", 8, activation="relu", bias_scale=0.0)
    x = b.conv("enc/conv", x, 8, activation="relu", bias_scale=0.0)
    x = b.avgpool("enc/pool", x)
    e = b.mul("gate/square", x, x)
    e = b.conv("gate/conv", e, 8, kernel=1, activation="relu", bias_scale=0.0)
    x = b.mul("gate/scale", x, e)
    x = b.conv("dec/conv", x, 8, activation="relu", bias_scale=0.0)
    x = b.interp("dec/up", x, 2, mode="bilinear")
    b.conv("image", x, 3, gain=100.0, bias_scale=0.0)
    return b.build("image")


def sizenet(input_shape: Sequence[int] = SMALL) -> Network:
    """Convs, then a spatial ReduceSum (grows with H*W), a 1x1 conv sized for 32x32 sums, tanh and
    a softmax head. Every layer works at any input size; only the sum's magnitude changes."""
    b = NetBuilder("sizenet", input_shape, seed=20240615)
    x = b.conv("stem/conv", "data", 16, activation="relu")
    x = b.conv("enc/conv1", x, 16, activation="relu")
    x = b.conv("enc/conv2", x, 16, activation="relu", gain=8.0)
    s = b.reduce_sum("pool/sum", x)
    s = b.conv("head/fc1", s, 16, kernel=1, gain=1.0 / 4096)
    s = b.tanh("head/tanh", s)
    s = b.dense("head/fc2", s, 10)
    b.softmax("prob", s)
    return b.build("prob")


def gridwarp(input_shape: Sequence[int] = (1, 4, 32, 512)) -> Network:
    """conv -> GridSample (constant near-identity grid, sub-pixel wobble) -> 1x1 conv. The warp is
    the only precision-sensitive op: its input conv only warns in fp16, its output is off by ~50 %."""
    b = NetBuilder("gridwarp", input_shape, seed=20240616)
    x = b.conv("feat", "data", 4)
    x = b.grid_sample("warp", x)
    b.conv("head", x, 4, kernel=1)
    return b.build("head")
