"""The two basic sample networks (deterministic recipes: fixed seeds, fixed structure).

Each recipe takes the input shape and returns a `Network`; samples/catalog.py lists every sample
model with its inputs. The scenario networks of the five field reports live in samples/scenarios.py.
"""

from __future__ import annotations

from typing import Sequence

from layerdiff.samples.netdef import NetBuilder, Network

INPUT_SHAPE = (1, 3, 32, 32)


def _residual_block(b: NetBuilder, prefix: str, src: str) -> str:
    """conv+relu -> conv, added to the block input (the add is the branch). No ReLU right after
    the add: MNN's converter would fuse it into the add and the layers would no longer align."""
    channels = b.shape(src)[1]
    x = b.conv(f"{prefix}/conv1", src, channels, activation="relu")
    x = b.conv(f"{prefix}/conv2", x, channels, gain=0.5)
    return b.add(f"{prefix}/add", src, x)


def _head(b: NetBuilder, src: str, classes: int = 10) -> str:
    """1x1 conv+relu -> global average pool -> dense -> softmax named `prob`."""
    x = b.conv("head/conv", src, 32, kernel=1, activation="relu")
    x = b.gap("head/gap", x)
    x = b.dense("head/fc", x, classes)
    return b.softmax("prob", x)


def convnet(input_shape: Sequence[int] = INPUT_SHAPE) -> Network:
    """22 layers: stem, a residual add, a two-branch concat, hardswish, max/avg pooling, a
    sigmoid gate (saturating), clip, a tanh residual and a softmax head."""
    b = NetBuilder("convnet", input_shape, seed=20240601)
    x = b.conv("stem/conv", "data", 8, activation="relu")
    x = b.maxpool("stem/pool", x)                                   # 8 x 16 x 16
    x = _residual_block(b, "block1", x)
    left = b.conv("block2/conv_a", x, 8, kernel=1, activation="relu")
    right = b.conv("block2/conv_b", x, 8, activation="relu")
    x = b.concat("block2/concat", [left, right])                   # 16 x 16 x 16
    x = b.hardswish("block2/hswish", x)
    x = b.avgpool("block2/pool", x)                                 # 16 x 8 x 8
    gate = b.conv("block3/conv", x, 16)
    gate = b.sigmoid("block3/gate", gate)
    x = b.mul("block3/mul", x, gate)
    x = b.clip("block3/clip", x, -1.0, 1.0)
    y = b.conv("block4/conv", x, 16)
    y = b.tanh("block4/tanh", y)
    x = b.add("block4/add", x, y)
    _head(b, x)
    return b.build("prob")


def overflow(input_shape: Sequence[int] = INPUT_SHAPE) -> Network:
    """Like convnet's trunk, but block2/amplify has huge weights: on the sample input its outputs
    reach about 1e6 (past fp16's 65504, far inside fp32) and block2/shrink scales them back to O(1).
    In fp32 everything stays finite; in fp16 block2/amplify overflows to inf, block2/shrink mixes
    +inf and -inf into NaN, and the NaN runs through to `prob`."""
    b = NetBuilder("overflow", input_shape, seed=20240602)
    x = b.conv("stem/conv", "data", 8, activation="relu")
    x = b.maxpool("stem/pool", x)
    x = _residual_block(b, "block1", x)
    x = b.conv("block2/amplify", x, 8, gain=1.0e5)
    x = b.conv("block2/shrink", x, 8, kernel=1, gain=4.0e-5)
    x = b.tanh("block2/tanh", x)
    x = b.avgpool("block2/pool", x)
    _head(b, x)
    return b.build("prob")
