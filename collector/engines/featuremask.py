"""An engine whose model file carries a per-layer precision switch (a feature mask) declares it here, for
`collect fix`'s `feature-mask` mechanism (collector/fix/mechanisms.py): the mechanism keeps layers high by writing
a patched copy of the model and knows the engine only through this record (`Engine.feature_mask`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class FeatureMaskModel:
    """How one engine's model files take per-layer masks."""

    layer_names: Callable[[Path], list[str]]  # the model's first file -> its layer names, in file order
    # (model files, {layer: mask}, output folder, file stem) -> the patched model's files, every other byte kept
    write_patched: Callable[[list[Path], dict[str, int], Path, str | None], list[Path]]
    # backend -> whether a layer kept high needs every layer feeding it kept too (it must read fp32 inputs)
    closed_upstream: dict[str, bool]
    high_precision_masks: dict[str, int]  # backend ("cpu" also for the others) -> the mask that keeps a layer high
    describe: Callable[[int], str]  # a mask -> the options it turns off, by name (fix.json's `bits`)

    def high_mask(self, backend: str) -> int:
        return int(self.high_precision_masks.get(backend, self.high_precision_masks["cpu"]))
