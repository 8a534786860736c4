"""One trial of `collect fix`: the model run on every input with a set of layers kept at high precision.

How a layer is "kept at high precision" is the mechanism the engine's folder names
(layerdiff.collector.fix.mechanisms): a patched model (feature masks), or a what-if that injects the
high-precision run's outputs of those layers into the low-precision run.

A trial's verdict is the relative L2 error of every model output against the high-precision run on
the same input (NaN-safe: NaN/Inf where the reference is finite is infinite error).
"""
from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.vocabulary import RunStatus
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.analysis import PairKernel, Tolerances, run_graph
from layerdiff.collector.transport.devices import Device
from layerdiff.collector.fix.mechanisms import Mechanism, mechanism_for
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.run.pipeline import RunSpec, collect_run


@dataclass
class Trial:
    """The outcome of one set: worst output error per input label, and the dumps it wrote."""

    layers: tuple[str, ...]
    errors: dict[str, float]
    paths: dict[str, Path] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # input label -> why its run failed

    @property
    def worst(self) -> float:
        return max(self.errors.values(), default=0.0)

    def within(self, tolerance: float) -> bool:
        return all(math.isfinite(e) and e <= tolerance for e in self.errors.values())


@dataclass
class TrialRunner:
    """Runs trials on one device/backend/precision; counts harness runs and keeps the latest dumps."""

    device: Device
    model: ModelFiles
    backend: str
    precision: str
    inputs: list[InputSet]
    references: dict[str, Path]  # input label -> high-precision run
    work_dir: Path
    deadline_s: float = 900.0
    runs: int = 0
    trials: int = 0

    def __post_init__(self) -> None:
        self.outputs = {label: output_keys(path) for label, path in self.references.items()}
        self._mechanism: Mechanism | None = None

    @property
    def mechanism(self) -> Mechanism:
        """`collect fix`'s mechanism for the engine, looked up when a trial first needs it (a bisect runner whose
        harness keeps the layers itself never does)."""
        if self._mechanism is None:
            self._mechanism = mechanism_for(self.model.engine)
        return self._mechanism

    def mask(self) -> int:
        return self.mechanism.mask(self.backend)

    def run(self, layers: tuple[str, ...], out_dir: Path | None = None, model: ModelFiles | None = None) -> Trial:
        """Run every input with `layers` (op names) kept high; dumps go to `out_dir` (default: scratch)."""
        self.trials += 1
        out_dir = out_dir or self.work_dir / f"trial{self.trials}"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        trial = Trial(tuple(layers), {})
        for inputs in self.inputs:
            spec = self._spec(layers, inputs, out_dir, model)
            with tempfile.TemporaryDirectory(prefix="layerdiff-fix-") as tmp:
                placed = self._placed_files(inputs.label, tuple(layers), Path(tmp))
                if placed:
                    spec.placed_files = placed
                outcome = collect_run(self.device, spec, out_dir, force=True)
            self.runs += 1
            if outcome.status != RunStatus.DONE or not outcome.paths:
                # a set the engine cannot run (a crash, a refused model) is a set that does not work
                trial.errors[inputs.label] = math.inf
                trial.failures[inputs.label] = outcome.message or "the run failed"
                continue
            trial.paths[inputs.label] = outcome.paths[0]
            trial.errors[inputs.label] = self.output_error(inputs.label, outcome.paths[0])
        return trial

    def _placed_files(self, label: str, layers: tuple[str, ...], tmp: Path) -> dict:
        """Files the mechanism stages beside the model for this trial (MNN's injected outputs)."""
        return self.mechanism.placed_files(self.references[label], layers, tmp)

    def _spec(self, layers: tuple[str, ...], inputs: InputSet, out_dir: Path, model: ModelFiles | None) -> RunSpec:
        """The run of one input with `layers` kept high, as the mechanism makes it (subclasses narrow it)."""
        return self.mechanism.spec(self.model, self.backend, self.precision, tuple(layers), inputs, out_dir,
                                   self.deadline_s, model)

    def output_error(self, label: str, path: Path) -> float:
        """Worst relative L2 over the model's outputs, this run against the reference on the same input."""
        kernel = PairKernel(Tolerances())
        worst = 0.0
        with DumpFile(self.references[label]) as ref, DumpFile(path) as run:
            have = set(run.layers["key"])
            for key in self.outputs[label]:
                if key not in have:
                    return math.inf
                a, b = ref.tensor_by_key(key), run.tensor_by_key(key)
                if a.size != b.size:
                    return math.inf
                worst = max(worst, kernel.compare(a.reshape(-1), b.reshape(-1), {}, {})["rel_l2"])
        return worst


def output_keys(path: Path) -> list[str]:
    """The model's outputs in a dump: the ones it declares, else the layers nothing consumes."""
    with DumpFile(path) as dump:
        return run_graph(dump).outputs()
