"""Model files: which engine reads them, which files travel together, and what inputs they expect.

The collector needs this before anything runs: to pick the engine from the file name, to push the
`.bin` that belongs to a `.param`, and to make a `random` input of the right shape.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from layerdiff.errors import InputError, UsageError
from layerdiff.identity import file_stat
from layerdiff.analyzer.formats.limits import check_plain_file
from layerdiff.analyzer.formats.rawdump import combined_sha256, sha256_file
from layerdiff.collector.engines import ENGINES, engine_for_suffix
from layerdiff.collector.engines.base import Shape


@dataclass
class ModelFiles:
    engine: str
    files: list[Path]  # in the order the harness takes them (ncnn: .param then .bin)

    @functools.cached_property
    def sha256(self) -> str:
        """The model's identity in provenance and resume checks (FORMATS.md: sha256 of the sha256s)."""
        return combined_sha256([sha256_file(f) for f in self.files])

    @property
    def name(self) -> str:
        return self.files[0].name

    @property
    def stem(self) -> str:
        return self.files[0].stem


def resolve_model(model: Path | str, engine: str = "auto") -> ModelFiles:
    """Find the engine and companion files for a model path, or explain what is wrong."""
    path = Path(model)
    if engine not in ("auto", *ENGINES):
        raise UsageError(f"unknown engine {engine!r}; use auto, {', '.join(ENGINES)}")
    if not path.exists():
        raise InputError(f"model file {path} does not exist")
    check_plain_file(path, InputError, follow=True)  # a folder, or a FIFO that would block the reader
    chosen = engine_for_suffix(path.suffix) if engine == "auto" else engine
    if chosen is None:
        raise InputError(f"{path}: cannot tell the engine from the extension; pass --engine {' or --engine '.join(ENGINES)}")
    return ModelFiles(chosen, ENGINES[chosen].model_files(path))


def input_shapes(model: ModelFiles) -> dict[str, Shape]:
    """The model's inputs and their shapes (NCHW with batch 1), as far as the file declares them.

    A dimension <= 0 is dynamic (any size fits); a shape of None means the model declares none.
    """
    return {name: shape for name, (shape, _) in input_specs(model).items()}


def input_dtypes(model: ModelFiles) -> dict[str, str]:
    """The numpy dtype each model input is fed as (ncnn: always float32; a prompt: its UTF-8 bytes)."""
    dtypes = {name: dtype for name, (_, dtype) in input_specs(model).items()}
    prompt = ENGINES[model.engine].prompt_input
    return {prompt: "uint8", **dtypes} if prompt else dtypes


@functools.lru_cache(maxsize=8)
def _specs(engine: str, path: Path, stat: tuple[int, ...]) -> dict[str, tuple[Shape, str]]:
    from layerdiff.collector.inputs.modelread import read_specs_isolated

    return read_specs_isolated(engine, path)


def input_specs(model: ModelFiles) -> dict[str, tuple[Shape, str]]:
    """Shape and dtype of every model input, read once per model file (and version of it), by the
    engine's reader in a child process with memory and time limits (modelread.py): a model file is
    untrusted, and a reader crashing on it must not take `collect` with it."""
    path = model.files[0]
    return dict(_specs(model.engine, path, tuple(file_stat(path))))


def parse_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """`--shape name=1x3x640x640` (repeatable) -> {name: shape}; `name=` alone is a 0-d scalar."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
        except ValueError:
            shape = (-1,)
        if not sep or not name or any(d <= 0 for d in shape):
            raise UsageError(f"--shape {spec!r}: use NAME=DIMS with positive sizes, e.g. in0=1x3x640x640")
        shapes[name] = shape
    return shapes


def apply_shapes(declared: dict[str, Shape], given: dict[str, tuple[int, ...]], model: ModelFiles) -> dict[str, Shape]:
    """The model's input shapes with `--shape` overrides; a name the model lacks is an error."""
    unknown = [n for n in given if n not in declared]
    if unknown:
        raise UsageError(f"{model.name}: --shape names {', '.join(unknown)}, but the model's inputs are {', '.join(declared)}")
    return {**declared, **given}
