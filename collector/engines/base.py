"""What an engine is to layerdiff: one folder under collector/engines/ that declares an `Engine`.

Polygraphy's runners were the model: the collector asks an engine only what it can run here, to load
a model, and to run it with every layer dumped, and it reads back which precision and backend were
really used. The interface has two halves:

- **Static facts** (`Engine`, declared as `ENGINE` in the folder's `__init__.py`, which must import
  nothing heavy): its name, the model file suffixes that select it, the backends it knows, where it
  runs (host, arm64 emulation, phones), which files make one model, and the inputs a model declares.
  The collector reads these before any engine library is imported (`--engine auto`, `random` inputs).
- **The host engine** (`<folder>/engine.py`, run as `python -m` by the `local` and `arm64` devices):
  the harness command line of device_scripts/HARNESS_CLI.md through `harness_cli.harness_main`, with
  three functions: `probe()` (what it can run here: per backend `ok`, or `ok: false` and the reason),
  `run(args)` (load the model, run it with every layer written into the raw dump through `DumpSink`,
  and record `precision_effective` / `backend_actual` in the dump header: what really ran), and
  `engine_version()`. `HostEngine` spells it out; tests/test_engines_registry.py checks every engine.

Registered in one place: `ENGINE_FOLDERS` in collector/engines/__init__.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from layerdiff.analyzer.formats.enginefacts import NO_FACTS, EngineFacts
from layerdiff.errors import EngineNotInstalledError
from layerdiff.vocabulary import HARNESS_BACKENDS

Shape = tuple[int, ...] | None  # None: the model does not declare the input's shape (pnnx's ncnn Input)
InputSpecs = dict[str, tuple[Shape, str]]  # input name -> (shape, numpy dtype name it is fed as)
HOST_BACKENDS = HARNESS_BACKENDS  # what the host harness command line accepts by default


def one_file(path: Path) -> list[Path]:
    """Most engines read one file: the model is the path itself."""
    return [path]


@dataclass(frozen=True)
class Engine:
    """The static facts of one engine (see the module docstring); `package` is filled by the registry."""

    name: str  # `--engine NAME`, the dump's `engine` attribute, the harness's `--engine`
    suffixes: tuple[str, ...]  # model file suffixes that select this engine under `--engine auto`
    input_specs: Callable[[Path], InputSpecs]  # the first model file -> its declared inputs (no engine run)
    model_files: Callable[[Path], list[Path]] = one_file  # a given path -> every file of the model, harness order
    backends: tuple[str, ...] = HOST_BACKENDS  # backend names its harness accepts (a probe says which work)
    on_phones: bool = False  # the C++ harness (device_scripts/harness) runs it on ADB devices
    arm64_wheels: tuple[str, ...] = ()  # aarch64 wheels that let the `arm64` device run its host engine
    # An engine whose harness is its own native program (not the Python host engine, not the C++
    # phone harness) says how to get it: built before a sweep's display starts (devices -> None,
    # failures left to the runs), and run by the emulated `arm64` device (Arm64Device -> HarnessInvocation).
    prebuild: Callable[[list], None] | None = None
    arm64_harness: Callable[[object], object] | None = None
    # ... and on an ADB phone (with on_phones): (phone ABI, backend) -> its binary, built or cached,
    # staged and run by the phone path in place of the C++ phone harness (HarnessError: one line why not).
    phone_harness: Callable[[str, str], Path] | None = None
    # ... or, for an engine the C++ phone harness runs (device_scripts/harness), which build of it runs the engine:
    # (phone ABI, backend, test build) -> collector/harness/build.py's HarnessSpec (HarnessError: one line why not).
    harness_spec: Callable[[str, str, bool], object] | None = None
    # ... and its part of a C++ harness build that does not link it: (target, vulkan, test build) ->
    # collector/harness/build.py's HarnessLibrary (the option telling the build scripts, its source files left out of
    # the key, its key entries), so every build's key has the same shape whichever engine it links.
    harness_absent: Callable[[str, bool, bool], object] | None = None
    # An engine whose harness tokenizes text itself (ggml: llama.cpp's tokenizer, on the device) names
    # the input a UTF-8 text file goes to (`--input prompt=FILE.txt`): staged as its uint8 bytes, in
    # place of the model's declared inputs (the harness records the ids that ran).
    prompt_input: str | None = None
    # An engine whose isolation rebuilds the target node from the model's own graph (ggml: graphs are built
    # in code, so the harness builds the whole graph once and cuts the node out) is given the reference
    # run's own input with `--inject` (the graph's shapes follow from it), and reads the weights a node takes
    # from the model: only the activations the targets read travel in the inject dump.
    isolate_rebuilds_graph: bool = False
    # Op types its isolation refuses (ggml: views compute nothing, KV cache stores write in place):
    # `collect isolate --failing-from` leaves layers of these types out, saying so, instead of failing.
    not_isolatable: tuple[str, ...] = ()
    # `collect bisect`: () -> the folder's BisectRecipe (collector/engines/bisectrecipe.py: how single layers move back
    # to the reference configuration while the others run the failing one), imported only when bisect runs; None
    # when the engine has no per-layer switch, and then `bisect_refusal` is the one line bisect answers with.
    bisect: Callable[[], object] | None = None
    # How `collect fix` keeps single layers at high precision (a name in collector/fix/mechanisms.py's
    # MECHANISMS: "feature-mask" patches the model, "what-if" injects outputs); "" when it cannot, and then
    # `fix_advice` may still say, one sentence each, what the engine offers instead (written to fix.json).
    fix_mechanism: str = ""
    # With "feature-mask": () -> its FeatureMaskModel (collector/engines/featuremask.py: how its model files take
    # per-layer masks), imported only when `collect fix` runs.
    feature_mask: Callable[[], object] | None = None
    fix_advice: tuple[str, ...] = ()
    bisect_refusal: str = ""
    # What separates two of its precisions on a backend, as the op types through which that setting can
    # change a value: (backend, precision, other precision, op types). A graph holding none of those op
    # types computes the same at both, so identical bytes under the two labels are expected, not a label
    # question (ggml on the CPU: high and normal differ only in the KV cache's type, written by SET_ROWS;
    # an encoder without a cache is the same computation). Each dump records its run's rows
    # (`precision_reach`, analyzer/FORMATS.md); an engine that declares none leaves every pair a question.
    precision_reach: tuple[tuple[str, str, str, tuple[str, ...]], ...] = ()
    # What the analyzer must know to read its runs (nodes it computes on the CPU by design in a GPU run, output
    # names that say the task): recorded in every dump's header as `engine_facts` (analyzer/FORMATS.md), so a
    # dump carries them to an analyzer without the collector.
    facts: EngineFacts = NO_FACTS
    # The Python module the host engine runs (`ncnn`, `MNN`, ...): its installed file is part of what a
    # kept `--probe` answer of the host depends on (collector/transport/probe.py); "" (a native
    # harness built here) means the probe is always asked.
    library: str = ""
    # The pip extra that installs `library` (`pip install 'layerdiff[EXTRA]'`): the core install is the
    # analyzer and the phone collector, each host engine comes with its extra.
    extra: str = ""
    # Why every tensor it dumps holds a value the run wrote, per backend ("*": every backend): (backend, why).
    # The collector stores it as the dump's `observability` record (collector/engines/unwritten.py) unless the
    # run checked its tensors itself (a sentinel fill: the header or footer then carries the record).
    writes: tuple[tuple[str, str], ...] = ()
    # A word on a backend name only it uses, for `--backend` help: (backend, note), e.g. ("gpu", "WebGPU").
    backend_notes: tuple[tuple[str, str], ...] = ()
    # How `collect --help` names its model files (`ncnn .param with its .bin`); default: its suffixes.
    model_help: str = ""
    # `collect prepare` stages this engine's phone harness when no `--engine` is given.
    prepared_by_default: bool = False
    # The PyPI distribution whose wheel holds `library` (`MNN`, `ncnn`): `--engine NAME==VERSION` installs
    # that version of it into a cached environment of its own (collector/engines/versions.py); "" refuses.
    distribution: str = ""
    # ... or, for an engine whose harness is built here from a source distribution on the package index (ggml:
    # llama.cpp from llama-cpp-python's sdist): () -> its SourceRelease (collector/engines/versions.py: which project's
    # sdist, the devices a release's build runs on, how it is checked, built and run), imported only when asked.
    source_release: Callable[[], object] | None = None
    # ... and how help texts say where those releases come from (`VERSION: a llama-cpp-python release, ...`).
    release_help: str = ""
    # Why its releases run nowhere but where they do (no source distribution to build the phone harness's library
    # from): the clause `--engine NAME==VERSION` answers a device outside them, or an engine with no releases, with.
    release_refusal: str = ""
    # `collect repro`: () -> the folder's ReproRecipe (collector/engines/reprorecipe.py: how a layer is cut out of
    # its model and how its wheel runs the cut), imported only when a bundle is written; None when it writes no
    # bundles, and then `repro_refusal` may say why in one line.
    repro: Callable[[], object] | None = None
    repro_refusal: str = ""
    # ... or () -> its ProgramRecipe (collector/engines/reprorecipe.py): `collect repro` writes this engine's bundle
    # around a program of its own (collector/repro/program.py) instead of a cut model and a Python runner.
    repro_program: Callable[[], object] | None = None
    package: str = field(default="", compare=False)  # layerdiff.collector.engines.<folder>

    def reach_of(self, backend: str, precision: str) -> dict[str, list[str]]:
        """{other precision: op types through which it differs from `precision`} on `backend` (both ways)."""
        reach: dict[str, list[str]] = {}
        for on, a, b, ops in self.precision_reach:
            if on == backend and precision in (a, b):
                reach[b if precision == a else a] = list(ops)
        return reach

    def written_why(self, backend: str) -> str:
        """Why every tensor a run on `backend` dumps was written by that run ("" when the engine declares nothing)."""
        return next((why for on, why in self.writes if on == backend), next((why for on, why in self.writes if on == "*"), ""))

    @property
    def model_text(self) -> str:
        """The engine's model files as help texts name them."""
        return self.model_help or ", ".join(self.suffixes)

    @property
    def host_module(self) -> str:
        """The Python host engine behind the `local` and `arm64` devices (`python -m ...`)."""
        return f"{self.package}.engine"

    @property
    def on_arm64(self) -> bool:
        return bool(self.arm64_wheels)

    def require_installed(self) -> None:
        """Raise EngineNotInstalledError, naming the extra, when this Python lacks the engine's library.

        Asked before the host engine or a model reader imports it, so a core install gets one line that
        says what to install instead of a ModuleNotFoundError from a child process."""
        import importlib.util

        if self.library and importlib.util.find_spec(self.library) is None:
            raise EngineNotInstalledError(
                f"the {self.name} engine is not installed in this Python ({self.library} is missing): "
                f"pip install 'layerdiff[{self.extra or self.name}]'")


class HostEngine(Protocol):
    """The functions every `<folder>/engine.py` defines (its `main()` passes them to `harness_main`)."""

    def probe(self) -> dict: ...  # {"harness", "version", "abi", "engines": {name: {"version", "backends": {b: {"ok", "reason"?}}}}}

    def run(self, args) -> None: ...  # harness_cli.HarnessArgs -> a raw dump in args.out, or HarnessExit

    def engine_version(self) -> str: ...

    def main(self) -> int: ...
