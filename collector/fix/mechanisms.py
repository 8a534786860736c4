"""How `collect fix` keeps a set of layers at high precision: one mechanism per kind of engine switch, named
by the engine's folder (`Engine.fix_mechanism`), so the search knows no engine.

- `feature-mask`: for real. The trial model is the original with those layers' per-layer feature mask set
  (an engine whose model file carries one declares how in its folder: `Engine.feature_mask`, ncnn's param key 31),
  written beside the trial's dumps and run at the low precision being fixed. A kept layer that must read fp32
  (the engine's `closed_upstream` backends) keeps every layer feeding it too. The fix is a patched model.
- `what-if`: an engine without a per-op precision switch gets the layers' outputs overwritten with the
  high-precision run's (`--inject DIR --replace KEY`, device_scripts/HARNESS_CLI.md); what follows is computed
  at low precision from them. The fix is advice (`Engine.fix_advice`), the numbers a lower bound.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.engines.featuremask import FeatureMaskModel
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import ModelFiles, resolve_model
from layerdiff.collector.run.isolate import write_inject_dump
from layerdiff.collector.run.pipeline import RunSpec
from layerdiff.errors import UsageError


@dataclass(frozen=True)
class FeatureMask:
    """Layers kept high in a patched copy of the model (see the module docstring)."""

    name: str = "feature-mask"
    patches_model: bool = True
    closed_reason: str = ("which needs fp32 inputs on the CPU (the engine casts a 16-bit input to fp32 only for "
                          "layers that keep 16-bit storage)")
    model_masks: FeatureMaskModel | None = None  # the engine's (Engine.feature_mask), filled by mechanism_for

    def closed(self, backend: str) -> bool:
        """Whether a kept layer needs every layer feeding it kept too on `backend`."""
        return bool(self.model_masks.closed_upstream.get(backend, False))

    def layer_total(self, model: ModelFiles, ops: list[str]) -> int:
        return len(self.model_masks.layer_names(model.files[0]))

    def mask(self, backend: str) -> int:
        return self.model_masks.high_mask(backend)

    def describe_mask(self, mask: int) -> str:
        """The options a mask turns off, by name (fix.json's `bits`)."""
        return self.model_masks.describe(mask)

    def write_fix(self, model: ModelFiles, masks: dict[str, int], out_dir: Path, stem: str | None) -> ModelFiles:
        """The patched model: `masks` set on those layers, every other byte as the original."""
        files = self.model_masks.write_patched(list(model.files), masks, out_dir, stem)
        return resolve_model(files[0], model.engine)

    def spec(self, model: ModelFiles, backend: str, precision: str, layers: tuple[str, ...], inputs: InputSet,
             out_dir: Path, deadline_s: float, patched: ModelFiles | None) -> RunSpec:
        if patched is None and not layers:
            patched = model
        if patched is None:
            patched = self.write_fix(model, {op: self.mask(backend) for op in layers}, out_dir, model.stem)
        return RunSpec(patched, backend, precision, inputs, deadline_s=deadline_s,
                       extra_attrs={"fix_layers": list(layers), "fix_mode": self.name})

    def placed_files(self, reference: Path, layers: tuple[str, ...], tmp: Path) -> dict[str, Path]:
        return {}


@dataclass(frozen=True)
class WhatIf:
    """Layers' high-precision outputs injected into the low-precision run (see the module docstring)."""

    name: str = "what-if"
    patches_model: bool = False
    closed_reason: str = ""

    def closed(self, backend: str) -> bool:
        return False

    def layer_total(self, model: ModelFiles, ops: list[str]) -> int:
        return len(ops)

    def spec(self, model: ModelFiles, backend: str, precision: str, layers: tuple[str, ...], inputs: InputSet,
             out_dir: Path, deadline_s: float, patched: ModelFiles | None) -> RunSpec:
        args = ["--inject", "{run_dir}/inject", *[a for op in layers for a in ("--replace", f"{op}:0")]] if layers else []
        return RunSpec(model, backend, precision, inputs, deadline_s=deadline_s, extra_args=args,
                       extra_attrs={"fix_layers": list(layers), "fix_mode": self.name})

    def placed_files(self, reference: Path, layers: tuple[str, ...], tmp: Path) -> dict[str, Path]:
        """The reference's outputs of `layers`, as the raw dump `--replace` reads them from."""
        if not layers:
            return {}
        with DumpFile(reference) as ref:
            names = dict(zip(ref.layers["op"], ref.layers["name"]))
            inject = write_inject_dump(ref, {f"{op}:0": [names[op]] for op in layers}, tmp / "inject")
        return {f"inject/{f.name}": f for f in sorted(inject.iterdir())}


Mechanism = FeatureMask | WhatIf
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (FeatureMask(), WhatIf())}


def mechanism_for(engine: str) -> Mechanism:
    """The mechanism the engine's folder names; a UsageError in one line when it names none."""
    declared = ENGINES[engine].fix_mechanism if engine in ENGINES else ""
    if declared not in MECHANISMS:
        able = ", ".join(name for name, e in ENGINES.items() if e.fix_mechanism in MECHANISMS)
        raise UsageError(f"collect fix has no way to keep single layers of a {engine} model at high precision "
                         f"(engines it can fix: {able})")
    mechanism = MECHANISMS[declared]
    if isinstance(mechanism, FeatureMask):
        if ENGINES[engine].feature_mask is None:
            raise UsageError(f"collect fix cannot patch a {engine} model: its engine declares no feature mask")
        mechanism = replace(mechanism, model_masks=ENGINES[engine].feature_mask())
    return mechanism
