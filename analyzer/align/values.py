"""The rel L2 between two layers' tensors, as structural matching asks for it: often, and mostly for
pairs that are plainly different tensors.

Structural matching (`layerdiff.analyzer.align.structure`) asks for the values of a few same-shape
candidates per match. At a real input size (PP-OCR det at 800x608: tensors of 2-8 MB) computing
each answer from the full tensors cost ~25 ms, and re-reading tensors from HDF5 through a small
cache dominated a golden analysis (minutes). So:
- every answer is remembered (the same pair is asked for by several neighbouring matches);
- every tensor is read once for a *fingerprint*: its exact L2 norm and a strided sample of at most
  `SAMPLE` elements, kept (16 KB a tensor at most);
- a pair's error is first estimated from the samples, with the exact norm of the reference tensor
  as denominator; only when the estimate is under `SCREEN` (10x the loosest agreement threshold
  the matcher uses) are the full tensors read and the exact rel L2 computed. Unrelated tensors
  (rel L2 ~1 or more) never cost a full read; candidates that may agree are judged exactly.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

SAMPLE = 4_096  # elements of a tensor's fingerprint (stored as float32: 16 KB a tensor)
SCREEN = 0.5  # sampled estimates above this are final: the matcher's thresholds are 0.02 .. 0.1
FULL_CACHE = 6  # full tensors kept per side for exact errors (neighbouring candidates share them) ...
FULL_CACHE_BYTES = 256 << 20  # ... within this many bytes per side (always the last two): huge layers stay bounded


@dataclass
class _Print:
    """One tensor's fingerprint: size, exact L2 norm, and a strided sample (float32)."""

    size: int
    norm: float
    sample: np.ndarray


class ValueErrors:
    """`errors(i, j)`: rel L2 of row j of one run against row i of the reference (inf when unreadable
    or the sizes differ), computed as the module docstring says. `read_base(i)`/`read_other(j)`
    return the tensor of that row of the `/layers` table, or None when it cannot be read."""

    def __init__(self, read_base: Callable[[int], np.ndarray | None],
                 read_other: Callable[[int], np.ndarray | None]) -> None:
        self._read = (read_base, read_other)
        self._prints: tuple[dict[int, _Print | None], dict[int, _Print | None]] = ({}, {})
        self._full: tuple[OrderedDict, OrderedDict] = (OrderedDict(), OrderedDict())
        self._known: dict[tuple[int, int], float] = {}
        self.exact_calls = 0  # how many pairs needed their full tensors (benchmarks print it)

    def __call__(self, i: int, j: int) -> float:
        key = (i, j)
        if key not in self._known:
            self._known[key] = self._compute(i, j)
        return self._known[key]

    @property
    def pairs_asked(self) -> int:
        return len(self._known)

    def _compute(self, i: int, j: int) -> float:
        a, b = self._print(0, i), self._print(1, j)
        if a is None or b is None or a.size != b.size or a.size == 0:
            return math.inf
        if a.norm == 0:
            return 0.0 if b.norm == 0 else math.inf
        estimate = _sampled(a, b)
        if estimate > SCREEN:
            return estimate
        self.exact_calls += 1
        full_a, full_b = self._tensor(0, i), self._tensor(1, j)
        if full_a is None or full_b is None:
            return math.inf
        return _norm(full_a - full_b) / a.norm

    def _print(self, side: int, row: int) -> _Print | None:
        prints = self._prints[side]
        if row not in prints:
            tensor = self._tensor(side, row)
            prints[row] = None if tensor is None else _fingerprint(tensor)
        return prints[row]

    def _tensor(self, side: int, row: int) -> np.ndarray | None:
        """The row's tensor flat (float32, float64 kept), through a small cache of the last few read."""
        cache = self._full[side]
        if row in cache:
            cache.move_to_end(row)
            return cache[row]
        tensor = self._read[side](row)
        flat = None if tensor is None else _flat(tensor)
        cache[row] = flat
        while len(cache) > 2 and (len(cache) > FULL_CACHE or _bytes(cache) > FULL_CACHE_BYTES):
            cache.popitem(last=False)
        return flat


def _bytes(cache: OrderedDict) -> int:
    return sum(t.nbytes for t in cache.values() if t is not None)


def _flat(tensor: np.ndarray) -> np.ndarray:
    """Contiguous 1-d float32 (float64 stays float64): float32 BLAS dots are ~50x faster than
    converting a 2 M-element tensor to float64, and their rounding (~1e-6 relative) is far below
    any threshold the matcher applies."""
    tensor = np.asarray(tensor)
    dtype = np.float64 if tensor.dtype == np.float64 else np.float32
    return np.ascontiguousarray(tensor, dtype=dtype).ravel()


def _norm(flat: np.ndarray) -> float:
    return math.sqrt(max(float(np.dot(flat, flat)), 0.0))


def _fingerprint(flat: np.ndarray) -> _Print:
    step = max(1, flat.size // SAMPLE)
    sample = np.array(flat[::step][:SAMPLE], dtype=np.float32)
    return _Print(int(flat.size), _norm(flat), sample)


def _sampled(a: _Print, b: _Print) -> float:
    """rel L2 estimated from the two samples (same positions: same size, same stride)."""
    scale = math.sqrt(a.size / a.sample.size)
    diff = a.sample.astype(np.float64) - b.sample.astype(np.float64)
    return float(np.linalg.norm(diff)) * scale / a.norm
