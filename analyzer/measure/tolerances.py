"""What the element-by-element comparison counts as close: allclose's absolute and relative tolerance.

Part of what is measured (the allclose share and the top-1 decision margin are counted with them), so
they key a stored measurement; the thresholds that judge a layer are not. Kept apart from the metric
kernels (layerdiff.analyzer.measure.metrics) so judging a stored measurement imports no kernel."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Tolerances:
    """Per-element tolerances for the allclose pass fraction (see layerdiff.analyzer.measure.metrics)."""

    atol: float = 1e-3
    rtol: float = 1e-2
