"""A small transformer-like classifier built with the `onnx` package, for layout tests on every engine.

int32 token ids through Gather, LayerNormalization, one attention block (MatMul, Add, 4-D
Reshape/Transpose, Softmax), an erf-GELU MLP, then what made MNN mislay a tensor in magika's
pretrained model: a Conv1d over the sequence followed by a tanh-GELU (Mul, Add, Tanh on 3-D
tensors MNN holds packed), a max over the sequence and a softmax head. Weights are seeded random
numbers scaled so every activation stays in a sane range; nothing is trained and nothing is fetched.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB, SEQ, DIM, HEADS, HIDDEN, CLASSES = 64, 24, 32, 4, 64, 10


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def w(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[0])).astype(np.float32)
    return {
        "emb": (rng.standard_normal((VOCAB, DIM))).astype(np.float32), "ln_g": np.ones(DIM, np.float32),
        "ln_b": np.zeros(DIM, np.float32), "wq": w(DIM, DIM), "wk": w(DIM, DIM), "wv": w(DIM, DIM),
        "wo": w(DIM, DIM), "bq": np.full(DIM, 0.1, np.float32), "w1": w(DIM, HIDDEN), "w2": w(HIDDEN, DIM),
        "conv_w": (rng.standard_normal((DIM, DIM, 3)) / np.sqrt(3 * DIM)).astype(np.float32),
        "conv_b": np.full(DIM, 0.05, np.float32), "head": w(DIM, CLASSES, scale=3.0),
        "shape4": np.array([1, SEQ, HEADS, DIM // HEADS], np.int64), "shape3": np.array([1, SEQ, DIM], np.int64),
        "scale": np.array(1 / np.sqrt(DIM // HEADS), np.float32), "half": np.array(0.5, np.float32),
        "one": np.array(1.0, np.float32), "sqrt2": np.array(np.sqrt(2.0), np.float32),
        "c0": np.array(0.044715, np.float32), "c1": np.array(np.sqrt(2 / np.pi), np.float32),
    }


def _nodes(helper) -> list:
    n = helper.make_node
    return [
        n("Gather", ["emb", "ids"], ["x0"], name="embed"),
        n("LayerNormalization", ["x0", "ln_g", "ln_b"], ["x1"], name="ln1", axis=-1),
        n("MatMul", ["x1", "wq"], ["q0"], name="q_proj"), n("Add", ["q0", "bq"], ["q1"], name="q_bias"),
        n("MatMul", ["x1", "wk"], ["k0"], name="k_proj"), n("MatMul", ["x1", "wv"], ["v0"], name="v_proj"),
        n("Reshape", ["q1", "shape4"], ["q2"], name="q_heads"), n("Transpose", ["q2"], ["q"], name="q_t", perm=[0, 2, 1, 3]),
        n("Reshape", ["k0", "shape4"], ["k2"], name="k_heads"), n("Transpose", ["k2"], ["kt"], name="k_t", perm=[0, 2, 3, 1]),
        n("Reshape", ["v0", "shape4"], ["v2"], name="v_heads"), n("Transpose", ["v2"], ["v"], name="v_t", perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "kt"], ["s0"], name="scores"), n("Mul", ["s0", "scale"], ["s1"], name="scaled"),
        n("Softmax", ["s1"], ["p"], name="attn", axis=-1), n("MatMul", ["p", "v"], ["a0"], name="context"),
        n("Transpose", ["a0"], ["a1"], name="merge_t", perm=[0, 2, 1, 3]),
        n("Reshape", ["a1", "shape3"], ["a2"], name="merge"), n("MatMul", ["a2", "wo"], ["a3"], name="out_proj"),
        n("Add", ["x1", "a3"], ["r1"], name="residual1"),
        n("LayerNormalization", ["r1", "ln_g", "ln_b"], ["x2"], name="ln2", axis=-1),
        n("MatMul", ["x2", "w1"], ["h0"], name="fc1"), n("Div", ["h0", "sqrt2"], ["h1"], name="gelu_div"),
        n("Erf", ["h1"], ["h2"], name="gelu_erf"), n("Add", ["h2", "one"], ["h3"], name="gelu_add"),
        n("Mul", ["h0", "h3"], ["h4"], name="gelu_mul"), n("Mul", ["h4", "half"], ["h5"], name="gelu_half"),
        n("MatMul", ["h5", "w2"], ["m0"], name="fc2"), n("Add", ["r1", "m0"], ["r2"], name="residual2"),
        n("Transpose", ["r2"], ["c_in"], name="to_channels", perm=[0, 2, 1]),
        n("Conv", ["c_in", "conv_w", "conv_b"], ["c0_out"], name="conv", kernel_shape=[3], pads=[1, 1]),
        n("Mul", ["c0_out", "c0_out"], ["t0"], name="tgelu_sq"), n("Mul", ["t0", "c0_out"], ["t1"], name="tgelu_cube"),
        n("Mul", ["t1", "c0"], ["t2"], name="tgelu_c0"), n("Add", ["c0_out", "t2"], ["t3"], name="tgelu_inner"),
        n("Mul", ["t3", "c1"], ["t4"], name="tgelu_c1"), n("Tanh", ["t4"], ["t5"], name="tgelu_tanh"),
        n("Add", ["t5", "one"], ["t6"], name="tgelu_add"), n("Mul", ["t6", "half"], ["t7"], name="tgelu_half"),
        n("Mul", ["c0_out", "t7"], ["t8"], name="tgelu_mul"),
        n("ReduceMax", ["t8"], ["pool"], name="pool", axes=[2], keepdims=0),
        n("MatMul", ["pool", "head"], ["logits"], name="head"), n("Softmax", ["logits"], ["prob"], name="prob", axis=-1),
    ]


def write_transformer(path: Path, seed: int = 0, embedded: bool = False) -> Path:
    """Write the model (opset 17: LayerNormalization) to `path`; returns it.

    `embedded`: the graph starts after the Gather, fed the embeddings `x0` (float [1, SEQ, DIM]):
    pnnx shape-infers with random inputs, and random int32 ids index past the table (it crashes)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = _weights(np.random.default_rng(seed))
    nodes = _nodes(helper)
    if embedded:
        del weights["emb"]
        nodes = nodes[1:]
    source = (helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, SEQ, DIM]) if embedded
              else helper.make_tensor_value_info("ids", TensorProto.INT32, [1, SEQ]))
    graph = helper.make_graph(
        nodes, "tiny_transformer", [source],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, CLASSES])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="layerdiff-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def token_ids(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (1, SEQ)).astype(np.int32)


def embeddings(ids: np.ndarray, seed: int = 0) -> np.ndarray:
    """What the Gather of the full model gives for `ids`: the input of the `embedded` variant."""
    return _weights(np.random.default_rng(seed))["emb"][ids]
