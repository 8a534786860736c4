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


# ---------------------------------------------------------------- harness builds, up front and visible
# A cold run builds ncnn and the C++ harness for the host (with Vulkan) and for aarch64: minutes each,
# which inside a test were silent (pytest captures a test's output). They are built here, after
# collection and before the first test, for the selected tests that use them, with progress lines
# on pytest's own terminal writer (shown with or without -s). Cached builds cost nothing here.
HARNESS_USERS = {  # what in a test module's source means it runs that build
    "host": ("host_harness", "HOST_SPEC", 'HarnessSpec("host"'),
    "aarch64": ("aarch64_harness", "AARCH64_SPEC", 'HarnessSpec("aarch64"'),
    "ggml-host": ("ggml_binary",),
    "ggml-aarch64": ('GgmlSpec("aarch64")', 'engine="ggml"'),
}


class _TerminalBuildReporter:
    """BuildReporter (layerdiff.collector.harness.buildprogress) onto pytest's terminal writer."""

    def __init__(self, terminal, every_s: float = 30.0) -> None:
        from layerdiff.collector.harness.buildprogress import PlainReporter

        self.terminal = terminal
        self.plain = PlainReporter(stream=self, every_s=every_s)

    def write(self, text: str) -> None:  # PlainReporter prints whole lines here
        if text.strip():
            self.terminal.write_line(text.rstrip("\n"), flush=True)

    def flush(self) -> None:
        pass

    def started(self, what):
        self.plain.started(what)

    def update(self, status):
        self.plain.update(status)

    def finished(self, ok, elapsed_s):
        self.plain.finished(ok, elapsed_s)


def _builds_needed(items) -> list[str]:
    sources = {}
    for item in items:
        path = Path(str(item.fspath))
        if path not in sources and path.suffix == ".py":
            sources[path] = path.read_text(errors="replace")
    return [name for name, marks in HARNESS_USERS.items()
            if any(mark in text for text in sources.values() for mark in marks)]


def _build(name: str, reporter) -> None:
    """Build one of HARNESS_USERS' targets unless it is cached (the builders say nothing then)."""
    if name.startswith("ggml-"):
        from layerdiff.collector.engines.ggml.build import GgmlSpec, binary_dir, ensure_built

        spec = GgmlSpec(name.split("-", 1)[1])
        if not (binary_dir(spec) / "layerdiff-ggml").is_file():
            ensure_built(spec, reporter)
        return
    from layerdiff.collector.harness.build import binary_dir, ensure_built
    from tests.test_harness_support import AARCH64_SPEC, HOST_SPEC

    spec = {"host": HOST_SPEC, "aarch64": AARCH64_SPEC}[name]
    if not (binary_dir(spec) / "layerdiff-harness").is_file():
        ensure_built(spec, reporter)


def pytest_collection_finish(session):
    if session.config.option.collectonly or not session.items:
        return
    from layerdiff.collector.harness.build import HarnessError

    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None:
        return
    for name in _builds_needed(session.items):
        try:
            _build(name, _TerminalBuildReporter(terminal))
        except HarnessError as err:  # the tests that need it fail with this reason themselves
            terminal.write_line(f"harness: {err}", red=True, flush=True)
