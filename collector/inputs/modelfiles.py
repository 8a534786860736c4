"""Model files: which engine reads them, which files travel together, and what inputs they expect.

The collector needs this before anything runs: to pick the engine from the file name, to push the
`.bin` that belongs to a `.param`, and to make a `random` input of the right shape.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Iterator
from pathlib import Path

from layerdiff.errors import InputError, UsageError
from layerdiff.analyzer.formats.rawdump import combined_sha256, sha256_file
from layerdiff.collector.engines import ENGINES, engine_for_suffix

Shape = tuple[int, ...] | None  # None: the model does not declare the input's shape (pnnx's ncnn Input)


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
    if not path.is_file():
        raise InputError(f"model file {path} does not exist")
    suffix = path.suffix.lower()
    chosen = engine_for_suffix(suffix) if engine == "auto" else engine
    if chosen is None:
        raise InputError(f"{path}: cannot tell the engine from the extension; pass --engine {' or --engine '.join(ENGINES)}")
    if chosen == "ncnn":
        param = path if suffix != ".bin" else path.with_suffix(".param")
        weights = param.with_suffix(".bin")
        for needed in (param, weights):
            if not needed.is_file():
                raise InputError(f"{needed}: ncnn needs the .param and the .bin side by side")
        return ModelFiles("ncnn", [param, weights])
    if chosen == "paddle":
        return _paddle_files(path)
    return ModelFiles(chosen, [path])


def input_shapes(model: ModelFiles) -> dict[str, Shape]:
    """The model's inputs and their shapes (NCHW with batch 1), as far as the file declares them.

    A dimension <= 0 is dynamic (any size fits); a shape of None means the model declares none.
    """
    return {name: shape for name, (shape, _) in input_specs(model).items()}


def input_dtypes(model: ModelFiles) -> dict[str, str]:
    """The numpy dtype each model input is fed as (ncnn: always float32)."""
    return {name: dtype for name, (_, dtype) in input_specs(model).items()}


@functools.lru_cache(maxsize=8)
def _specs(engine: str, path: Path, mtime: float) -> dict[str, tuple[Shape, str]]:
    if engine == "ncnn":
        return {name: (shape, "float32") for name, shape in _ncnn_input_shapes(path).items()}
    if engine == "onnxruntime":
        return _onnx_input_specs(path)
    if engine == "paddle":
        return _paddle_input_specs(path)
    if engine == "litert":
        from layerdiff.collector.engines.litert.graph import NotTflite, input_specs as tflite_input_specs

        try:
            return tflite_input_specs(path)
        except NotTflite as err:
            raise InputError(str(err)) from None
    return _mnn_input_specs(path)


def input_specs(model: ModelFiles) -> dict[str, tuple[Shape, str]]:
    """Shape and dtype of every model input, read once per model file."""
    path = model.files[0]
    return dict(_specs(model.engine, path, path.stat().st_mtime))


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


def _paddle_files(path: Path) -> ModelFiles:
    """`m.pdmodel` and its `m.pdiparams` (a program without parameters travels alone)."""
    program = path.with_suffix(".pdmodel") if path.suffix.lower() == ".pdiparams" else path
    if not program.is_file():
        raise InputError(f"{program}: a Paddle model needs its program (.pdmodel) beside {path.name}")
    params = program.with_suffix(".pdiparams")
    return ModelFiles("paddle", [program, params] if params.is_file() else [program])


def _paddle_input_specs(path: Path) -> dict[str, tuple[Shape, str]]:
    """The program's feed variables; -1 dimensions are dynamic."""
    from layerdiff.collector.engines.paddle.program import read_program

    program = read_program(path)
    return {name: (program.vars[name].dims or None, program.vars[name].dtype or "float32") for name in program.feeds()}


def _ncnn_input_shapes(param: Path) -> dict[str, Shape]:
    lines = param.read_text(errors="replace").split("\n")
    if not lines or lines[0].strip() != "7767517":
        raise InputError(f"{param}: not an ncnn .param file (first line must be 7767517)")
    shapes: dict[str, tuple[int, ...]] = {}
    for line in lines[2:]:
        fields = line.split()
        if len(fields) < 4 or fields[0] != "Input":
            continue
        n_bottom, n_top = int(fields[2]), int(fields[3])
        top = fields[4 + n_bottom] if n_top else fields[1]
        params = dict(kv.split("=", 1) for kv in fields[4 + n_bottom + n_top :] if "=" in kv)
        dims = [int(params.get(k, 0)) for k in ("2", "1", "0")]  # c, h, w
        declared = [d for d in dims if d > 0]
        shapes[top] = tuple([1] + declared) if declared else None  # pnnx writes Input layers without a shape
    if not shapes:
        raise InputError(f"{param}: no Input layer found; pass --input with an explicit .npy")
    return shapes


@contextlib.contextmanager
def quiet_stdout() -> Iterator[list[str]]:
    """pymnn prints a CPU-feature banner on stdout; keep stdout clean for progress lines and --json.

    What was printed is kept (`with quiet_stdout() as printed:`, then `printed[0]`): the banner is
    MNN's own word on the CPU's features (fp16:1), which the MNN engine records.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    printed: list[str] = []
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 1)
            try:
                yield printed
            finally:
                _flush_c_stdout()
                os.dup2(saved, 1)
                sink.seek(0)
                printed.append(sink.read(1 << 16).decode(errors="replace"))
    finally:
        os.close(saved)


def _flush_c_stdout() -> None:
    """MNN prints with C stdio, which buffers when stdout is not a terminal: flush it into the sink."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _onnx_input_specs(path: Path) -> dict[str, tuple[Shape, str]]:
    """Graph inputs that are not initializers; symbolic dimensions are dynamic (-1)."""
    import onnx
    from onnx import helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf raises DecodeError and friends
        raise InputError(f"{path}: not a readable ONNX model ({err})") from None
    weights = {init.name for init in model.graph.initializer}
    specs: dict[str, tuple[Shape, str]] = {}
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim) \
            if tensor.HasField("shape") else None
        specs[value.name] = (shape, str(helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    return specs


def mnn_dtype(MNN, tensor) -> str:
    kind = tensor.getDataType()
    for halide, name in ((MNN.Halide_Type_Int, "int32"), (MNN.Halide_Type_Int64, "int64"),
                         (MNN.Halide_Type_Uint8, "uint8"), (MNN.Halide_Type_Double, "float64")):
        if kind == halide:
            return name
    return "float32"


def _mnn_input_specs(path: Path) -> dict[str, tuple[Shape, str]]:
    with quiet_stdout():
        import MNN

        try:
            interpreter = MNN.Interpreter(str(path))
            session = interpreter.createSession({"backend": "CPU"})
        except Exception:  # noqa: BLE001 - pymnn raises a bare Exception for unparsable files
            session = None
        if session is None:
            raise InputError(f"{path}: MNN could not load this model (not a valid .mnn file?)")
        inputs = interpreter.getSessionInputAll(session)
        return {name: (tuple(int(d) for d in tensor.getShape()), mnn_dtype(MNN, tensor))
                for name, tensor in inputs.items()}
