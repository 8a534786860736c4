"""Per-tensor statistics precomputed into every HDF5 dump's `/layers` table.

They let `analyze inspect` and the fp16-risk findings answer without reading tensors, so they are
computed once, at conversion time, in cache-sized chunks: conversion must keep up with the disk
(see tests/bench/bench_convert.py), so each chunk takes a fast path when it has no NaN/Inf and only
pays for the fp16 range counts when its min/max say they can be non-zero.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.103515625e-05  # 2**-14: below this fp16 loses precision, then flushes to zero
CHUNK_ELEMENTS = 1 << 18  # 1 MiB of float32: stays in L2 while the counts run


@dataclass
class TensorStats:
    """Summary of one tensor; min/max/mean/std are over finite values (NaN if there are none)."""

    numel: int = 0
    min: float = math.nan
    max: float = math.nan
    mean: float = math.nan
    std: float = math.nan
    n_nan: int = 0
    n_posinf: int = 0
    n_neginf: int = 0
    n_zero: int = 0
    n_fp16_overflow: int = 0
    n_fp16_underflow: int = 0
    n_fp16_saturated: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class _Accumulator:
    """Running sums over chunks; float64 totals so long tensors keep their precision."""

    def __init__(self) -> None:
        self.stats = TensorStats()
        self.finite = 0
        self.total = 0.0
        self.total_sq = 0.0
        self.lo = math.inf
        self.hi = -math.inf

    def add_finite(self, chunk: np.ndarray, scratch: np.ndarray) -> None:
        s = self.stats
        n = chunk.size
        lo, hi = float(chunk.min()), float(chunk.max())
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self.finite += n
        as64 = chunk.astype(np.float64, copy=False) if chunk.dtype != np.float64 else chunk
        self.total += float(np.add.reduce(as64))
        self.total_sq += float(np.dot(as64, as64))
        nonzero = int(np.count_nonzero(chunk))
        s.n_zero += n - nonzero
        if hi >= FP16_MAX or lo <= -FP16_MAX:
            mags = np.abs(chunk, out=scratch[:n])
            s.n_fp16_overflow += int(np.count_nonzero(mags > FP16_MAX))
            s.n_fp16_saturated += int(np.count_nonzero(mags == FP16_MAX))
        else:
            mags = np.abs(chunk, out=scratch[:n])
        if nonzero:
            s.n_fp16_underflow += int(np.count_nonzero(mags < FP16_MIN_NORMAL)) - (n - nonzero)

    def add_nonfinite(self, chunk: np.ndarray, scratch: np.ndarray) -> None:
        s = self.stats
        nan = np.isnan(chunk)
        s.n_nan += int(np.count_nonzero(nan))
        s.n_posinf += int(np.count_nonzero(chunk == np.inf))
        s.n_neginf += int(np.count_nonzero(chunk == -np.inf))
        finite = chunk[np.isfinite(chunk)]
        if finite.size:
            self.add_finite(finite, scratch)

    def result(self, numel: int) -> TensorStats:
        s = self.stats
        s.numel = numel
        if self.finite:
            mean = self.total / self.finite
            var = max(self.total_sq / self.finite - mean * mean, 0.0)
            s.min, s.max, s.mean, s.std = self.lo, self.hi, mean, math.sqrt(var)
        return s


def tensor_stats(array: np.ndarray) -> TensorStats:
    """Statistics of any numeric array, chunk by chunk over its flat view."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.kind not in "f":
        flat = flat.astype(np.float64)
    acc = _Accumulator()
    scratch = np.empty(min(CHUNK_ELEMENTS, max(flat.size, 1)), dtype=flat.dtype)
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        chunk = flat[start : start + CHUNK_ELEMENTS]
        lo, hi = chunk.min(), chunk.max()
        if np.isfinite(lo) and np.isfinite(hi):
            acc.add_finite(chunk, scratch)
        else:
            acc.add_nonfinite(chunk, scratch)
    return acc.result(int(flat.size))
