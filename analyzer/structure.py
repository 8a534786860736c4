"""Matching layers by graph structure when their names say nothing (pnnx renames, ncnn vs ONNX).

pnnx renames every layer (`convrelu_0`, `hswish_19`), so an ncnn model it wrote shares no name with
the ONNX model it came from; the ONNX Runtime golden of that model cannot be aligned by name. Both
still compute the same tensors in nearly the same order, so the layers are matched by what they
are instead:
1. a *monotone sequence alignment* of the two execution orders (Needleman-Wunsch with free gaps)
   where two layers can only match when their shapes agree (exactly, or once size-1 dims are
   dropped, since ncnn stores no batch dim) and score higher when their op types agree (`op_class`
   folds the vocabularies of ONNX, ncnn, MNN and pnnx into one) and their relative positions are
   close. Among equally good partners the *later* tensor wins: a converter that fuses Conv+BN+ReLU
   writes the tensor of the last fused node, never the first;
2. *graph propagation* for the layers the monotone pass missed because engines order parallel
   branches differently: a leftover layer matches the one leftover candidate of the same shape
   whose nearest matched producers are the counterparts of its own.
3. when the tensors can be read, *values settle ambiguity*: among the same-shape candidates between
   a match's neighbours (a fused or decomposed op leaves a chain of same-shape tensors on one side:
   Conv, BN, ReLU; Erf, Mul, Add for GELU), the one whose values agree wins. Values only choose
   among structurally possible partners, so an inaccurate op still meets its structural partner and
   fails there; a guess that no value confirms is dropped (listed unmatched) unless it is the only
   same-shape candidate on both sides and its error is one of precision, not of a different tensor.
Every match carries a confidence in (0, 1]: shape agreement x op-type agreement, divided by the
number of equally plausible candidates between the neighbouring matches; a value-confirmed match
is not ambiguous.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from typing import Callable

from analyzer.graph import build_graph

# Op types (lower case, from ONNX, ncnn, MNN, pnnx and exporter names) -> one class per kind of op.
_CLASS_WORDS: dict[str, tuple[str, ...]] = {
    "conv": ("conv", "convolution", "convolutiondepthwise", "deconvolution", "deconvolutiondepthwise",
             "convtranspose", "innerproduct", "gemm", "matmul", "linear", "fc", "conv2d", "depthwise_conv2d",
             "convbn2d", "convrelu", "convdwrelu", "convdw", "fcrelu", "nn.conv2d", "nn.linear", "f.linear"),
    "norm": ("batchnormalization", "batchnorm", "batch_norm", "bn", "scale", "layernorm", "layer_norm", "ln",
             "instancenormalization", "instancenorm", "groupnorm", "layernormalization", "normalize"),
    "act": ("relu", "relu6", "clip", "sigmoid", "hardsigmoid", "hard_sigmoid", "hswish", "hsigmoid",
            "hardswish", "hard_swish", "swish", "silu", "gelu", "tanh", "leakyrelu", "prelu", "elu", "mish",
            "selu", "softplus", "erf", "unaryop", "f.relu", "f.hardswish", "f.hardsigmoid", "f.gelu", "hs"),
    "eltwise": ("add", "sub", "mul", "div", "pow", "sqrt", "binaryop", "eltwise", "expression", "pnnx.expression",
                "elementwise_add", "elementwise_mul", "elementwise_div", "elementwise_sub", "tmp", "exp", "log",
                "abs", "neg", "reciprocal", "max", "min", "where"),
    "pool": ("pooling", "maxpool", "averagepool", "globalaveragepool", "globalmaxpool", "pool", "pool2d", "gap",
             "adaptive_avg_pool2d", "f.adaptive_avg_pool2d", "reduction", "reducemean", "reducesum",
             "reducemax", "reduce_mean", "mean"),
    "layout": ("reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose", "raster", "expanddims",
               "view", "shufflechannel", "tensor.view", "torch.permute", "torch.flatten", "transpose2"),
    "concat": ("concat", "torch.cat", "cat"),
    "slice": ("slice", "crop", "split", "gather", "torch.split", "chunk"),
    "resize": ("resize", "interp", "upsample", "f.interpolate", "nearest_interp", "bilinear_interp"),
    "softmax": ("softmax", "f.softmax", "logsoftmax"),
    "attention": ("multiheadattention", "attention", "nn.multiheadattention"),
    "copy": ("identity", "noop", "dropout"),
}
_CLASS_OF = {word: cls for cls, words in _CLASS_WORDS.items() for word in words}
# Classes one converter's fused or decomposed op can stand for on the other side.
_FUSABLE = {frozenset(p) for p in (("conv", "norm"), ("conv", "act"), ("conv", "eltwise"), ("norm", "eltwise"),
                                   ("act", "eltwise"), ("norm", "act"), ("attention", "eltwise"),
                                   ("attention", "conv"), ("attention", "layout"), ("layout", "slice"),
                                   ("pool", "eltwise"), ("layout", "eltwise"), ("softmax", "eltwise"))}
# Layers that only copy another layer's tensor: never matched by structure (they would steal matches).
_COPIES = re.compile(r"^splitncnn_(input)?\d+$")
_FUSED_ACT = re.compile(r"^(conv|convdw|deconv|deconvdw|fc|gemm|linear)(relu|relu6|sigmoid|swish|hswish|clip|"
                        r"leakyrelu|prelu|elu|mish|gelu|tanh)_\d+$")
_NAME_WORD = re.compile(r"([a-z][a-z0-9_]*?)(?:_output|_\d|[.@:]|$)")
POSITION_WEIGHT = 0.005  # weak: constants (weights) in a golden shift positions; order is kept by the DP
POSITION_SLACK = 0.05  # relative positions closer than this cost nothing: the later-tensor rule decides
LATER_BIAS = 1e-2
MATCH_COST = 0.7  # a match must beat this quality to be worth making: weakly typed pairs are left unmatched
VALUES_AGREE = 0.05  # rel L2 under which two tensors are the same one computed twice (a reduced precision)
VALUES_AGREE_FP32 = 0.02  # the same between two fp32 runs: an SE block's conv before its bias Add differs by 0.03
# A match no candidate's values confirm is kept only when structure is sure of it (typed, the only
# same-shape candidate on both sides between its neighbours) and its error is that of an inaccurate
# op, not of a different tensor (unrelated tensors differ by rel L2 ~1 or more).
KEEP_UNCONFIRMED = 0.75
KEEP_UNCONFIRMED_ERROR = 0.1
MAX_VALUE_CANDIDATES = 12
MAX_CELLS = 30_000_000  # n x m above this: too big to align by structure (the DP table is n x m)


def op_class(op_type: str, op: str = "") -> str:
    """The kind of op (`conv`, `act`, ...), from its type, else from the words of its name; '' if unknown.

    A conv whose name says it carries a fused activation (pnnx's `convrelu_3`, `fcrelu_0`) writes the
    activation's tensor, so it is an `act` for matching."""
    if _FUSED_ACT.match(str(op).rsplit("/", 1)[-1].lower()):
        return "act"
    for text in (op_type, op.rsplit("/", 1)[-1]):
        text = str(text or "").strip().lower()
        if not text:
            continue
        if text in _CLASS_OF:
            return _CLASS_OF[text]
        match = _NAME_WORD.match(text)
        if match and match.group(1) in _CLASS_OF:
            return _CLASS_OF[match.group(1)]
    return ""


def type_agreement(a: str, b: str) -> float:
    """1 same class or a conv and the norm converters fold into it, 0.6 one unknown, 0.5 one op fused
    into or decomposed as the other, 0.2 otherwise."""
    if a and a == b or {a, b} == {"conv", "norm"}:
        return 1.0
    if not a or not b or "copy" in (a, b):
        return 0.6
    return 0.5 if frozenset((a, b)) in _FUSABLE else 0.2


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _features(layers: pd.DataFrame, index: list[int]) -> pd.DataFrame:
    part = layers.iloc[index]
    shapes = [_parse_shape(s) for s in part["shape"]]
    return pd.DataFrame({
        "row": index,
        "shape": shapes,
        "squeezed": [squeezed(s) for s in shapes],
        "cls": [op_class(t, o) for t, o in zip(part["op_type"], part["op"])],
        "position": np.linspace(0.0, 1.0, len(index)) if len(index) > 1 else np.zeros(len(index)),
    })


def _parse_shape(cell) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in json.loads(cell))
    except (json.JSONDecodeError, TypeError, ValueError):
        return ()


def _score_matrix(fa: pd.DataFrame, fb: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Score of matching a[i] with b[j] (-inf when shapes disagree) and the quality part alone."""
    shape_ids: dict[tuple, int] = {}
    sa = np.array([shape_ids.setdefault(s, len(shape_ids)) for s in fa["squeezed"]])
    sb = np.array([shape_ids.setdefault(s, len(shape_ids)) for s in fb["squeezed"]])
    exact_ids: dict[tuple, int] = {}
    ea = np.array([exact_ids.setdefault(s, len(exact_ids)) for s in fa["shape"]])
    eb = np.array([exact_ids.setdefault(s, len(exact_ids)) for s in fb["shape"]])
    classes = sorted(set(fa["cls"]) | set(fb["cls"]))
    agreement = np.array([[type_agreement(x, y) for y in classes] for x in classes])
    ca = np.array([classes.index(c) for c in fa["cls"]], dtype=int)
    cb = np.array([classes.index(c) for c in fb["cls"]], dtype=int)
    shape_q = np.where(ea[:, None] == eb[None, :], 1.0, 0.9)
    quality = shape_q * (0.5 + 0.5 * agreement[ca][:, cb])
    quality[sa[:, None] != sb[None, :]] = 0.0
    quality[[len(s) == 0 for s in fa["shape"]], :] = 0.0  # a layer without a known shape matches nothing
    position = np.abs(fa["position"].to_numpy()[:, None] - fb["position"].to_numpy()[None, :])
    position = np.maximum(position - POSITION_SLACK, 0.0)
    later = LATER_BIAS * (fa["position"].to_numpy()[:, None] + fb["position"].to_numpy()[None, :])
    score = np.where(quality > 0, quality - MATCH_COST - POSITION_WEIGHT * position * quality + later, -np.inf)
    return score, quality


def _monotone_alignment(score: np.ndarray) -> list[tuple[int, int]]:
    """Best order-preserving matching with free gaps; each DP row is one vectorised running max."""
    n, m = score.shape
    table = np.zeros((n + 1, m + 1))
    for i in range(1, n + 1):
        step = np.maximum(table[i - 1, 1:], table[i - 1, :-1] + score[i - 1])
        table[i, 1:] = np.maximum.accumulate(np.maximum(step, 0.0))
    pairs: list[tuple[int, int]] = []
    i, j = n, m
    while i > 0 and j > 0:
        if table[i, j] == table[i - 1, j]:
            i -= 1
        elif table[i, j] == table[i, j - 1]:
            j -= 1
        else:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
    return pairs[::-1]


def _confidences(pairs: list[tuple[int, int]], quality: np.ndarray) -> list[float]:
    """Quality of each match divided by the number of equally good candidates between its neighbours."""
    out: list[float] = []
    m = quality.shape[1]
    for k, (i, j) in enumerate(pairs):
        low = pairs[k - 1][1] + 1 if k else 0
        high = pairs[k + 1][1] if k + 1 < len(pairs) else m
        rivals = int(np.count_nonzero(quality[i, low:high] >= quality[i, j] - 1e-9))
        out.append(float(quality[i, j]) / max(rivals, 1))
    return out


def match_by_structure(base: pd.DataFrame, other: pd.DataFrame, base_left: list[int],
                       other_left: list[int], error: Callable[[int, int], float] | None = None,
                       fp32: bool = False) -> dict[int, tuple[int, float]]:
    """Match the leftover rows `base_left` of `base` with `other_left` of `other`: {base row: (other row, confidence)}.

    `error(base row, other row)`, when given, is the rel L2 between the two tensors (inf if unreadable).
    `fp32`: both runs compute in fp32, so values must agree closely (VALUES_AGREE_FP32) and no match
    is kept that values do not confirm."""
    agree = VALUES_AGREE_FP32 if fp32 else VALUES_AGREE
    keep = VALUES_AGREE_FP32 if fp32 else KEEP_UNCONFIRMED_ERROR
    base_left = [i for i in base_left if not _COPIES.match(str(base["op"].iloc[i]))]
    other_left = [j for j in other_left if not _COPIES.match(str(other["op"].iloc[j]))]
    if not base_left or not other_left or len(base_left) * len(other_left) > MAX_CELLS:
        return {}
    fa, fb = _features(base, base_left), _features(other, other_left)
    score, quality = _score_matrix(fa, fb)
    pairs = _monotone_alignment(score)
    confidences = _confidences(pairs, quality)
    if error is not None:
        local_error = lambda i, j: error(base_left[i], other_left[j])  # noqa: E731
        pairs, confidences = _refine_by_values(pairs, confidences, quality, local_error, agree, keep)
        pairs, confidences = _fill_gaps_by_values(pairs, confidences, quality, local_error, agree)
    pairs, confidences = _match_final_outputs(pairs, confidences, quality)
    result = {base_left[i]: (other_left[j], conf) for (i, j), conf in zip(pairs, confidences)}
    result.update(_propagate(base, other, base_left, other_left, result, quality, error, agree))
    return result


def _refine_by_values(pairs: list[tuple[int, int]], confidences: list[float], quality: np.ndarray,
                      error: Callable[[int, int], float], agree: float = VALUES_AGREE,
                      keep: float = KEEP_UNCONFIRMED_ERROR) -> tuple[list[tuple[int, int]], list[float]]:
    """Per match, the same-shape candidate between its neighbours (on either side) whose values agree."""
    n, m = quality.shape
    used_a: set[int] = set()
    used_b: set[int] = set()
    kept: list[tuple[int, int]] = []
    kept_conf: list[float] = []
    for k, ((i, j), conf) in enumerate(zip(pairs, confidences)):
        low_a, low_b = (pairs[k - 1][0] + 1, pairs[k - 1][1] + 1) if k else (0, 0)
        high_a, high_b = pairs[k + 1] if k + 1 < len(pairs) else (n, m)
        options = [(i, c) for c in range(low_b, high_b) if quality[i, c] > 0 and c not in used_b]
        options += [(c, j) for c in range(low_a, high_a) if c != i and quality[c, j] > 0 and c not in used_a]
        options = sorted(options, key=lambda p: abs(p[0] - i) + abs(p[1] - j))[:MAX_VALUE_CANDIDATES]
        errors = {p: error(*p) for p in options}
        best = min(errors, key=lambda p: (errors[p], -p[0] - p[1]), default=None)
        if best is not None and errors[best] <= agree:
            chosen, chosen_conf = best, float(quality[best])
        elif (conf >= KEEP_UNCONFIRMED and options == [(i, j)] and errors[(i, j)] <= keep
              and i not in used_a and j not in used_b):
            chosen, chosen_conf = (i, j), conf
        else:
            continue
        kept.append(chosen)
        kept_conf.append(chosen_conf)
        used_a.add(chosen[0])
        used_b.add(chosen[1])
    return kept, kept_conf


def _match_final_outputs(pairs: list[tuple[int, int]], confidences: list[float],
                         quality: np.ndarray) -> tuple[list[tuple[int, int]], list[float]]:
    """The last tensor of both runs is the model output: pair them when both are left and shapes agree.

    A low-precision run's output may be too far from the golden for values to confirm it, yet it is
    the tensor the verdict most depends on; being last on both sides is evidence enough."""
    n, m = quality.shape
    if not n or not m or quality[n - 1, m - 1] <= 0:
        return pairs, confidences
    if not pairs or any(i == n - 1 or j == m - 1 for i, j in pairs):  # unrelated runs share no output either
        return pairs, confidences
    return pairs + [(n - 1, m - 1)], confidences + [0.9 * float(quality[n - 1, m - 1])]


def _fill_gaps_by_values(pairs: list[tuple[int, int]], confidences: list[float], quality: np.ndarray,
                         error: Callable[[int, int], float],
                         agree: float = VALUES_AGREE) -> tuple[list[tuple[int, int]], list[float]]:
    """Between consecutive matches, pair the leftovers whose values agree (in order, same shape only)."""
    n, m = quality.shape
    bounds = [(-1, -1), *pairs, (n, m)]
    found: list[tuple[tuple[int, int], float]] = []
    for (a0, b0), (a1, b1) in zip(bounds, bounds[1:]):
        last = a0
        for j in range(b0 + 1, b1):
            options = [i for i in range(last + 1, a1) if quality[i, j] > 0][:2 * MAX_VALUE_CANDIDATES]
            errors = {i: error(i, j) for i in options}
            best = min(errors, key=lambda i: (errors[i], -i), default=None)
            if best is not None and errors[best] <= agree:
                found.append(((best, j), float(quality[best, j])))
                last = best
    merged = sorted(list(zip(pairs, confidences)) + found)
    return [p for p, _c in merged], [c for _p, c in merged]


def _propagate(base: pd.DataFrame, other: pd.DataFrame, base_left: list[int], other_left: list[int],
               done: dict[int, tuple[int, float]], quality: np.ndarray,
               error: Callable[[int, int], float] | None = None,
               agree: float = VALUES_AGREE) -> dict[int, tuple[int, float]]:
    """Leftovers whose nearest matched producers map onto those of exactly one same-shape candidate
    (whose values agree, when they can be read: a fused op's consumer has the same feeders)."""
    graph_a, graph_b = build_graph(base), build_graph(other)
    if not (graph_a.has_edges and graph_b.has_edges):
        return {}
    keys_a, keys_b = list(base["key"]), list(other["key"])
    found: dict[int, tuple[int, float]] = {}
    for _ in range(4):  # each round can anchor the next layers of a branch
        pairs = done | found
        to_b = {keys_a[i]: keys_b[j] for i, (j, _c) in pairs.items()}
        used_b = {j for j, _c in pairs.values()}
        known_a, known_b = set(to_b), set(to_b.values())
        added = 0
        for ia, i in enumerate(base_left):
            if i in pairs:
                continue
            feeders = {to_b[k] for k in graph_a.upstream(keys_a[i], known_a)}
            if not feeders:
                continue
            candidates = [(jb, j) for jb, j in enumerate(other_left) if j not in used_b and quality[ia, jb] > 0
                          and set(graph_b.upstream(keys_b[j], known_b)) == feeders]
            if len(candidates) == 1 and (error is None or error(i, candidates[0][1]) <= agree):
                jb, j = candidates[0]
                found[i] = (j, 0.8 * float(quality[ia, jb]))
                used_b.add(j)
                added += 1
        if not added:
            break
    return found
