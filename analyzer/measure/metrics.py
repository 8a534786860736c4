"""Per-layer error metrics of one run against its reference, in one streaming pass per tensor pair.

Why it is built this way:
- Big layers must cost little more than reading them, so the work runs over cache-sized chunks
  (every operation on a chunk hits L2, not RAM) with scratch buffers reused across chunks, float32
  arithmetic where it is exact enough and float64 only for the running totals.
- A NaN must never hide a failure nor hide in a mean: element pairs whose finiteness differs
  (a NaN or Inf on one side only) count as *infinite* error in max/mean/median/p99 and always fail
  allclose, and make relative L2 infinite and SQNR -inf; pairs that agree (both NaN, same-signed
  Inf) count as equal. Cosine similarity is over the pairs finite on both sides (NaN if none), and NaN
  as soon as one pair's finiteness differs: a cosine of the finite remainder read 0.99999996 on a layer
  whose run was 84% Inf/NaN (ggml seed 004 at x30000), a perfect score for a broken layer. Whether a tensor
  has any non-finite value is known from the precomputed `/layers` stats, so clean tensors take a
  fast path with no per-element finiteness tests.
- median and p99 of |diff| are exact up to `SAMPLE_MAX` elements; above that they come from a
  random sample of about `SAMPLE_MAX` elements drawn evenly from every chunk (fixed seed, rank
  error about 2e-3 for the median, 4e-4 for p99), because the selection was the costliest metric:
  over a 1 MB layer it took longer than all the others together. The sample is sorted (numpy's
  SIMD sort: 1.5x faster than a histogram select, 4x faster than np.partition for these ranks).
- Sums of a chunk run down the columns of a (rows, 1024) view: SIMD adds, twice as fast as
  numpy's pairwise sum, each column a float32 sum of at most 256 values (relative error ~1e-6).
Relative difference follows Polygraphy: |run - ref| / |ref|, with a zero |ref| replaced by
2.2e-16 (computed in float32 for float32 tensors: ratios beyond 3.4e38 read inf). allclose also follows Polygraphy: an element fails when
|diff| > atol AND rel > rtol.
`beyond_scale` is the share of elements off by more than atol + rtol x max|ref| (the tensor's own
scale): what a run's verdict weighs at a model output, where a change small against the whole
output (an fp16 rounding of a 0.05 probability) decides nothing, whatever the value's own size.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from layerdiff.analyzer.measure.tolerances import Tolerances

CHUNK = 1 << 18  # 1 MB of float32: 4x fewer Python steps than 64k elements (a 256 MB layer: 256 chunks, not 1,024), still cache-sized
SAMPLE_MAX = 1 << 16  # quantiles exact up to this many elements, from a sample this big above
SUM_LANES = 1024
EPS = 2.220446049250313e-16
# Relative to the reference tensor's RMS: a reference value smaller than this is negligible against
# its tensor (rel errors divide by at least this much, a flush of such values to 0 is no collapse).
NEGLIGIBLE = 1e-3
FP16_MAX = 65504.0
NAN_FIELDS = ("n_nan", "n_posinf", "n_neginf")


class _Sums:
    """Running totals of one pair over chunks."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.dd = self.aa = self.bb = 0.0  # sum of squares: diff, reference, run (finite pairs)
        self.max_abs = self.max_rel = 0.0
        self.sum_abs = self.sum_rel = 0.0
        self.n_fail = 0
        self.n_beyond_scale = 0  # |diff| > atol + rtol * max|ref| (or non-finite on one side only)
        self.n_finite_pairs = 0
        self.n_mismatch = 0  # non-finite on one side only (or different non-finite values)
        self.zero_collapsed = 0
        self.ref_significant = 0  # reference values above the negligible floor (zero-collapse denominator)
        self.saturated = 0
        self.zero_new = 0  # run exactly 0 where the reference is not (however small): a Log or a Div downstream sees them
        self.out_of_range = 0  # finite run values outside the reference tensor's [min, max]
        self.counts = {k: 0 for k in ("nan_new", "nan_lost", "posinf_new", "posinf_lost", "neginf_new", "neginf_lost")}
        self.samples: list[np.ndarray] = []


class PairKernel:
    """Computes every metric of (reference, run) for one layer; scratch is reused across layers."""

    def __init__(self, tol: Tolerances) -> None:
        self.tol = tol
        self._scratch = [np.empty(CHUNK, np.float32) for _ in range(3)]
        self._flags = [np.empty(CHUNK, np.bool_) for _ in range(2)]

    def compare(self, ref: np.ndarray, run: np.ndarray, ref_stats: dict, run_stats: dict) -> dict:
        """All metrics of one layer pair (shapes already checked equal up to size-1 dims)."""
        x, y = _flat(ref), _flat(run)
        work = np.float32 if x.dtype.itemsize <= 4 and y.dtype.itemsize <= 4 else np.float64
        scratch = self._scratch if work == np.float32 else [np.empty(CHUNK, np.float64) for _ in range(3)]
        s = _Sums(x.size)
        clean = not any(ref_stats.get(k, 0) or run_stats.get(k, 0) for k in NAN_FIELDS)
        options = _ChunkOptions(
            ref_has_zero=bool(ref_stats.get("n_zero", 1)),
            run_has_zero=bool(run_stats.get("n_zero", 1)),
            run_saturated=bool(run_stats.get("n_fp16_saturated", 1)),
            norms_per_chunk=not (clean and _has_moments(ref_stats) and _has_moments(run_stats)),
            floor=NEGLIGIBLE * _rms(x, ref_stats),
            scale_limit=self.tol.atol + self.tol.rtol * _absmax(x, ref_stats),
            ref_range=_range(ref_stats),
        )
        options.range_check = _leaves_range(options.ref_range, run_stats)
        same_dtype = x.dtype == work and y.dtype == work
        with np.errstate(all="ignore"):  # inf/huge ratios are results here, not accidents
            self._stream(s, x, y, work, scratch, clean, options, same_dtype)
            if clean and not math.isfinite(s.dd):  # the stats lied (or a difference overflowed)
                s, clean = _Sums(x.size), False
                options.norms_per_chunk = True
                self._stream(s, x, y, work, scratch, clean, options, same_dtype)
            if work == np.float32 and not all(math.isfinite(v) for v in (s.dd, s.aa, s.bb)):
                # finite values near float32's max (3e38) overflow float32 sums: redo them in float64
                s, options.norms_per_chunk = _Sums(x.size), True
                scratch = [np.empty(CHUNK, np.float64) for _ in range(3)]
                self._stream(s, x, y, np.float64, scratch, clean, options, False)
        if not options.norms_per_chunk:
            s.aa, s.bb = _sum_squares(ref_stats, x.size), _sum_squares(run_stats, y.size)
        result = _finish(s, x.size)
        result["zero_collapse"] = s.zero_collapsed / s.ref_significant if s.ref_significant > 0 else 0.0
        result.update(_range_facts(options.ref_range, run_stats))
        return result

    def _stream(self, s: _Sums, x: np.ndarray, y: np.ndarray, work, scratch, clean: bool,
                options: "_ChunkOptions", same_dtype: bool) -> None:
        """One pass over the pair, chunk by chunk."""
        per_chunk = self._sample_count(x.size)
        for start in range(0, x.size, CHUNK):
            xc, yc = x[start:start + CHUNK], y[start:start + CHUNK]
            if not same_dtype:
                xc, yc = xc.astype(work), yc.astype(work)
            if clean:
                ad = self._finite_chunk(s, xc, yc, scratch, options)
            else:
                ad = self._mixed_chunk(s, xc, yc, scratch, options)
            _take_sample(s, ad, per_chunk)

    def _sample_count(self, n: int) -> int:
        """Elements to sample per chunk (0: keep every |diff|, the quantiles are exact)."""
        if n <= SAMPLE_MAX:
            return 0
        return max(1, SAMPLE_MAX * CHUNK // n)

    def _finite_chunk(self, s: _Sums, x: np.ndarray, y: np.ndarray, scratch, opt: "_ChunkOptions") -> np.ndarray:
        """The fast path: both chunks are known to be finite. Returns |diff| (a scratch view)."""
        n = x.size
        d = np.subtract(y, x, out=scratch[0][:n])
        s.dd += float(np.dot(d, d))
        if opt.norms_per_chunk:
            s.aa += float(np.dot(x, x))
            s.bb += float(np.dot(y, y))
        ad = np.abs(d, out=d)
        chunk_max = float(ad.max()) if n else 0.0
        s.max_abs = max(s.max_abs, chunk_max)
        s.sum_abs += _sum(ad)
        den = np.abs(x, out=scratch[1][:n])
        if opt.floor > 0:  # scale-aware: near-zero references divide by the floor, not by ~0
            np.maximum(den, den.dtype.type(opt.floor), out=den)
        elif opt.ref_has_zero:  # den += EPS * (den == 0): branch-free, 10x faster than a masked copy
            zero = np.equal(den, 0, out=self._flags[0][:n])
            np.add(den, np.multiply(zero, den.dtype.type(EPS), out=scratch[2][:n]), out=den)
        rel = np.divide(ad, den, out=scratch[2][:n])
        chunk_rel_max = float(rel.max()) if n else 0.0
        s.max_rel = max(s.max_rel, chunk_rel_max)
        s.sum_rel += _sum(rel)
        if chunk_max > self.tol.atol and chunk_rel_max > self.tol.rtol:
            over_abs = np.greater(ad, self.tol.atol, out=self._flags[0][:n])
            over_rel = np.greater(rel, self.tol.rtol, out=self._flags[1][:n])
            s.n_fail += int(np.count_nonzero(np.logical_and(over_abs, over_rel, out=over_abs)))
        if chunk_max > opt.scale_limit:
            s.n_beyond_scale += int(np.count_nonzero(np.greater(ad, opt.scale_limit, out=self._flags[0][:n])))
        s.n_finite_pairs += n
        if opt.run_has_zero:  # a collapse counts reference values that matter (above the floor) gone to 0
            # with a floor, den = max(|x|, floor) is above the floor exactly where |x| is: no new |x| pass
            magnitude = den if opt.floor > 0 else np.abs(x, out=scratch[2][:n])  # rel (scratch[2]) is done
            ref_significant = np.greater(magnitude, opt.floor, out=self._flags[1][:n])
            s.ref_significant += int(np.count_nonzero(ref_significant))
            run_zero = np.equal(y, 0, out=self._flags[0][:n])
            s.zero_collapsed += int(np.count_nonzero(np.logical_and(run_zero, ref_significant, out=run_zero)))
            if opt.ref_has_zero:
                run_zero = np.equal(y, 0, out=self._flags[0][:n])
                s.zero_new += int(np.count_nonzero(np.logical_and(run_zero, np.not_equal(x, 0, out=self._flags[1][:n]),
                                                                  out=run_zero)))
            else:  # the reference has no zero at all: every run zero is a new one
                s.zero_new += int(np.count_nonzero(np.equal(y, 0, out=self._flags[0][:n])))
        if opt.range_check:
            lo, hi = opt.ref_range
            s.out_of_range += int(np.count_nonzero(np.less(y, lo, out=self._flags[0][:n])))
            s.out_of_range += int(np.count_nonzero(np.greater(y, hi, out=self._flags[0][:n])))
        if opt.run_saturated:
            s.saturated += int(np.count_nonzero((np.abs(y) == FP16_MAX) & (np.abs(x) > FP16_MAX)))
        return ad

    def _mixed_chunk(self, s: _Sums, x: np.ndarray, y: np.ndarray, scratch, opt: "_ChunkOptions") -> np.ndarray:
        """The slow path for chunks that may hold NaN/Inf: finite pairs go through the fast path."""
        _count_nonfinite(s, x, y)
        both = np.isfinite(x) & np.isfinite(y)
        same = (np.isnan(x) & np.isnan(y)) | (~both & (x == y))
        mismatch = ~both & ~same
        ad = np.zeros(x.size, dtype=x.dtype)
        if both.any():
            fin = self._finite_chunk(s, x[both], y[both], scratch, opt)
            ad[both] = fin
        n_mismatch = int(np.count_nonzero(mismatch))
        if n_mismatch:
            ad[mismatch] = np.inf
            s.n_mismatch += n_mismatch
            s.n_fail += n_mismatch
            s.n_beyond_scale += n_mismatch
        return ad


@dataclass
class _ChunkOptions:
    """Which optional counts a pair needs, decided once per layer from the precomputed stats."""

    ref_has_zero: bool
    run_has_zero: bool
    run_saturated: bool
    norms_per_chunk: bool  # False: |ref|^2 and |run|^2 come from the /layers mean and std
    floor: float = 0.0  # NEGLIGIBLE x the reference's RMS: below it a value is noise against its tensor
    scale_limit: float = math.inf  # atol + rtol x max|ref|: beyond it an element changed against its tensor
    ref_range: tuple[float, float] | None = None  # the reference tensor's finite [min, max]
    range_check: bool = False  # the run's own min/max leave that range: count the values outside it


def _range(stats: dict) -> tuple[float, float] | None:
    """The reference's finite [min, max] from its stored statistics (None when it has no finite value)."""
    lo, hi = stats.get("min"), stats.get("max")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return float(lo), float(hi)


def _leaves_range(ref_range: tuple[float, float] | None, run_stats: dict) -> bool:
    """Whether any run value can lie outside the reference's range (decided from both min/max: most layers
    stay inside, and then no element is tested)."""
    if ref_range is None:
        return False
    lo, hi = run_stats.get("min"), run_stats.get("max")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return True  # unknown: count
    return lo < ref_range[0] or hi > ref_range[1]


def _range_facts(ref_range: tuple[float, float] | None, run_stats: dict) -> dict:
    """Both tensors' finite ranges and how far the run reaches past the reference's, in units of the
    reference's own width (its largest |value| when it is constant): a fact for the findings, which decide
    what counts as out of range (an fp16 rounding of the maximum reaches past it by ~1e-3 of the width)."""
    run_lo, run_hi = (float(run_stats.get(k, math.nan)) for k in ("min", "max"))
    if ref_range is None:
        return {"ref_min": math.nan, "ref_max": math.nan, "run_min": run_lo, "run_max": run_hi, "range_excess": math.nan}
    lo, hi = ref_range
    width = hi - lo or max(abs(lo), abs(hi)) or 1.0
    reach = max(lo - run_lo if math.isfinite(run_lo) else 0.0, run_hi - hi if math.isfinite(run_hi) else 0.0, 0.0)
    return {"ref_min": lo, "ref_max": hi, "run_min": run_lo, "run_max": run_hi, "range_excess": reach / width}


def _rms(x: np.ndarray, stats: dict) -> float:
    """Root mean square of the reference tensor: from the stored moments, else one pass over its finite values."""
    if _has_moments(stats):
        value = math.sqrt(_square_sum(stats["std"], stats["mean"]))
    else:
        squares, count = 0.0, 0
        for chunk in _finite_chunks(x):
            chunk = chunk.astype(np.float64)
            squares, count = squares + float(np.dot(chunk, chunk)), count + chunk.size
        value = math.sqrt(squares / count) if count else 0.0
    return value if math.isfinite(value) else 0.0


def _absmax(x: np.ndarray, stats: dict) -> float:
    """Largest finite |value| of the reference: from the stored min/max, else one pass."""
    lo, hi = stats.get("min"), stats.get("max")
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
        return max(abs(float(lo)), abs(float(hi)))
    return max((float(np.abs(chunk).max()) for chunk in _finite_chunks(x) if chunk.size), default=0.0)


def _finite_chunks(x: np.ndarray) -> Iterator[np.ndarray]:
    """The finite values of `x`, a chunk at a time: a pass over a 256 MB layer must not copy it whole."""
    for start in range(0, x.size, CHUNK):
        chunk = x[start:start + CHUNK]
        yield chunk if np.isfinite(chunk).all() else chunk[np.isfinite(chunk)]


def _has_moments(stats: dict) -> bool:
    return all(k in stats and math.isfinite(stats[k]) for k in ("mean", "std"))


def _sum_squares(stats: dict, n: int) -> float:
    """sum(x^2) = n (std^2 + mean^2), from the float64 moments every dump stores: saves two dot products."""
    return n * _square_sum(stats["std"], stats["mean"])


def _square_sum(std: float, mean: float) -> float:
    """std^2 + mean^2; inf where the squares pass float64's range (moments of values near 1e308, which a dot
    product over the values would overflow to inf as well)."""
    try:
        return std ** 2 + mean ** 2
    except OverflowError:
        return math.inf


def _flat(a: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.dtype.kind not in "f":
        flat = flat.astype(np.float64)
    return flat


def _count_nonfinite(s: _Sums, x: np.ndarray, y: np.ndarray) -> None:
    xn, yn = np.isnan(x), np.isnan(y)
    c = s.counts
    c["nan_new"] += int(np.count_nonzero(yn & ~xn))
    c["nan_lost"] += int(np.count_nonzero(xn & ~yn))
    c["posinf_new"] += int(np.count_nonzero((y == np.inf) & (x != np.inf)))
    c["posinf_lost"] += int(np.count_nonzero((x == np.inf) & (y != np.inf)))
    c["neginf_new"] += int(np.count_nonzero((y == -np.inf) & (x != -np.inf)))
    c["neginf_lost"] += int(np.count_nonzero((x == -np.inf) & (y != -np.inf)))


def _take_sample(s: _Sums, ad: np.ndarray, per_chunk: int) -> None:
    """Keep |diff| for the quantiles: all of it for small tensors, else a random sample per chunk.

    Sampling within each chunk (stratified) costs no global index sort and covers the whole
    tensor evenly, so a region that is off everywhere cannot be missed.
    """
    if per_chunk == 0:
        s.samples.append(ad.copy())
    else:
        s.samples.append(ad[_sample_positions(ad.size, min(per_chunk, ad.size))])


@functools.lru_cache(maxsize=64)
def _sample_positions(size: int, count: int) -> np.ndarray:
    """`count` random positions in a chunk of `size` (with replacement, ascending), the same for every
    chunk of that size: drawing them anew cost as much as the gather, and a fixed seed per (size,
    count) keeps a layer's quantiles independent of the layers measured before it."""
    positions = np.sort(np.random.default_rng((size, count)).integers(0, size, count))
    positions.flags.writeable = False
    return positions


def _finish(s: _Sums, n: int) -> dict:
    """Turn running totals into the metric dict (names documented in REPORT_SCHEMA.md)."""
    inf_if_mismatch = math.inf if s.n_mismatch else None
    mean_abs = s.sum_abs / n if n else 0.0
    mean_rel = s.sum_rel / n if n else 0.0
    median, p99 = _quantiles(s.samples)
    ref_norm = math.sqrt(s.aa)
    return {
        "numel": n,
        "max_abs": inf_if_mismatch or s.max_abs,
        "mean_abs": inf_if_mismatch or mean_abs,
        "median_abs": median,
        "p99_abs": p99,
        "max_rel": inf_if_mismatch or s.max_rel,
        "mean_rel": inf_if_mismatch or mean_rel,
        "rel_l2": math.inf if s.n_mismatch else _ratio(math.sqrt(s.dd), ref_norm),
        "cosine": cosine_from_sums(s.aa, s.bb, s.dd) if s.n_finite_pairs and not s.n_mismatch else math.nan,
        "sqnr_db": -math.inf if s.n_mismatch else _sqnr(s.aa, s.dd),
        "pass_fraction": 1.0 - s.n_fail / n if n else 1.0,
        "n_fail": s.n_fail,
        "beyond_scale": s.n_beyond_scale / n if n else 0.0,
        "n_nonfinite_mismatch": s.n_mismatch,
        **{f"n_{k}": v for k, v in s.counts.items()},
        "n_zero_collapsed": s.zero_collapsed,
        "n_saturated": s.saturated,
        "n_zero_new": s.zero_new,
        "n_out_of_range": s.out_of_range,
    }


def _quantiles(samples: list[np.ndarray]) -> tuple[float, float]:
    """median and p99 as np.quantile gives them: "linear" ranks when every value is finite, "higher"
    when an infinite |diff| is present. The few ranks they read are put in place by one partition
    (half a sort's work, the same values; a NaN goes last, as in a sort)."""
    if not samples:
        return 0.0, 0.0
    values = samples[0] if len(samples) == 1 else np.concatenate(samples)
    n = values.size
    if n == 0:
        return 0.0, 0.0
    ranks = sorted({n - 1, *(r for q in (0.5, 0.99) for r in _ranks(q, n))})
    ordered = np.partition(values, ranks)
    finite = math.isfinite(float(ordered[-1]))
    out = []
    for q in (0.5, 0.99):
        index = q * (n - 1)
        if not finite:
            out.append(float(ordered[math.ceil(index)]))
            continue
        lo = math.floor(index)
        out.append(_lerp(float(ordered[lo]), float(ordered[min(lo + 1, n - 1)]), index - lo))
    return out[0], out[1]


def _ranks(q: float, n: int) -> tuple[int, ...]:
    """The sorted positions the q-quantile of n values reads (linear and "higher" alike)."""
    index = q * (n - 1)
    lo = math.floor(index)
    return lo, min(lo + 1, n - 1), min(math.ceil(index), n - 1)


def _lerp(a: float, b: float, t: float) -> float:
    return a if t == 0.0 or a == b else a + (b - a) * t


def _sum(a: np.ndarray) -> float:
    """Sum of a chunk: float32 SIMD adds down the columns of a (rows, SUM_LANES) view, float64 over the
    columns; numpy's pairwise sum (the remainder, and small chunks) is scalar and twice as slow."""
    whole = a.size - a.size % SUM_LANES
    if whole < 4 * SUM_LANES or a.dtype != np.float32:
        return float(np.add.reduce(a))
    total = float(np.add.reduce(a[:whole].reshape(-1, SUM_LANES), axis=0).sum(dtype=np.float64))
    return total + (float(np.add.reduce(a[whole:])) if whole < a.size else 0.0)


def _ratio(num: float, den: float) -> float:
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def cosine_from_sums(aa: float, bb: float, dd: float) -> float:
    """cos = <a,b>/(|a||b|) with <a,b> = (aa + bb - dd)/2; saves one dot product per element."""
    if aa == 0.0 and bb == 0.0:
        return 1.0
    if aa == 0.0 or bb == 0.0:
        return 0.0
    return max(-1.0, min(1.0, (aa + bb - dd) / (2.0 * math.sqrt(aa) * math.sqrt(bb))))


def _sqnr(aa: float, dd: float) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(|ref|^2 / |run - ref|^2)."""
    if dd == 0.0:
        return math.inf
    if aa == 0.0 or math.isinf(dd):
        return -math.inf if math.isfinite(aa) else math.nan
    if math.isinf(aa):
        return math.inf
    return 10.0 * (math.log10(aa) - math.log10(dd)) if aa / dd == 0.0 else 10.0 * math.log10(aa / dd)
