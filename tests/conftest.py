"""Shared fixtures: the sample models, and local-device runs made once per test session."""
from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import numpy as np
import pytest

from layerdiff.collector.transport.arm64 import Arm64Device
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"
MODELS = SAMPLES / "models"

# A suite started as a background job (`bash .ci/run &`) inherits SIGINT ignored, and so would every
# child it starts; the Ctrl-C tests need it delivered the way a terminal delivers it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = [p for p in ("tests.standin.fixtures",) if importlib.util.find_spec(p) is not None]


def sample_input(stem: str) -> np.ndarray:
    return np.load(SAMPLES / "inputs" / f"{stem}.npy")


@pytest.fixture(scope="session")
def local_runs(tmp_path_factory):
    """`local_runs(model, backend, precision)` → path of an HDF5 dump, each configuration run once."""
    out = tmp_path_factory.mktemp("local-runs")
    cache: dict[tuple, Path] = {}
    device = LocalDevice()

    def run(model: str, backend: str, precision: str) -> Path:
        key = (model, backend, precision)
        if key not in cache:
            files = resolve_model(MODELS / model)
            stem = Path(model).stem
            inputs = InputSet(stem, {"data": sample_input(stem)}, f"samples/inputs/{stem}.npy")
            outcome = collect_run(device, RunSpec(files, backend, precision, inputs), out)
            assert outcome.status == "done", outcome.message
            cache[key] = outcome.paths[0]
        return cache[key]

    return run


@pytest.fixture(scope="session")
def arm64_runs(tmp_path_factory):
    """`arm64_runs(cpu, model, precision)` → HDF5 path, each configuration run once under qemu."""
    out = tmp_path_factory.mktemp("arm64-runs")
    cache: dict[tuple, Path] = {}

    def run(cpu: str, model: str, precision: str) -> Path:
        key = (cpu, model, precision)
        if key not in cache:
            stem = Path(model).stem
            inputs = InputSet(stem, {"data": sample_input(stem)}, f"samples/inputs/{stem}.npy")
            outcome = collect_run(Arm64Device(cpu), RunSpec(resolve_model(MODELS / model), "cpu", precision, inputs),
                                  out / cpu)
            assert outcome.status == "done", outcome.message
            cache[key] = outcome.paths[0]
        return cache[key]

    return run
