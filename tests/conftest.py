"""Shared fixtures: the sample models, and local-device runs made once per test session."""
from __future__ import annotations

import importlib.util
import os
import queue
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


# ---------------------------------------------------------------- harness builds, beside the tests
# A cold run builds ncnn and the C++ harness for the host (with Vulkan) and for aarch64, and llama.cpp for
# both: minutes each. They are built in a child process while the tests that need no build run (those
# that do are ordered last and wait for theirs), with progress lines on pytest's own terminal writer
# (shown with or without -s). See tests/harness_builds.py. Cached builds cost nothing here.
_MODULE_BUILDS: dict = {}
_BUILDS: list = []  # the session's BackgroundBuilds, once started
_TERMINAL: list = []
_LINES: "queue.Queue[tuple[str, bool]]" = queue.Queue()  # progress lines, printed by the main thread between
# tests: written from the build thread they would land in the running test's captured output


def _item_builds(item) -> tuple[str, ...]:
    from tests.harness_builds import builds_of

    return builds_of(Path(str(item.fspath)), _MODULE_BUILDS)


def _print_build_lines() -> None:
    while _TERMINAL:
        try:
            line, red = _LINES.get_nowait()
        except queue.Empty:
            return
        terminal = _TERMINAL[0]
        if getattr(getattr(terminal, "_tw", None), "width_of_current_line", 0):
            terminal.write("\n")  # not after a row of dots (-q has no current file for ensure_newline)
        terminal.write_line(line, red=red, flush=True)


def pytest_collection_modifyitems(session, config, items):
    """Tests of modules that use no build first, then by the last build they need (stable within a module)."""
    from tests.harness_builds import order_key

    items.sort(key=lambda item: order_key(_item_builds(item)))


def pytest_collection_finish(session):
    if session.config.option.collectonly or not session.items:
        return
    from tests.harness_builds import BUILD_ORDER, BackgroundBuilds

    terminal = session.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None:
        return
    _TERMINAL.append(terminal)
    needed = {name for item in session.items for name in _item_builds(item)}
    if needed:
        _BUILDS.append(BackgroundBuilds([n for n in BUILD_ORDER if n in needed],
                                        lambda line, red: _LINES.put((line, red)), dict(os.environ)))


def pytest_runtest_protocol(item, nextitem):
    """Before a test (outside its output capture): show the builds' progress, and wait for the ones it needs."""
    _print_build_lines()
    if _BUILDS:
        _BUILDS[0].wait(_item_builds(item), while_waiting=_print_build_lines)
        _print_build_lines()


def pytest_runtest_logfinish(nodeid, location):
    _print_build_lines()


def pytest_sessionfinish(session, exitstatus):
    for builds in _BUILDS:
        builds.stop()
    _print_build_lines()
