"""What `collect repro` needs from an engine's folder: how a layer is cut out of its model, and how its wheel runs the cut.

Why a recipe per engine: a repro bundle is the engine's own model format and the engine's own wheel, so cutting a
model and running the cut are knowledge of the engine. The engine's folder declares a `ReproRecipe` (its
`Engine.repro` hook returns it); collector/repro/ writes every bundle the same way from it and names no engine.

The runner a bundle carries is two files: collector/repro/runner.py (shared: reads repro.json, feeds the
reference's inputs, measures each configuration's outputs) copied as `run_repro.py`, and the recipe's `runner`
file copied as `engine_runner.py`, which defines `run(module, spec, config, here)` (the cut model's outputs under
one configuration, or the reason it could not run: `(None, why)`; `module` is the engine's Python module,
`Engine.library`, or None for an engine without one) and may define `gpu_info(module)` (the GPU the engine uses,
for the printed header) and `version(module)` (the engine's version, when the module has no `__version__`).
Both need only the engine's wheel and numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class CutPiece:
    """A layer (or run of layers) cut out as a model of its own: files by bundle path, how repro.json names them,
    the tensors it reads and writes, and the layers it holds."""

    files: dict[str, bytes]
    model: dict[str, str]
    inputs: list[str]
    outputs: list[str]
    layers: list[str]


def plain_options_text(config: dict) -> str:
    """The failing run's options as a README line: backend, threads, then every recorded option."""
    return ", ".join([f"backend={config['backend']}", f"threads={config['threads']}",
                      *(f"{k}={v}" for k, v in sorted(config["options"].items()))])


def recorded_keys(keys: tuple[str, ...]) -> Callable[[dict, dict, str, str], tuple[dict, bool]]:
    """An options reader that keeps `keys` of the run's recorded options (the ones the engine's runner reads)."""
    def read(recorded: dict, attrs: dict, backend: str, precision: str) -> tuple[dict, bool]:
        options = {k: recorded[k] for k in keys if k in recorded}
        return options, bool(options)
    return read


def no_options(recorded: dict, attrs: dict, backend: str, precision: str) -> tuple[dict, bool]:
    """An engine configured by backend, precision and threads alone."""
    return {}, False


@dataclass(frozen=True)
class ReproRecipe:
    """An engine's part of `collect repro` (see the module docstring)."""

    title: str  # the engine as its maintainers write it, in the README's title (`ONNX Runtime`)
    # (model files, first layer, last layer, reference shapes by tensor name, scratch folder) -> CutPiece
    cut: Callable[[list[Path], str, str, dict, Path], CutPiece]
    runner: Path  # the engine's half of the bundle's runner (see the module docstring)
    # Which column of the reference's layer table a layer key resolves to: "op" (an engine that cuts layers by
    # their own name) or "name" (ops named by the tensor they write).
    cuts_by: str = "name"
    one_op: str = ""  # why a bundle holds a single op (a range is refused with it); "" accepts FIRST..LAST
    # (the run's recorded options, its attributes, backend, precision) -> (options the runner sets, were they recorded)
    options: Callable[[dict, dict, str, str], tuple[dict, bool]] = no_options
    options_text: Callable[[dict], str] = plain_options_text  # a configuration's options as the README states them
    # repro.json's spec -> more files for the bundle (a C++ runner for phones), and the README section about them
    extra_files: Callable[[dict], dict[str, str]] = field(default=lambda spec: {})
    extra_readme: str = ""
    # The README's install line before `python run_repro.py`; "" installs the engine's wheel at the run's version
    # (an engine without a wheel says how its runner half gets the engine).
    install: str = ""


@dataclass(frozen=True)
class ProgramRecipe:
    """An engine whose bundle's runner is a program of its own (`Engine.repro_program` returns it): a graph that
    exists only in code has no model file to cut, so the bundle describes the node in `model/graph.json` and carries
    a C++ program that rebuilds it, built with CMake against the engine's source tree the maintainer has.
    collector/repro/program.py writes the rest of the bundle (tensors, repro.json, fingerprint) as for every engine,
    and collector/repro/check.py builds and runs the program."""

    one_op: str  # the one line a FIRST..LAST range is refused with
    # (model files, reference dump, failing dump, layer key) -> the node: `.name`, `.sources` (each `.name`, `.values`,
    # `.origin`), `.reference` and `.failing` (its output in each run)
    read_node: Callable[[object, object, object, str], object]
    describe: Callable[[object, dict[str, str], dict], dict]  # (node, .bin file by source, configs) -> model/graph.json
    # (model/graph.json, the reference output's .bin, the recorded error) -> the program's files by bundle path
    program: Callable[[dict, str, dict], dict[str, str]]
    readme: Callable[[dict], str]  # repro.json's spec -> README.md
    # the source tree `--source-dir` gave (None: the one the engine's own harness is built from) -> the checked tree,
    # or UsageError saying what to pass
    source_tree: Callable[[Path | None], Path]
    configure_args: Callable[[Path], list[str]]  # the source tree -> CMake's configure arguments naming it
    target: str = "repro"  # the CMake target, and the program's file name in the build folder
