"""Matching layers by graph structure when their names say nothing (pnnx renames, ncnn vs ONNX).

pnnx renames every layer (`convrelu_0`, `hswish_19`), so an ncnn model it wrote shares no name with
the ONNX model it came from; the ONNX Runtime golden of that model cannot be aligned by name. Both
still compute the same tensors in nearly the same order, so the layers are matched by what they
are instead:
1. a *monotone sequence alignment* of the two execution orders (Needleman-Wunsch with free gaps)
   where two layers can only match when their shapes agree (exactly, or once size-1 dims are
   dropped, since ncnn stores no batch dim; when both runs name their axes, in one axis order: an NHWC
   tensor is looked at as NCHW, `layerdiff.analyzer.align.axes`) and score higher when their op types agree (`op_class`
   folds the vocabularies of ONNX, ncnn, MNN and pnnx into one) and their relative positions are
   close. Among equally good partners the *later* tensor wins: a converter that fuses Conv+BN+ReLU
   writes the tensor of the last fused node, never the first;
2. *graph propagation* for the layers the monotone pass missed because engines order parallel
   branches differently: a leftover layer matches the one leftover candidate of the same shape
   whose nearest matched producers are the counterparts of its own.
3. *settling* each match among the same-shape candidates between its neighbours (a fused or
   decomposed op leaves a chain of same-shape tensors on one side: Conv, BN, ReLU; Add, Clip, Mul,
   Div for HardSwish): the one whose values agree wins when the tensors can be read, then the one
   every graph edge agrees with (`layerdiff.analyzer.align.edges`), then op kind and arithmetic, then the later
   tensor. Values only choose: a match every edge agrees with is kept whatever its values, so a
   broken kernel (whose output and every tensor after it agree with nothing) still meets its
   structural partner and fails there, unless values name another partner (a same-shape twin
   nearby or on a parallel branch) or the error reaches none of the layers it feeds
   (`layerdiff.analyzer.align.twins`). A guess neither values nor edges confirm is dropped (listed
   unmatched) unless it is the only same-shape candidate on both sides and its error is one of
   precision, not of a different tensor.
Every match carries a confidence in (0, 1]: shape agreement x op-type agreement, divided by the
number of equally plausible candidates between the neighbouring matches; a value-confirmed match
is not ambiguous; one only edges confirm counts 0.9 of that, shared among the candidates every
edge agrees with.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from typing import Callable

from layerdiff.analyzer.align.axes import canonical_shape, names_axes, recorded_layouts
from layerdiff.analyzer.align.edges import EdgeCheck, Matches
from layerdiff.analyzer.align.naming import NEUTRAL, PairNaming
from layerdiff.analyzer.formats.opkinds import arithmetic, op_class, type_agreement, weighted  # noqa: F401 (op_class, type_agreement: API)
from layerdiff.analyzer.align.propagate import propagate
from layerdiff.analyzer.align.twins import MAX_VALUE_CANDIDATES, consumers_agree, siblings, twin_elsewhere

# The pair's engines' helper ops (align/naming.py) that only copy another layer's tensor are never matched by
# structure (they would steal matches); their layout copies are paired only when values confirm them (quality
# capped under the certain level).
RELAYOUT_QUALITY = 0.69
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
# A match every graph edge agrees with is kept without value agreement (a truly wrong layer), at this
# share of its shape x type quality, when that quality says the op types do not contradict each other.
STRUCTURE_ONLY = 0.9
MIN_CERTAIN_QUALITY = 0.7
OTHER_OUTPUT = 0.6  # two outputs of multi-output ops with different indexes: possible, never certain
OTHER_ARITHMETIC = 0.6  # both ops say which arithmetic they do, and it differs (Mul vs add_3): never certain
MAX_CELLS = 30_000_000  # n x m above this: too big to align by structure (the DP table is n x m)


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _features(layers: pd.DataFrame, index: list[int], canonical: bool = False,
              naming: PairNaming = NEUTRAL) -> pd.DataFrame:
    part = layers.iloc[index]
    shapes = [_parse_shape(s) for s in part["shape"]]
    if canonical:  # shapes in one axis order (NHWC as NCHW), as both runs name their axes
        every = recorded_layouts(layers)
        layouts = [every[i] for i in index]
        shapes = [canonical_shape(shape, layout) for shape, layout in zip(shapes, layouts)]
    return pd.DataFrame({
        "row": index,
        "shape": shapes,
        "squeezed": [squeezed(s) for s in shapes],
        "cls": [op_class(t, o) for t, o in zip(part["op_type"], part["op"])],
        # what the tensor's own name says it is (Paddle names a decomposed HardSwish's Div `hardswish_3.tmp_0`)
        "name_cls": [op_class("", o) for o in part["op"]],
        "arithmetic": [arithmetic(t, o) for t, o in zip(part["op_type"], part["op"])],
        "position": np.linspace(0.0, 1.0, len(index)) if len(index) > 1 else np.zeros(len(index)),
        # the output index of a multi-output op (an LSTM's Y, Y_h, Y_c), -1 for single-output ops
        # computed from nothing (a constant, or an input layer): never the partner of a computed layer
        "relayout": [naming.has_role(str(o), "relayout") for o in part["op"]],
        "source": [_no_inputs(cell) for cell in part["inputs"]] if "inputs" in part else [False] * len(index),
        "output": np.where(part["op"].duplicated(keep=False), part["output_index"].astype(int), -1),
    })


def _no_inputs(cell) -> bool:
    try:
        return json.loads(cell) == [] if cell else True
    except (json.JSONDecodeError, TypeError):
        return False


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
    classes = sorted(set(fa["cls"]) | set(fb["cls"]) | set(fa["name_cls"]) | set(fb["name_cls"]))
    agreement = np.array([[type_agreement(x, y) for y in classes] for x in classes])
    index = {c: k for k, c in enumerate(classes)}
    kinds_a, kinds_b = _kind_pairs(fa, index), _kind_pairs(fb, index)  # (type class, name class) per row
    ids_a, ids_b = (np.unique(k, axis=0, return_inverse=True) for k in (kinds_a, kinds_b))
    best = np.maximum.reduce([agreement[ids_a[0][:, x]][:, ids_b[0][:, y]] for x in (0, 1) for y in (0, 1)])
    agreement = best[ids_a[1].reshape(-1)[:, None], ids_b[1].reshape(-1)[None, :]]  # one n x m gather
    shape_q = np.where(ea[:, None] == eb[None, :], 1.0, 0.9)
    quality = shape_q * (0.5 + 0.5 * agreement)
    words = {w: k for k, w in enumerate(sorted(set(fa["arithmetic"]) | set(fb["arithmetic"])))}
    wa, wb = (np.array([words[w] if w else -1 for w in f["arithmetic"]]) for f in (fa, fb))
    quality[(wa[:, None] >= 0) & (wb[None, :] >= 0) & (wa[:, None] != wb[None, :])] *= OTHER_ARITHMETIC
    relayout = fa["relayout"].to_numpy(bool)[:, None] | fb["relayout"].to_numpy(bool)[None, :]
    quality[relayout] = np.minimum(quality[relayout], RELAYOUT_QUALITY)
    src_a, src_b = fa["source"].to_numpy(bool), fb["source"].to_numpy(bool)
    if src_a.sum() < len(src_a) and src_b.sum() < len(src_b):  # both dumps store edges
        quality[src_a[:, None] != src_b[None, :]] = 0.0
    oa, ob = fa["output"].to_numpy(), fb["output"].to_numpy()
    quality[(oa[:, None] >= 0) & (ob[None, :] >= 0) & (oa[:, None] != ob[None, :])] *= OTHER_OUTPUT
    quality[sa[:, None] != sb[None, :]] = 0.0
    quality[[len(s) == 0 for s in fa["shape"]], :] = 0.0  # a layer without a known shape matches nothing
    position = np.abs(fa["position"].to_numpy()[:, None] - fb["position"].to_numpy()[None, :])
    position = np.maximum(position - POSITION_SLACK, 0.0)
    later = LATER_BIAS * (fa["position"].to_numpy()[:, None] + fb["position"].to_numpy()[None, :])
    score = np.where(quality > 0, quality - MATCH_COST - POSITION_WEIGHT * position * quality + later, -np.inf)
    return score, quality


def _kind_pairs(features: pd.DataFrame, index: dict[str, int]) -> np.ndarray:
    """Per row, the class its type says and the one its name says (the type's when the name says none)."""
    return np.array([[index[c], index[n or c]] for c, n in zip(features["cls"], features["name_cls"])],
                    dtype=int).reshape(-1, 2)


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
                       fp32: bool = False, progress: Callable[[int, int], None] | None = None,
                       use_edges: bool = True, naming: PairNaming = NEUTRAL) -> dict[int, tuple[int, float]]:
    """Match the leftover rows `base_left` of `base` with `other_left` of `other`: {base row: (other row, confidence)}.

    `error(base row, other row)`, when given, is the rel L2 between the two tensors (inf if unreadable).
    `fp32`: both runs compute in fp32, so values must agree closely (VALUES_AGREE_FP32) and no match
    is kept that values do not confirm. `progress(done, total)` hears each settled match.
    `use_edges=False` when most layers matched by name: edges then only reach the nearest structural
    match by walking through the name-matched layers (a walk over the graph per candidate), and
    the caller keeps value-confirmed matches only. `naming`: the pair's name rules (its engines' helper ops)."""
    agree = VALUES_AGREE_FP32 if fp32 else VALUES_AGREE
    keep = VALUES_AGREE_FP32 if fp32 else KEEP_UNCONFIRMED_ERROR
    base_ops, other_ops = base["op"].to_numpy(), other["op"].to_numpy()
    base_left = [i for i in base_left if not naming.has_role(str(base_ops[i]), "copy")]
    other_left = [j for j in other_left if not naming.has_role(str(other_ops[j]), "copy")]
    if not base_left or not other_left or len(base_left) * len(other_left) > MAX_CELLS:
        return {}
    canonical = names_axes(recorded_layouts(base)) and names_axes(recorded_layouts(other))
    fa, fb = _features(base, base_left, canonical, naming), _features(other, other_left, canonical, naming)
    score, quality = _score_matrix(fa, fb)
    pairs = _monotone_alignment(score)
    confidences = _confidences(pairs, quality)
    edges = EdgeCheck.of(base, other, base_left, other_left, weighted) if use_edges else None
    local_error = None if error is None else (lambda i, j: error(base_left[i], other_left[j]))  # noqa: E731
    pairs, confidences = _settle(pairs, confidences, quality, local_error, edges, agree, keep, progress)
    if local_error is not None:
        pairs, confidences = _fill_gaps_by_values(pairs, confidences, quality, local_error, agree)
    pairs, confidences = _match_final_outputs(pairs, confidences, quality, local_error, agree)
    result = {base_left[i]: (other_left[j], conf) for (i, j), conf in zip(pairs, confidences)}
    result.update(propagate(base, other, base_left, other_left, result, quality, error, agree))
    return result


def _settle(pairs: list[tuple[int, int]], confidences: list[float], quality: np.ndarray,
            error: Callable[[int, int], float] | None, edges: EdgeCheck | None, agree: float = VALUES_AGREE,
            keep: float = KEEP_UNCONFIRMED_ERROR,
            progress: Callable[[int, int], None] | None = None) -> tuple[list[tuple[int, int]], list[float]]:
    """Per match, the best same-shape candidate between its neighbours (on either side), then whether to keep it.

    Candidates rank by values agreeing, then by how many graph edges agree (`layerdiff.analyzer.align.edges`), then
    the later tensor. A candidate whose edges all agree is kept whatever its values: a broken
    kernel must meet its partner and fail there. One with no value agreement and no edge
    certainty is dropped (listed unmatched) unless the old single-candidate rule keeps it."""
    current, current_conf = list(pairs), list(confidences)
    total = 2 * len(current)
    for final in (False, True):  # the first pass only re-chooses, so the second judges with settled neighbours
        kept: list[tuple[int, int]] = []
        kept_conf: list[float] = []
        state = _SettleState(edges.matches(current) if edges is not None else None)
        done = 0 if not final else total // 2
        for k, ((i, j), conf) in enumerate(zip(current, current_conf)):
            if progress is not None:
                progress(done + k, total)
            state.leave(i, j)
            judged = _judge_options(k, kept, current, quality, error, edges, agree, state)
            if not judged:
                continue
            best = max(judged, key=lambda p: judged[p].rank)
            verdict = judged[best]
            if verdict.agrees:
                chosen, chosen_conf = best, float(quality[best])
            elif verdict.certain:
                rivals = sum(1 for v in judged.values() if v.certain)
                chosen, chosen_conf = best, STRUCTURE_ONLY * float(quality[best]) / rivals
            elif not final or error is None:
                chosen, chosen_conf = best, conf
            elif conf >= KEEP_UNCONFIRMED and list(judged) == [(i, j)] and verdict.error <= keep:
                chosen, chosen_conf = (i, j), conf
            else:
                continue
            kept.append(chosen)
            kept_conf.append(chosen_conf)
            state.keep(*chosen)
        current, current_conf = kept, kept_conf
    return current, current_conf


class _SettleState:
    """What a settling pass has decided so far, kept up to date per match (rebuilding the used rows and
    the mapping for every match made a pass quadratic in layers): the rows kept on each side, and the
    matches the edges are checked against (those kept, then the ones still to judge)."""

    def __init__(self, matches: Matches | None) -> None:
        self.used_a: set[int] = set()
        self.used_b: set[int] = set()
        self.matches = matches

    def leave(self, i: int, j: int) -> None:
        """The match about to be judged leaves the mapping its candidates are checked against."""
        if self.matches is not None:
            self.matches.remove(i, j)

    def keep(self, i: int, j: int) -> None:
        self.used_a.add(i)
        self.used_b.add(j)
        if self.matches is not None:
            self.matches.add(i, j)


@dataclass
class _Verdict:
    """How one candidate pair fares: its values' rel L2, whether they agree, its edges' agreement."""

    error: float
    agrees: bool
    edges_agreeing: int
    edges_checked: int
    quality: float
    later: int

    @property
    def certain(self) -> bool:
        return self.edges_checked > 0 and self.edges_agreeing == self.edges_checked

    @property
    def rank(self) -> tuple:
        share = self.edges_agreeing / self.edges_checked if self.edges_checked else 0.0
        if self.agrees:  # the closest values, then the later tensor (a model output copied by an Identity)
            return True, share, -self.error, 0.0, self.later
        return False, share, 0.0, self.quality, self.later


def _judge_options(k: int, kept: list[tuple[int, int]], current: list[tuple[int, int]], quality: np.ndarray,
                   error: Callable[[int, int], float] | None, edges: EdgeCheck | None,
                   agree: float, state: _SettleState) -> dict[tuple[int, int], _Verdict]:
    """The candidates for match k (between the last kept match and the next current one), judged."""
    n, m = quality.shape
    i, j = current[k]
    low_a, low_b = (kept[-1][0] + 1, kept[-1][1] + 1) if kept else (0, 0)
    high_a, high_b = current[k + 1] if k + 1 < len(current) else (n, m)
    used_a, used_b = state.used_a, state.used_b
    options = [(i, c) for c in range(low_b, high_b) if quality[i, c] > 0 and c not in used_b]
    options += [(c, j) for c in range(low_a, high_a)
                if c != i and quality[c, j] > 0 and c not in used_a]
    if (i, j) not in options and i not in used_a and j not in used_b and quality[i, j] > 0:
        options.append((i, j))
    options = sorted(options, key=lambda p: abs(p[0] - i) + abs(p[1] - j))[:MAX_VALUE_CANDIDATES]
    out = {}
    for p in options:
        err = error(*p) if error is not None else math.inf
        agreeing, checked = edges.consistency(p, state.matches) if edges is not None else (0, 0)
        if quality[p] < MIN_CERTAIN_QUALITY or (err > agree and twin_elsewhere(
                p, quality, error, agree, (low_a, high_a), (low_b, high_b), siblings(p, edges, state.matches))):
            agreeing = 0  # types contradict each other, or values name another partner: edges cannot carry it
        elif err > agree and agreeing == checked > 0 and consumers_agree(p, error, edges, state.matches, agree):
            agreeing = 0  # the error goes nowhere: two decompositions' different inner tensors, not a broken op
        out[p] = _Verdict(err, err <= agree, agreeing, checked, round(float(quality[p]), 6), p[0] + p[1])
    return out


def _match_final_outputs(pairs: list[tuple[int, int]], confidences: list[float], quality: np.ndarray,
                         error: Callable[[int, int], float] | None = None,
                         agree: float = VALUES_AGREE) -> tuple[list[tuple[int, int]], list[float]]:
    """The last tensor of both runs is the model output: pair them when both are left and shapes agree.

    A low-precision run's output may be too far from the golden for values to confirm it, yet it is
    the tensor the verdict most depends on; being last on both sides is evidence enough. When the
    other run's last tensor went to the op whose copy is the reference's output (MNN writes the
    model output as an `Output` copy of the Softmax; ncnn's Softmax is its last layer), the copy
    takes it over if its values are as close: otherwise the reference's output is never compared."""
    n, m = quality.shape
    if not n or not m or quality[n - 1, m - 1] <= 0:
        return pairs, confidences
    if pairs and pairs[-1][1] == m - 1 and pairs[-1][0] < n - 1 and error is not None:
        err = error(n - 1, m - 1)
        if err <= agree and err <= error(pairs[-1][0], m - 1):
            return pairs[:-1] + [(n - 1, m - 1)], confidences[:-1] + [confidences[-1]]
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
            options = (np.flatnonzero(quality[last + 1:a1, j] > 0)[:2 * MAX_VALUE_CANDIDATES] + last + 1).tolist()
            errors = {i: error(i, j) for i in options}
            best = min(errors, key=lambda i: (errors[i], -i), default=None)
            if best is not None and errors[best] <= agree:
                found.append(((best, j), float(quality[best, j])))
                last = best
    merged = sorted(list(zip(pairs, confidences)) + found)
    return [p for p, _c in merged], [c for _p, c in merged]
