"""Values an engine never wrote, told by facts: the record every engine writes into its dump.

A dumped value means something only if the engine wrote it in this run. Where an engine reads tensors
back indirectly (an accelerator whose intermediates come back through extra model outputs, a buffer the
engine may leave untouched or reuse), a value can be a sentinel the engine never overwrote, a tensor
fused into another op, or another tensor's bytes left in a reused buffer. Those are told from facts,
never from the values: a sentinel filled into the buffer before the run that is still there after it,
or the engine's own placement and fusion records.

Every engine states in its dump header how it knows (`observability`, analyzer/FORMATS.md §1):
- `written(why)`: the engine hands back each tensor right after the op that produced it, from that op's
  own output (an ONNX Runtime fetch, an MNN after-callback, an ncnn extract): every dumped tensor is
  `written`, and `why` says why that holds for this engine.
- `checked(...)` with the tensors it could not observe, each `hidden(...)` with its state
  (layerdiff.vocabulary.Observability) and the evidence: those are listed in `not_observable` and never
  dumped as values.

The sentinel helpers below are the fill-and-check any engine with writable output buffers uses.
"""
from __future__ import annotations

import numpy as np

from layerdiff.vocabulary import OBSERVABILITY_WORDS, Observability

SENTINELS = (np.nan, -3.0e38)  # float fills of two runs: no computation gives NaN everywhere and then -3e38 everywhere
INT_SENTINELS = (-1234567, 7654321)


def fill(dtype, shape, index: int) -> np.ndarray:
    """The sentinel array of fill `index` (0 or 1) for a buffer of this dtype and shape."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    value = SENTINELS[index] if dtype.kind == "f" else INT_SENTINELS[index] if dtype.kind == "i" else index * 7 + 1
    return np.full(count, value, dtype=dtype).reshape(shape)


def is_fill(array: np.ndarray, index: int) -> np.ndarray:
    """Per element: does it still hold the sentinel of fill `index`."""
    sentinel = fill(array.dtype, array.shape, index)
    return np.isnan(array) if array.dtype.kind == "f" and np.isnan(sentinel).all() else array == sentinel


def untouched(values: dict, index: int) -> set:
    """Keys whose whole buffer still holds the sentinel of fill `index` after a run."""
    return {key for key, array in values.items() if array.size and bool(np.all(is_fill(array, index)))}


def never_written(first: dict, second: dict) -> set:
    """Keys never written in either of two runs whose buffers were filled with the two sentinels (fill 1, then
    fill 0): a value that happens to equal one sentinel cannot equal the other too."""
    return untouched(first, 1) & untouched(second, 0)


def hidden(key: str, name: str, op_type: str, state: Observability, evidence: str, detail: str = "") -> dict:
    """One `not_observable` entry: the tensor, its state, the fact that tells it, and the sentence the report shows."""
    why = OBSERVABILITY_WORDS[state] + (f"; {detail}" if detail else "")
    return {"key": key, "name": name, "op_type": op_type, "state": str(state), "evidence": evidence, "why": why}


def written(why: str) -> dict:
    """The record of an engine whose every dumped tensor was written by the op that produced it, in this run."""
    return {"checked_by": "direct_read", "state": str(Observability.WRITTEN), "written": why, "indirect": False}


def checked(evidence: str, why: str, hidden_entries: list[dict], *, indirect: bool) -> dict:
    """The record of an engine that checked each tensor (`evidence`: sentinel, engine_record): the dumped
    tensors are written (`why`), the listed ones are not observable (their entries go into `not_observable`).
    `indirect`: intermediates are read back through the model's outputs, not from the producing op."""
    states: dict[str, int] = {}
    for entry in hidden_entries:
        states[entry["state"]] = states.get(entry["state"], 0) + 1
    return {"checked_by": evidence, "state": str(Observability.WRITTEN), "written": why, "indirect": indirect,
            "not_observable": states}
