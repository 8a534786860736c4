"""The finding record: one thing worth telling the user, as a sentence and as data.

Its own module because every module that produces findings (findings.py: per-layer questions,
trends.py: how the error develops over depth and inputs) and every writer (tables, report, JSON)
shares it, and none of them should import the others for it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum

MAX_NAMED = 4  # layers named in one sentence before "..."


class FindingKind(StrEnum):
    """What a finding is about; the value is what results.json, --json and the report's sections carry.

    Declared in report order (most important first): `KIND_ORDER` is this order."""

    INCOMPLETE_RUN = "incomplete_run"
    BACKEND_FALLBACK = "backend_fallback"
    SPLIT_GRAPH = "split_graph"  # a GPU accelerator ran part of the graph on the CPU (observability.py)
    OBSERVATION_CHANGED = "observation_changed"  # the dumped run's outputs differ from a plain run's (observability.py)
    OUTPUT_UNMATCHED = "output_unmatched"
    PRECISION_LABEL = "precision_label"  # a run's precision label disagrees with its bytes (provenance.py)
    OUTPUT_DECISION = "output_decision"
    NAN_ORIGIN = "nan_origin"
    INF_ORIGIN = "inf_origin"
    SATURATION = "saturation"
    PACKED_ORDER = "packed_order"  # a failing layer holding the reference's values in packed order (layouts.py)
    FAILURE_SOURCE = "failure_source"
    FIRST_DIVERGENCE = "first_divergence"
    RELEASE_PARTING = "release_parting"  # two releases of one engine: the first layer where they part (versions.py)
    LAYER_DIVERGENCE = "layer_divergence"
    LAYOUT_MISMATCH = "layout_mismatch"  # layers not compared: their recorded byte orders differ (layouts.py)
    ISOLATION = "isolation"
    ZERO_COLLAPSE_ORIGIN = "zero_collapse_origin"
    ERROR_GROWTH = "error_growth"
    NONDETERMINISM = "nondeterminism"
    RUN_SPREAD = "run_spread"  # how far repeats of one configuration land apart (spread.py)
    VARYING_OP = "varying_op"  # the first op whose output differs between repeats (repeatops.py)
    INPUT_DEPENDENCE = "input_dependence"
    FLEET = "fleet"  # one configuration's verdicts differ between GPU driver identities (fleet.py)
    DATASET = "dataset"  # one configuration over many inputs: counts, worst input, layers failing most (datasets.py)
    FP16_RISK = "fp16_risk"
    ERROR_CURVE = "error_curve"
    CPU_BY_DESIGN = "cpu_by_design"  # a GPU run's nodes the engine always computes on the CPU (runs/placement.py)


class Severity(StrEnum):
    """How loud a finding is: `fail` and `warn` are the layer statuses it reports, `info` explains."""

    FAIL = "fail"
    WARN = "warn"
    INFO = "info"


@dataclass
class Finding:
    """One thing worth telling the user, as a sentence and as data (`--json` prints `as_dict`)."""

    kind: FindingKind | str
    run: str
    layer: str
    op_type: str
    sentence: str
    severity: Severity | str = Severity.FAIL
    numbers: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Plain strings from callers become the enums (same values, so every file stays identical)."""
        self.kind = FindingKind(self.kind)
        if self.severity in Severity._value2member_map_:  # a status read from data stays as it is otherwise
            self.severity = Severity(self.severity)

    def as_dict(self) -> dict:
        return asdict(self)


def named(keys: list[str]) -> str:
    """'a:0, b:0, c:0' for a sentence, cut after a few names."""
    return ", ".join(keys[:MAX_NAMED]) + (", ..." if len(keys) > MAX_NAMED else "")
