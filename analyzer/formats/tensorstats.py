"""Per-tensor statistics precomputed into every HDF5 dump's `/layers` table.

They let `analyze inspect` and the fp16-risk findings answer without reading tensors, so they are
computed once, at conversion time, in cache-sized chunks: conversion must keep up with the disk
(see tests/bench/bench_convert.py), so each chunk takes a fast path when it has no NaN/Inf and only
pays for the fp16 range counts when its min/max say they can be non-zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 6.103515625e-05  # 2**-14: below this fp16 loses precision, then flushes to zero
CHUNK_ELEMENTS = 1 << 18  # 1 MiB of float32: stays in L2 while the counts run
# Largest |value| whose chunk sums stay exact enough and finite in float32: a chunk's sum of squared
# deviations reaches CHUNK_ELEMENTS x (2 x peak)^2, which passes float32's 3.4e38 near a peak of 1.8e16.
# Beyond it (an attention mask's -3.4e38 bias) the chunk is summed in float64, where it stays finite.
FLOAT32_SAFE_PEAK = 1e15
# Largest |value| whose squared deviations stay finite in float64 over a chunk (CHUNK_ELEMENTS x (2 x peak)^2
# < 1.8e308). Beyond it (float64 values near 1e308) the sums are kept divided by a power of two near the
# peak, so the standard deviation stays finite and exact instead of becoming inf.
FLOAT64_SAFE_PEAK = 1e150


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
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in fields(TensorStats))  # as_dict without asdict's deep copies


class _Accumulator:
    """Running totals over chunks, merged with Chan's formula so mean/std stay exact in float64
    without ever converting a chunk to float64 (that copy alone would halve the throughput)."""

    def __init__(self, size: int, dtype: np.dtype) -> None:
        self.stats = TensorStats()
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # the sum of squared deviations, divided by scale^2
        self.scale = 1.0  # 1 unless a value passed FLOAT64_SAFE_PEAK: then a power of two at least the peak
        self.lo = math.inf
        self.hi = -math.inf
        self.scratch = np.empty(size, dtype=dtype)
        self.mask = np.empty(size, dtype=bool)

    def add_finite(self, chunk: np.ndarray, lo: float, hi: float) -> None:
        s, n = self.stats, chunk.size
        scratch, mask = self.scratch[:n], self.mask[:n]
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        peak = max(-lo, hi)
        if peak > FLOAT64_SAFE_PEAK:  # rare: float64 values near its limit, summed scaled down
            self._rescale(peak)
            wide = chunk / self.scale  # a power of two: exact
            chunk_mean = float(np.add.reduce(wide)) / n * self.scale
            wide -= chunk_mean / self.scale
            self._merge(n, chunk_mean, float(np.dot(wide, wide)), scaled=True)
        elif chunk.dtype == np.float32 and peak > FLOAT32_SAFE_PEAK:
            wide = chunk.astype(np.float64)  # rare: values near float32's limit; the float32 sums would overflow
            chunk_mean = float(np.add.reduce(wide)) / n
            wide -= chunk_mean
            self._merge(n, chunk_mean, float(np.dot(wide, wide)))
        else:
            chunk_mean = float(np.add.reduce(chunk, dtype=np.float64 if chunk.dtype != np.float32 else None)) / n
            np.subtract(chunk, chunk_mean, out=scratch)
            self._merge(n, chunk_mean, float(np.dot(scratch, scratch)))
        zeros = int(np.count_nonzero(np.equal(chunk, 0, out=mask)))
        s.n_zero += zeros
        mags = np.abs(chunk, out=scratch)
        if hi >= FP16_MAX or lo <= -FP16_MAX:
            s.n_fp16_overflow += int(np.count_nonzero(np.greater(mags, FP16_MAX, out=mask)))
            s.n_fp16_saturated += int(np.count_nonzero(np.equal(mags, FP16_MAX, out=mask)))
        if zeros < n:
            s.n_fp16_underflow += int(np.count_nonzero(np.less(mags, FP16_MIN_NORMAL, out=mask))) - zeros

    def _merge(self, n: int, mean: float, m2: float, scaled: bool = False) -> None:
        """Chan's merge of a chunk (`m2` already divided by scale^2 when `scaled`)."""
        total = self.count + n
        delta = mean / self.scale - self.mean / self.scale
        self.m2 += (m2 if scaled else m2 / (self.scale * self.scale)) + delta * delta * self.count * n / total
        self.mean += delta * self.scale * n / total if self.scale != 1.0 else delta * n / total
        self.count = total

    def _rescale(self, peak: float) -> None:
        """Let the kept sums be divided by a power of two of at least half of `peak` (never smaller than
        before; at least `peak` itself could be 2^1024, which float64 does not hold)."""
        scale = math.ldexp(1.0, math.frexp(peak)[1] - 1)
        if scale > self.scale:
            self.m2 *= (self.scale / scale) ** 2
            self.scale = scale

    def add_nonfinite(self, chunk: np.ndarray) -> None:
        s = self.stats
        s.n_nan += int(np.count_nonzero(np.isnan(chunk)))
        s.n_posinf += int(np.count_nonzero(chunk == np.inf))
        s.n_neginf += int(np.count_nonzero(chunk == -np.inf))
        finite = chunk[np.isfinite(chunk)]
        if finite.size:
            self.add_finite(finite, float(finite.min()), float(finite.max()))

    def result(self, numel: int) -> TensorStats:
        s = self.stats
        s.numel = numel
        if self.count:
            s.min, s.max, s.mean = self.lo, self.hi, self.mean
            s.std = math.sqrt(max(self.m2, 0.0) / self.count) * self.scale
        return s


def tensor_stats(array: np.ndarray) -> TensorStats:
    """Statistics of any numeric array, chunk by chunk over its flat view."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.kind not in "f":
        flat = flat.astype(np.float64)
    acc = _Accumulator(min(CHUNK_ELEMENTS, max(flat.size, 1)), flat.dtype)
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        chunk = flat[start : start + CHUNK_ELEMENTS]
        lo, hi = float(chunk.min()), float(chunk.max())
        if math.isfinite(lo) and math.isfinite(hi):
            acc.add_finite(chunk, lo, hi)
        else:
            acc.add_nonfinite(chunk)
    return acc.result(int(flat.size))
