"""Next-token logits (a language model's output), compared the way llama.cpp users compare two runs.

A language model's output is a score per vocabulary entry (262,144 for Gemma 3) at each position. Its
elements are not the result: a q8_0 KV cache moves ~40% of the logits beyond 1% of the largest while
the next token and its probability stay put. What a user reads is the next token (the argmax, what
greedy decoding emits) and how far the whole distribution moved, which llama.cpp's own tool
(`llama-perplexity --kl-divergence`) measures as the KL divergence of the run's softmax from the
reference's, in nats, per position. So:

- a position decides only when the reference's two best logits are further apart than the output's
  tolerance (atol + rtol x max|ref|), as for class scores (classes.py); a flip there changes the text;
- KL(ref || run) of the softmaxes (float64, a few positions at a time: a position is 1 MB of logits);
- `kld_warn` / `kld_fail` (task options) bound the mean over positions.
"""
from __future__ import annotations

import math

import numpy as np

from layerdiff.analyzer.measure.classes import squeezed

ROWS_AT_ONCE = 16


def as_positions(logits: np.ndarray) -> np.ndarray:
    """[positions, vocabulary] (float64 rows are made per chunk): a single position's [vocab] is one row."""
    x = squeezed(logits)
    return x.reshape(1, -1) if x.ndim == 1 else x.reshape(-1, x.shape[-1])


def compare_logits(ref: np.ndarray, run: np.ndarray, tolerance: float) -> dict:
    """Next-token agreement and KL divergence of two logit tensors of the same size.

    Returns positions, decided, flips (deciding positions whose next token changed), tie_flips,
    top5 (share of deciding positions whose reference token is among the run's five best), kld_mean,
    kld_max (nats; inf where the run gives a reference token probability 0 or is not finite),
    top1_reference and top1_run (the next token at the last position)."""
    a, b = as_positions(ref), as_positions(run.reshape(ref.shape))
    kld = np.empty(len(a))
    best_a, best_b = np.empty(len(a), np.int64), np.empty(len(a), np.int64)
    gap = np.empty(len(a))
    in_five = np.empty(len(a), bool)
    for start in range(0, len(a), ROWS_AT_ONCE):
        rows = slice(start, start + ROWS_AT_ONCE)
        x, y = a[rows].astype(np.float64), b[rows].astype(np.float64)
        best_a[rows], best_b[rows] = np.argmax(x, axis=1), np.argmax(y, axis=1)
        two = np.partition(x, -2, axis=1)[:, -2:]
        gap[rows] = two[:, 1] - two[:, 0]
        five = np.argpartition(-y, min(4, y.shape[1] - 1), axis=1)[:, :5]
        in_five[rows] = np.any(five == best_a[rows, None], axis=1)
        kld[rows] = _kl_divergence(x, y)
    decided = gap > tolerance
    kept = best_a == best_b
    n_decided = int(decided.sum())
    return {"positions": int(len(a)), "decided": n_decided, "flips": int((decided & ~kept).sum()),
            "tie_flips": int((~decided & ~kept).sum()),
            "top5": float(in_five[decided].mean()) if n_decided else math.nan,
            "kld_mean": float(kld.mean()), "kld_max": float(kld.max()),
            "top1_reference": int(best_a[-1]), "top1_run": int(best_b[-1])}


def _kl_divergence(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """KL(softmax(x) || softmax(y)) per row, in nats (inf when y is not finite where x has mass)."""
    if not np.isfinite(x).all():
        return np.full(len(x), math.nan)
    lx = x - x.max(axis=1, keepdims=True)
    lx -= np.log(np.exp(lx).sum(axis=1, keepdims=True))
    if not np.isfinite(y).all():
        return np.full(len(x), math.inf)
    ly = y - y.max(axis=1, keepdims=True)
    ly -= np.log(np.exp(ly).sum(axis=1, keepdims=True))
    return np.maximum((np.exp(lx) * (lx - ly)).sum(axis=1), 0.0)


def logits_output(names: list[str], ref: list[np.ndarray], declared: set[str] = frozenset()) -> int | None:
    """Which output holds the logits: the one an engine of the pair declares as its language-model output
    (`engine_facts.output_tasks`), else the one output with a last axis of 2 or more entries (None when
    several could be)."""
    ops = [name.split(":", 1)[0] for name in names]
    named = [i for i, op in enumerate(ops) if op in declared]
    if len(named) == 1:
        return named[0]
    candidates = [i for i, x in enumerate(ref) if squeezed(x).shape[-1] >= 2]
    return candidates[0] if len(candidates) == 1 else None


def sentence(name: str, c: dict, kld_warn: float) -> str:
    """'result_output: next token kept at 7 of 7 deciding position(s) (token 236776 at the last); mean KL divergence 0.0099 nats (max 0.0099)'."""
    last = (f"token {c['top1_reference']} at the last" if c["top1_reference"] == c["top1_run"]
            else f"the last position's token {c['top1_reference']} became {c['top1_run']}")
    kept = c["decided"] - c["flips"]
    if c["decided"]:
        tokens = f"next token kept at {kept} of {c['decided']} deciding position(s) ({last})"
    else:  # a flat distribution (an untrained model, a near tie everywhere): no clear next token to keep
        tokens = (f"no position has a clear next token (the reference's two best logits are within the output's "
                  f"tolerance at each of the {c['positions']} position(s); {last})")
    text = f"{name}: {tokens}; mean KL divergence {c['kld_mean']:.3g} nats (max {c['kld_max']:.3g}; warns above {kld_warn:g})"
    if c["tie_flips"]:
        text += f"; {c['tie_flips']} flip(s) at near ties"
    return text
