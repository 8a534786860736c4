"""A renamed pair of runs of any length, for measuring how structural matching scales with layers.

Each block is what an ONNX Runtime golden and a pnnx-converted ncnn run of one MobileNetV3-style
unit write: the golden has Conv, BatchNormalization, the decomposed HardSwish (Add 3, Clip, Mul,
Div 6), a second Conv + BatchNormalization and the residual Add (9 layers); ncnn has the fused
conv+bn `conv_<k>`, `hswish_<k>`, the second fused conv and `add_<k>` (4 layers), no name shared.
Every tensor has one shape, so names and shapes leave a choice at every match and values (computed
here with numpy, the ncnn side with 1e-7 relative noise) and edges must settle it.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

SHAPE = (1, 4, 8, 8)


def _hswish(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    t1 = x + 3
    t2 = np.clip(t1, 0, 6)
    t3 = x * t2
    return t1, t2, t3, t3 / 6


class _Side:
    """One run under construction: rows of its `/layers` table and its tensors."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.tensors: list[np.ndarray] = []

    def add(self, name: str, op_type: str, inputs: list[str], value: np.ndarray) -> str:
        self.rows.append({"order": len(self.rows), "key": f"{name}:0", "op": name, "op_type": op_type,
                          "output_index": 0, "name": name, "inputs": json.dumps(inputs),
                          "shape": json.dumps(list(value.shape))})
        self.tensors.append(value.astype(np.float32))
        return name

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def renamed_pair(blocks: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, list[np.ndarray], list[np.ndarray]]:
    """(golden layers, ncnn layers, golden tensors by row, ncnn tensors by row) for `blocks` blocks,
    and the expected pairs are those whose names end in the same block number (see `expected`)."""
    rng = np.random.default_rng(seed)
    golden, ncnn = _Side(), _Side()
    x = rng.standard_normal(SHAPE)
    g_in = golden.add("x", "Input", [], x)
    n_in = ncnn.add("in0", "Input", [], x)
    for k in range(blocks):
        w1, w2 = rng.standard_normal(2) + 1.5
        conv1 = x * w1 + 0.1
        bn1 = conv1 * 0.9 + 0.05
        t1, t2, t3, h = _hswish(bn1)
        conv2 = h * w2 - 0.2
        bn2 = conv2 * 1.1 - 0.05
        r = bn2 + h
        g = golden.add(f"/b{k}/conv1/Conv_output_0", "Conv", [g_in], conv1)
        g = golden.add(f"/b{k}/bn1/BatchNormalization_output_0", "BatchNormalization", [g], bn1)
        a = golden.add(f"/b{k}/act/Add_output_0", "Add", [g], t1)
        c = golden.add(f"/b{k}/act/Clip_output_0", "Clip", [a], t2)
        m = golden.add(f"/b{k}/act/Mul_output_0", "Mul", [g, c], t3)
        hs = golden.add(f"/b{k}/act/Div_output_0", "Div", [m], h)
        g = golden.add(f"/b{k}/conv2/Conv_output_0", "Conv", [hs], conv2)
        g = golden.add(f"/b{k}/bn2/BatchNormalization_output_0", "BatchNormalization", [g], bn2)
        g_in = golden.add(f"/b{k}/Add_output_0", "Add", [g, hs], r)
        noise = lambda v: v * (1 + 1e-7 * rng.standard_normal(v.shape))  # noqa: E731
        n = ncnn.add(f"conv_{2 * k}", "Convolution", [n_in], noise(bn1))
        nh = ncnn.add(f"hswish_{k}", "HardSwish", [n], noise(h))
        n = ncnn.add(f"conv_{2 * k + 1}", "Convolution", [nh], noise(bn2))
        n_in = ncnn.add(f"add_{k}", "BinaryOp", [n, nh], noise(r))
        x = r / max(float(np.abs(r).max()), 1e-6)
    return golden.frame(), ncnn.frame(), golden.tensors, ncnn.tensors


def expected(golden: pd.DataFrame, ncnn: pd.DataFrame) -> dict[str, str]:
    """ncnn key -> the golden key it must be matched with."""
    out = {"in0:0": "x:0"}
    for op in ncnn["op"]:
        kind, _, number = op.partition("_")
        if kind == "conv":
            block, second = divmod(int(number), 2)
            out[f"{op}:0"] = f"/b{block}/bn{second + 1}/BatchNormalization_output_0:0"
        elif kind == "hswish":
            out[f"{op}:0"] = f"/b{number}/act/Div_output_0:0"
        elif kind == "add":
            out[f"{op}:0"] = f"/b{number}/Add_output_0:0"
    return out


def tiled(layers: pd.DataFrame, copies: int) -> tuple[pd.DataFrame, list[int]]:
    """A real run's `/layers` table repeated `copies` times as one longer model (names suffixed
    `#k`, each copy fed by the previous copy's last tensor), and per row the row it repeats (its
    tensor is read from the real dump). Scales a real graph's op, shape and fusion patterns."""
    parts, source = [], []
    names = list(layers["name"])
    last_name = names[-1]
    for k in range(copies):
        part = layers.copy()
        suffix = f"#{k}"

        def rename(cell: str, suffix: str = suffix, k: int = k) -> str:
            inputs = json.loads(cell) if cell else []
            known = set(names)
            out = [f"{n}{suffix}" if n in known else (f"{last_name}#{k - 1}" if k else n) for n in inputs]
            return json.dumps(out)

        part["op"] = [f"{op}{suffix}" for op in part["op"]]
        part["name"] = [f"{n}{suffix}" for n in part["name"]]
        part["key"] = [f"{op}:{i}" for op, i in zip(part["op"], part["output_index"])]
        part["inputs"] = [rename(c) for c in part["inputs"]]
        parts.append(part)
        source.extend(range(len(layers)))
    frame = pd.concat(parts, ignore_index=True)
    frame["order"] = range(len(frame))
    return frame, source
