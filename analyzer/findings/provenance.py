"""Provenance questions: a run's precision label held against what its bytes show.

`precision_effective` is what the collector read from the engine; the dumped values are the evidence
(layerdiff.analyzer.measure.storage). A run labelled fp16 whose tensors hold values fp16 cannot
represent was stored in fp32 (the x86 MNN wheel said fp16 at cpu/high while computing fp32), and two
runs labelled with different precisions whose every tensor is the same bytes computed the same way:
either label may be wrong, and every verdict that reads "fp16 vs fp32" then compares something else.
Neither is a layer failure, so both are `warn` findings worded as a question about the label.

Cheap on purpose: the storage evidence is measured from a sample (`layerdiff.analyzer.measure.storage
.sampled_evidence`) and stored with the measurement, so a re-judged analysis reads no tensor for it; identity
is first decided from the `/layers` statistics every dump already holds (min, max, mean, std and the counts,
float64 over the whole tensor), then confirmed on sampled values; no tensor is ever read whole a second time.
"""
from __future__ import annotations

import itertools
import json

import numpy as np

from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity
from layerdiff.analyzer.measure.storage import StorageEvidence, sample_values, sampled_evidence

CONFIRM_LAYERS = 8  # identical statistics are confirmed on this many layers' sampled values
STAT_COLUMNS = ("min", "max", "mean", "std", "n_nan", "n_posinf", "n_neginf", "n_zero")
DEFINITE = {"fp16", "bf16", "fp32"}  # a "mixed" or "unknown" measurement proves nothing against a label


def provenance_findings(runs: list, measured: dict[str, StorageEvidence] | None = None) -> list[Finding]:
    """Label-vs-bytes questions for every run, then for every pair of runs with identical bytes.

    `measured`: run label -> its storage evidence as the measurement stored it; a run it lacks (one
    no comparison measured) is sampled here."""
    found = [f for run in runs for f in _label_vs_bytes(run, (measured or {}).get(run.label))]
    return found + _identical_under_other_labels(runs)


def _label(run) -> str:
    return str(run.attrs.get("precision_effective") or "")


def _label_vs_bytes(run, evidence: StorageEvidence | None = None) -> list[Finding]:
    """A label naming a storage format the sampled bytes definitely are not."""
    label = _label(run)
    if not label:
        return []
    evidence = evidence if evidence is not None else sampled_evidence(run)
    measured = evidence.measured()
    if measured not in DEFINITE or evidence.agrees(label):
        return []
    shown = {"fp16": f"{evidence.fp16_exact} of {evidence.informative} sampled tensors hold only fp16 values",
             "bf16": f"{evidence.bf16_exact} of {evidence.informative} sampled tensors hold only bf16 values",
             "fp32": f"only {evidence.fp16_exact} of {evidence.informative} sampled tensors hold only values fp16 "
                     "can represent"}[measured]
    return [Finding(FindingKind.PRECISION_LABEL, run.label, "", "",
                    f"Provenance question for {run.label}: it is labelled precision_effective {label!r}, but its "
                    f"bytes look like {measured} storage ({shown}). Is the label right? What is compared is what "
                    f"the bytes hold, so a verdict read as one about {label} may be about {measured} numbers.",
                    severity=Severity.WARN,
                    numbers={"label": label, "measured": measured, "informative": evidence.informative,
                             "fp16_exact": evidence.fp16_exact, "bf16_exact": evidence.bf16_exact})]


def _identical_under_other_labels(runs: list) -> list[Finding]:
    """Pairs of runs labelled with different precisions whose every layer holds the same values."""
    found = []
    for a, b in itertools.combinations(runs, 2):
        if not _label(a) or not _label(b) or _label(a) == _label(b) or not _same_statistics(a, b):
            continue
        confirmed = _same_samples(a, b)
        if confirmed is None:
            continue
        unreached = _settings_unreached(a, b)
        if unreached is not None:
            found.append(_same_by_design(a, b, unreached, confirmed))
            continue
        found.append(Finding(FindingKind.PRECISION_LABEL, b.label, "", "",
                             f"Provenance question: {a.label} (labelled {_label(a)!r}) and {b.label} (labelled "
                             f"{_label(b)!r}) are bit-identical: all {len(a.layers)} layers have the same statistics "
                             f"and {confirmed} sampled values are the same bits. Two precisions do not compute the "
                             "same bytes: at least one label is wrong, and comparing the two measures nothing.",
                             severity=Severity.WARN,
                             numbers={"runs": [a.label, b.label], "labels": [_label(a), _label(b)],
                                      "layers": len(a.layers), "sampled_values": confirmed}))
    return found


def _settings_unreached(a, b) -> list[str] | None:
    """The op types through which the two runs' precisions could differ, when the dump records them
    (`precision_reach`, declared by the engine) and neither graph holds one: then the two configurations
    are the same computation for this graph (None: they could differ, or nothing is recorded)."""
    ops = _reach(a).get(str(b.attrs.get("precision_requested") or "")) or _reach(b).get(
        str(a.attrs.get("precision_requested") or ""))
    if not ops:
        return None
    present = set(a.layers["op_type"].astype(str)) | set(b.layers["op_type"].astype(str))
    return None if present & set(ops) else list(ops)


def _reach(run) -> dict[str, list[str]]:
    """A dump's `precision_reach` attribute ({other precision: op types}); {} when absent or malformed
    (a dump is untrusted: a bad value makes no finding, it only leaves the question asked)."""
    raw = run.attrs.get("precision_reach")
    try:
        reach = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError:
        return {}
    if not isinstance(reach, dict):
        return {}
    return {str(k): [str(op) for op in v] for k, v in reach.items() if isinstance(v, list)}


def _same_by_design(a, b, ops: list[str], confirmed: int) -> Finding:
    """Identical bytes that the engine's own settings explain: an info, not a question."""
    engine = a.attrs.get("engine") or "the engine"
    return Finding(FindingKind.PRECISION_LABEL, b.label, "", "",
                   f"{a.label} (labelled {_label(a)!r}) and {b.label} (labelled {_label(b)!r}) are bit-identical, as "
                   f"expected for this graph: in {engine} the two precisions differ only through "
                   f"{', '.join(ops)} layers, and this graph has none, so both "
                   "run the same computation and comparing them measures nothing.",
                   severity=Severity.INFO,
                   numbers={"runs": [a.label, b.label], "labels": [_label(a), _label(b)], "layers": len(a.layers),
                            "sampled_values": confirmed, "same_by_design": True, "differing_through": ops})


def _same_statistics(a, b) -> bool:
    """Same layer keys in the same order with equal whole-tensor statistics (NaN equal to NaN)."""
    la, lb = a.layers, b.layers
    if len(la) != len(lb) or len(la) == 0 or list(la["key"]) != list(lb["key"]):
        return False
    for column in STAT_COLUMNS:
        if column in la and column in lb:
            x, y = la[column].to_numpy(dtype=float), lb[column].to_numpy(dtype=float)
            if not np.array_equal(x, y, equal_nan=True):
                return False
    return True


def _same_samples(a, b) -> int | None:
    """Values compared bit for bit on a few layers spread over the run; None when any differs."""
    orders_a, orders_b = a.layers["order"].to_numpy(), b.layers["order"].to_numpy()
    compared = 0
    for i in np.unique(np.linspace(0, len(orders_a) - 1, min(CONFIRM_LAYERS, len(orders_a))).astype(int)):
        x, y = sample_values(a, int(orders_a[i])), sample_values(b, int(orders_b[i]))
        if x is None or y is None or x.shape != y.shape or not np.array_equal(x.view(np.uint64), y.view(np.uint64)):
            return None
        compared += x.size
    return compared
