"""Findings about byte orders: layers left uncompared because their values could not be put in one
order (a packed form, a basis, an ambiguous axis order: layerdiff.analyzer.align.axes), and
the failing layer whose values are the reference's in a packed channel order.

The second is an engine fault, and a different one from arithmetic: MNN keeps many tensors in its
packed NC4HW4 format (4, 8 or 16 channels interleaved, by CPU) and converts them when an op needs
the graph's order. Measured on MNN 3.6.1 x86 with a pretrained transformer-like classifier (magika's
model: GELU after a Conv): the Add after the Tanh read an NC4HW4 tensor and wrote its packed bytes
into a tensor MNN itself declares NCHW; MNN's next ops read those bytes as declared, so everything
downstream is computed from values in the wrong places (the Mul, the max pool, the logits: the
model's output moves). The dump records the tensor as MNN declares it, so the layer fails; this
finding says why, instead of blaming the op's arithmetic (zero collapse, fp16 underflow).
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity, named
from layerdiff.analyzer.findings.wording import layer_name
from layerdiff.analyzer.formats.layouts import bytes_layout, engine_layout
from layerdiff.analyzer.runs.reference import Pair
from layerdiff.errors import LayerdiffError

PACKS = (4, 8, 16)  # NC4HW4 on ARM/SSE, 8 on AVX2/AVX512 fp32, 16 on AVX512 builds
MAX_CHECKED = 8  # failing layers looked at per pair (the first is nearly always the one)
# Unpacked values this close to the reference are the reference's values: below 5% (an fp16 run's own
# error: 1.1% measured on the emulated cortex-a76, MNN's Arm82 packs by 8) and 20x below the error as recorded.
PACKED_REL_L2 = 0.05
PACKED_GAIN = 20.0


def unpack_channels(array: np.ndarray, pack: int) -> np.ndarray | None:
    """Values stored as [N][C/pack][rest][pack] (MNN's NC4HW4 bytes) put back in the graph's
    [N][C][rest] order; None when the shape has no channel axis divisible by `pack`."""
    if array.ndim < 3 or array.shape[1] % pack or array.shape[1] <= pack:
        return None
    n, c = array.shape[0], array.shape[1]
    rest = int(np.prod(array.shape[2:]))
    return array.reshape(n, c // pack, rest, pack).transpose(0, 1, 3, 2).reshape(array.shape)


def packed_order(reference: np.ndarray, run: np.ndarray) -> tuple[int, float] | None:
    """(pack, rel L2 after unpacking) when the run holds the reference's values in packed channel order."""
    ref = reference.astype(np.float64, copy=False)
    norm = float(np.linalg.norm(ref))
    if norm == 0 or run.shape != reference.shape:
        return None
    as_recorded = float(np.linalg.norm(run.astype(np.float64) - ref)) / norm
    for pack in PACKS:
        unpacked = unpack_channels(run, pack)
        if unpacked is None:
            continue
        rel = float(np.linalg.norm(unpacked.astype(np.float64) - ref)) / norm
        if rel <= PACKED_REL_L2 and rel * PACKED_GAIN <= as_recorded:
            return pack, rel
    return None


def layout_findings(pair: Pair, rows: pd.DataFrame) -> list[Finding]:
    """The uncompared layers of a pair (one finding), then the first failing layer in packed order."""
    return _mismatched(pair, rows) + _packed(pair, rows)


def _mismatched(pair: Pair, rows: pd.DataFrame) -> list[Finding]:
    mismatched = (rows["status"] == "layout_mismatch").to_numpy()
    if not mismatched.any():  # the usual case: no empty frame built and sorted
        return []
    hit = rows[mismatched]
    first = hit.sort_values("position").iloc[0]
    return [Finding(FindingKind.LAYOUT_MISMATCH, pair.other.label, first["key"], first["op_type"],
                    f"{len(hit)} layer(s) of {pair.other.label} were not compared with {pair.base.label} because "
                    f"their values could not be put in one order ({named(list(hit['key']))}: {first['reasons']}); "
                    "a difference of byte order or basis says nothing about an op, so no verdict or blame is "
                    "drawn from them.",
                    severity=Severity.WARN, numbers={"layers": int(len(hit)), "position": int(first["position"])})]


def _packed(pair: Pair, rows: pd.DataFrame) -> list[Finding]:
    """The first failing layer where either side holds the other's values in packed channel order."""
    fails = (rows["status"] == "fail").to_numpy()
    if not fails.any():  # no empty frame built and sorted; itertuples builds a 60-field row type even for no rows
        return []
    failing = rows[fails].sort_values("position").head(MAX_CHECKED)
    for row in failing.itertuples():
        if getattr(row, "permutation", ""):  # measured after a transpose: packing is judged in one axis order only
            continue
        try:
            reference = pair.base.dump.tensor_by_key(row.key)
            run = pair.other.dump.tensor_by_key(row.run_key)
        except (LayerdiffError, KeyError):
            continue
        if run.size != reference.size:
            continue
        run = run.reshape(reference.shape)
        found = packed_order(reference, run)
        if found is not None:
            return [_packed_finding(pair, row, pair.other, row.run_key, pair.base, *found)]
        found = packed_order(run, reference)
        if found is not None:
            return [_packed_finding(pair, row, pair.base, row.key, pair.other, *found)]
    return []


def _packed_finding(pair: Pair, row, mislaid, key: str, other, pack: int, rel: float) -> Finding:
    """The sentence for a layer whose values `mislaid` (one of the pair's runs) holds in packed order."""
    recorded, inputs = _recorded(mislaid, key)
    held = engine_layout(recorded)
    declared = f"in the recorded order ({bytes_layout(recorded)})" + (f"; the engine declares it {held}" if held else "")
    packed_inputs = [f"{name} ({engine_layout(layout)})" for name, layout in inputs
                     if engine_layout(layout) and engine_layout(layout) != held]
    if packed_inputs:
        declared += f"; it read {', '.join(packed_inputs[:2])}"
    role = "reference " if mislaid is pair.base else ""
    return Finding(FindingKind.PACKED_ORDER, pair.other.label, row.key, row.op_type,
                   f"Mislaid layout in {role}{mislaid.label}: layer {layer_name(key, getattr(row, 'op', None))} "
                   f"({row.op_type}) holds {other.label}'s values in channel-packed order (pack {pack}: rel L2 "
                   f"{rel:.2g} once unpacked, {row.rel_l2:.3g} {declared}). {mislaid.label}'s engine wrote "
                   "packed bytes into a tensor it declares in the graph's order: a layout fault of that engine at "
                   "this op, not arithmetic. Its later ops read the tensor as declared, so what they compute from "
                   "it is wrong too; judge the damage at the outputs.",
                   numbers={"pack": pack, "rel_l2_unpacked": rel, "rel_l2": float(row.rel_l2), "mislaid_in": mislaid.label,
                            "recorded_layout": recorded, "position": int(row.position)})


def _recorded(run, key: str) -> tuple[str, list[tuple[str, str]]]:
    """A layer's recorded layout, and its inputs' (name, recorded layout) from the run's own edges."""
    layers = run.layers
    hit = layers[layers["key"] == key]
    if hit.empty:
        return "", []
    try:
        names = json.loads(str(hit.iloc[0]["inputs"]) or "[]")
    except ValueError:
        names = []
    by_name = dict(zip(layers["name"].astype(str), layers["layout"].astype(str)))
    return str(hit.iloc[0]["layout"]), [(n, by_name[n]) for n in names if n in by_name]
