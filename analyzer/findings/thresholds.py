"""The thresholds a layer's status depends on, with their defaults (docs: README "Verdicts").

A module of its own, importing nothing heavy, because a re-analysis answered from a stored report
(`layerdiff.analyzer.report.stored`) must name the very thresholds of the analysis it asks for
without importing the analyzer (pandas, numpy).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layerdiff.analyzer.measure.tolerances import Tolerances


@dataclass
class Thresholds:
    """Every threshold a layer's status depends on (CLI: --atol --rtol --warn-rel-l2 ...)."""

    atol: float = 1e-3  # allclose: an element fails when |diff| > atol ...
    rtol: float = 1e-2  # ... and |diff| / |ref| > rtol (Polygraphy semantics)
    warn_rel_l2: float = 1e-2  # relative L2 error above this warns (SQNR below 40 dB)
    fail_rel_l2: float = 1e-1  # ... above this fails (SQNR below 20 dB)
    min_pass_fraction: float = 0.99  # fewer allclose-passing elements than this warns
    warn_zero_collapse: float = 0.05  # share of the reference's non-zeros that became 0: warn
    fail_zero_collapse: float = 0.5  # ... fail
    underflow_risk_share: float = 0.1  # fp16 risk: share of values in (0, 6.1e-5)
    growth_factor: float = 10.0  # error growth finding: output error / worst input error

    def __post_init__(self) -> None:
        """Checked however they are built (CLI, notebook): NaN or a negative tolerance would judge
        every layer silently wrong (`--atol nan` passes nothing, `--fail-rel-l2 -1` fails everything)."""
        from layerdiff.clioptions import check_number

        for name, value in asdict(self).items():
            flag = f"--{name.replace('_', '-')}"
            if name in ("min_pass_fraction", "underflow_risk_share", "warn_zero_collapse", "fail_zero_collapse"):
                check_number(flag, value, 0.0, 1.0)
            else:
                check_number(flag, value, 0.0)

    @property
    def tolerances(self) -> "Tolerances":
        from layerdiff.analyzer.measure.tolerances import Tolerances  # the measure stage's type, asked for when measuring

        return Tolerances(atol=self.atol, rtol=self.rtol)

    def as_dict(self) -> dict:
        return asdict(self)
