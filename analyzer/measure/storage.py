"""What precision a run's bytes were stored in, measured from the tensors themselves.

A dump's `precision_effective` is read from the engine (MNN's backend, ncnn's options); the bytes
are the evidence. An engine that stores activations in fp16 (MNN's Arm82 backend, ncnn's fp16
storage, Vulkan fp16 buffers) hands back only values fp16 can hold; bf16 storage leaves the low 16
bits of every float32 zero; fp32 arithmetic leaves almost every computed tensor with values neither
can hold. Tensors whose values are all integers (one-hot, casts, shapes) say nothing either way and
are skipped. `agrees` is what the tests hold every label against.

`sampled_evidence` reads a sample (`SAMPLE_ELEMENTS` values of at most `SAMPLE_LAYERS` layers spread
over execution order), never a big tensor whole; it is part of the measurement
(`layerdiff.analyzer.measure.compare`), stored with it, so judging a label reads no tensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from layerdiff.errors import LayerdiffError

MIN_ELEMENTS = 16  # smaller tensors are too often fp16-exact by chance to count
SHARE = 0.5  # a reduced storage precision: at least this share of informative tensors holds only its values
FP32_SHARE = 0.1  # fp32: at most this share of informative tensors is fp16-exact (by chance: saturated activations)
SAMPLE_LAYERS = 24
SAMPLE_ELEMENTS = 2048


@dataclass(frozen=True)
class StorageEvidence:
    """Counts over a run's informative float tensors: how many hold only fp16 / only bf16 values."""

    informative: int
    fp16_exact: int
    bf16_exact: int

    def measured(self) -> str:
        """`bf16`, `fp16`, `fp32`, or `unknown` (no tensor with non-integer values)."""
        if self.informative == 0:
            return "unknown"
        if self.bf16_exact >= SHARE * self.informative:
            return "bf16"
        if self.fp16_exact >= SHARE * self.informative:
            return "fp16"
        if self.fp16_exact <= FP32_SHARE * self.informative:
            return "fp32"
        return "mixed"

    def agrees(self, label: str) -> bool:
        """Whether a `precision_effective` label says what the bytes show (unknown bytes agree with anything).

        ncnn's `fp16-arith` alone keeps fp32 storage, so only labels naming a storage format are
        held to it: `fp16`, `fp16-storage*` → fp16; `bf16-storage` → bf16; `fp32` → fp32.
        """
        measured = self.measured()
        if measured == "unknown":
            return True
        label = label.lower()
        if label.startswith("bf16"):
            return measured == "bf16"
        if stores_fp16(label):
            return measured in ("fp16", "bf16")  # bf16-exact values with few mantissa bits are fp16-exact too
        if label == "fp32":
            return measured == "fp32"
        return True


def stores_fp16(label: str) -> bool:
    """Whether a `precision_effective` label says activations are stored as fp16 (`fp16`, `fp16-storage*`):
    then a value above 65504 cannot be held between ops. ncnn's `fp16-arith` alone keeps fp32 storage."""
    label = str(label or "").lower()
    return label == "fp16" or label.startswith("fp16-storage")


def storage_evidence(arrays: Iterable[np.ndarray]) -> StorageEvidence:
    """Count informative float32 tensors and how many of them fp16 / bf16 storage could have produced."""
    informative = fp16 = bf16 = 0
    for array in arrays:
        values = np.asarray(array)
        if values.dtype != np.float32 or values.size < MIN_ELEMENTS:
            continue
        finite = values[np.isfinite(values)]
        if finite.size == 0 or np.all(finite == np.round(finite)):
            continue
        informative += 1
        bits = finite.view(np.uint32)
        bf16 += bool(np.all((bits & 0xFFFF) == 0))
        in_range = np.abs(finite) <= 65504
        fp16 += bool(in_range.all() and np.all(finite.astype(np.float16).astype(np.float32) == finite))
    return StorageEvidence(informative, fp16, bf16)


def sampled_evidence(run) -> StorageEvidence:
    """Storage evidence from a sample of the run's float32 layers (never a full read of big tensors)."""
    layers = run.layers
    rows = layers[(layers["dtype"].astype(str) == "float32") & (layers["numel"] >= MIN_ELEMENTS)]
    if rows.empty:
        return StorageEvidence(0, 0, 0)
    picked = rows.iloc[np.unique(np.linspace(0, len(rows) - 1, min(SAMPLE_LAYERS, len(rows))).astype(int))]
    # float32 widened to float64 by `sample` and narrowed back: exact, so the bit tests still hold
    samples = (sample_values(run, int(o)) for o in picked["order"])
    return storage_evidence(s.astype(np.float32) for s in samples if s is not None)


def sample_values(run, order: int) -> np.ndarray | None:
    """A layer's sampled values, or None when the layer cannot be read (over the size limits, damaged):
    a provenance question is never worth aborting the analysis; the measurement says why per layer."""
    try:
        return run.dump.sample(order, SAMPLE_ELEMENTS)
    except (LayerdiffError, OSError, ValueError):
        return None
