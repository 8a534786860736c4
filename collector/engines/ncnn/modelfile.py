"""What an ncnn model is before any run: a `.param` with its `.bin`, and the inputs its Input layers declare."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerdiff.errors import InputError, ModelFormatError
from layerdiff.collector.engines.base import InputSpecs, Shape


def model_files(path: Path) -> list[Path]:
    """`.param` then `.bin` (the harness's order), whichever of the two was named."""
    param = path if path.suffix.lower() != ".bin" else path.with_suffix(".param")
    weights = param.with_suffix(".bin")
    for needed in (param, weights):
        if not needed.is_file():
            raise InputError(f"{needed}: ncnn needs the .param and the .bin side by side")
    return [param, weights]


def input_specs(param: Path) -> InputSpecs:
    """ncnn feeds every input as float32."""
    return {name: (shape, "float32") for name, shape in input_shapes(param).items()}


MAGIC = "7767517"  # the first line of a text .param


@dataclass(frozen=True)
class ParamLayer:
    """One layer line of a text .param."""

    type: str
    name: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    params: dict[str, str]
    line: str


def read_param(param: Path, purpose: str = "") -> list[ParamLayer]:
    """The layers of a text `.param` in file order, with their params; one clear line for anything else
    (`purpose`: what needs them, said when the file is not a text .param)."""
    try:
        lines = param.read_text(errors="replace").splitlines()
    except OSError as err:
        raise InputError(f"{param}: cannot read the .param ({err.strerror or err})") from None
    if not lines or lines[0].strip() != MAGIC:
        raise InputError(f"{param}: not a text ncnn .param file (first line is not {MAGIC})"
                         + (f"; {purpose}" if purpose else ""))
    layers = []
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        if not fields:
            continue
        try:
            n_bottom, n_top = int(fields[2]), int(fields[3])
        except (IndexError, ValueError):
            raise InputError(f"{param}:{number}: not an ncnn layer line") from None
        ends = 4 + n_bottom + n_top
        if len(fields) < ends:
            raise InputError(f"{param}:{number}: layer {fields[1]!r} names fewer blobs than it declares")
        params = dict(kv.split("=", 1) for kv in fields[ends:] if "=" in kv)
        layers.append(ParamLayer(fields[0], fields[1], tuple(fields[4:4 + n_bottom]), tuple(fields[4 + n_bottom:ends]),
                                 params, line.strip()))
    return layers


MAX_PARAM_BYTES = 64 << 20  # a .param is the graph as text: the largest real ones are a few MB


def input_shapes(param: Path) -> dict[str, Shape]:
    size = param.stat().st_size
    if size > MAX_PARAM_BYTES:
        raise ModelFormatError(f"{param}: {size} bytes, larger than any ncnn .param ({MAX_PARAM_BYTES}); "
                               "check that it is the graph text, not the weights")
    lines = param.read_text(errors="replace").split("\n")
    if not lines or lines[0].strip() != MAGIC:
        raise InputError(f"{param}: not an ncnn .param file (first line must be {MAGIC})")
    shapes: dict[str, Shape] = {}
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
