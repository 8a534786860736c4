"""Model inputs: what `--input` names (a .npy, a .npz, `random[:seed]`) turned into named arrays.

Each `InputSet` is one run's worth of inputs with a short label that names output files, so a sweep
over several inputs can tell them apart. The arrays are what the harness is fed, byte for byte, and
they are stored in the HDF5 dump.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analyzer.errors import LayerdiffError

_RANDOM = re.compile(r"^random(?::(\d+))?$")


@dataclass
class InputSet:
    label: str
    arrays: dict[str, np.ndarray]
    source: str

    def sha256(self) -> str:
        digests = [hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for a in self.arrays.values()]
        if len(digests) == 1:
            return digests[0]
        return hashlib.sha256("".join(digests).encode()).hexdigest()


def resolve_inputs(specs: list[str], shapes: dict[str, tuple[int, ...]]) -> list[InputSet]:
    """One InputSet per `--input` value (default: one `random:0`), each checked against the model."""
    sets = [_one_input(spec, shapes) for spec in (specs or ["random:0"])]
    labels = [s.label for s in sets]
    for label in set(labels):
        if labels.count(label) > 1:
            raise LayerdiffError(f"two inputs are both labelled {label!r}; rename one of the files")
    return sets


def _one_input(spec: str, shapes: dict[str, tuple[int, ...]]) -> InputSet:
    match = _RANDOM.match(spec)
    if match:
        seed = int(match.group(1) or 0)
        return InputSet(f"random{seed}", random_inputs(shapes, seed), spec)
    path = Path(spec)
    if not path.is_file():
        raise LayerdiffError(f"input {spec}: no such file; give a .npy, a .npz or random[:SEED]")
    if path.suffix == ".npy":
        array = _load(path)
        if len(shapes) != 1:
            raise LayerdiffError(f"{path}: the model has {len(shapes)} inputs ({', '.join(shapes)}); use a .npz with one array per input name")
        name = next(iter(shapes))
        arrays = {name: array}
    elif path.suffix == ".npz":
        arrays = _load_npz(path)
    else:
        raise LayerdiffError(f"{path}: unsupported input type; use .npy, .npz or random[:SEED]")
    check_against_model(path, arrays, shapes)
    return InputSet(path.stem, arrays, str(path))


def _load(path: Path) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as err:
        raise LayerdiffError(f"{path}: not a readable .npy file ({err})") from None
    if array.dtype.kind not in "fiu":
        raise LayerdiffError(f"{path}: input dtype {array.dtype} is not numeric")
    return np.ascontiguousarray(array, dtype=np.float32)


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: np.ascontiguousarray(npz[name], dtype=np.float32) for name in npz.files}
    except (ValueError, OSError) as err:
        raise LayerdiffError(f"{path}: not a readable .npz file ({err})") from None


def check_against_model(source: Path | str, arrays: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]]) -> None:
    for name, array in arrays.items():
        if name not in shapes:
            raise LayerdiffError(f"{source}: the model has no input {name!r}; its inputs are {', '.join(shapes)}")
        expected = shapes[name]
        if len(expected) == array.ndim and all(e <= 0 or e == a for e, a in zip(expected, array.shape)):
            continue
        if int(np.prod([d for d in expected if d > 0])) == array.size and all(d > 0 for d in expected):
            continue
        raise LayerdiffError(
            f"{source}: input {name!r} has shape {list(array.shape)} but the model expects {list(expected)}"
        )
    missing = [n for n in shapes if n not in arrays]
    if missing:
        raise LayerdiffError(f"{source}: no array for model input(s) {', '.join(missing)}")


def random_inputs(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Uniform [0, 1) inputs, reproducible from the seed; unknown dims must be given explicitly."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in shapes.items():
        if any(d <= 0 for d in shape):
            raise LayerdiffError(f"model input {name!r} has an unknown size {list(shape)}; pass --input with a .npy")
        arrays[name] = rng.random(shape, dtype=np.float32)
    return arrays
