"""Model files: which engine reads them, which files travel together, and what inputs they expect.

The collector needs this before anything runs: to pick the engine from the file name, to push the
`.bin` that belongs to a `.param`, and to make a `random` input of the right shape.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from analyzer.errors import LayerdiffError
from analyzer.rawdump import combined_sha256, sha256_file

ENGINES = ("mnn", "ncnn")


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
        raise LayerdiffError(f"unknown engine {engine!r}; use auto, mnn or ncnn")
    if not path.is_file():
        raise LayerdiffError(f"model file {path} does not exist")
    suffix = path.suffix.lower()
    guessed = {".mnn": "mnn", ".param": "ncnn", ".bin": "ncnn"}.get(suffix)
    chosen = guessed if engine == "auto" else engine
    if chosen is None:
        raise LayerdiffError(f"{path}: cannot tell the engine from the extension; pass --engine mnn or --engine ncnn")
    if chosen == "ncnn":
        param = path if suffix != ".bin" else path.with_suffix(".param")
        weights = param.with_suffix(".bin")
        for needed in (param, weights):
            if not needed.is_file():
                raise LayerdiffError(f"{needed}: ncnn needs the .param and the .bin side by side")
        return ModelFiles("ncnn", [param, weights])
    return ModelFiles("mnn", [path])


def input_shapes(model: ModelFiles) -> dict[str, tuple[int, ...]]:
    """The model's inputs and their shapes (NCHW with batch 1), as far as the file declares them."""
    if model.engine == "ncnn":
        return _ncnn_input_shapes(model.files[0])
    return _mnn_input_shapes(model.files[0])


def _ncnn_input_shapes(param: Path) -> dict[str, tuple[int, ...]]:
    lines = param.read_text(errors="replace").split("\n")
    if not lines or lines[0].strip() != "7767517":
        raise LayerdiffError(f"{param}: not an ncnn .param file (first line must be 7767517)")
    shapes: dict[str, tuple[int, ...]] = {}
    for line in lines[2:]:
        fields = line.split()
        if len(fields) < 4 or fields[0] != "Input":
            continue
        n_bottom, n_top = int(fields[2]), int(fields[3])
        top = fields[4 + n_bottom] if n_top else fields[1]
        params = dict(kv.split("=", 1) for kv in fields[4 + n_bottom + n_top :] if "=" in kv)
        dims = [int(params.get(k, 0)) for k in ("2", "1", "0")]  # c, h, w
        shapes[top] = tuple([1] + [d for d in dims if d > 0])
    if not shapes:
        raise LayerdiffError(f"{param}: no Input layer found; pass --input with an explicit .npy")
    return shapes


@contextlib.contextmanager
def quiet_stdout():
    """pymnn prints a CPU-feature banner on stdout; keep stdout clean for progress lines and --json."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _mnn_input_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with quiet_stdout():
        import MNN

        try:
            interpreter = MNN.Interpreter(str(path))
            session = interpreter.createSession({"backend": "CPU"})
        except Exception:  # noqa: BLE001 - pymnn raises a bare Exception for unparsable files
            session = None
        if session is None:
            raise LayerdiffError(f"{path}: MNN could not load this model (not a valid .mnn file?)")
        inputs = interpreter.getSessionInputAll(session)
        return {name: tuple(int(d) for d in tensor.getShape()) for name, tensor in inputs.items()}
