"""Model inputs: what `--input` names turned into named arrays, one `InputSet` per run.

`--input` takes `random[:seed]`, a `.npy` (single-input models), a `.npz` (name → array), an image
(PNG/JPEG/...), a directory or a glob of those (one run each), or `name=FILE` pairs for models with
several inputs. An engine that tokenizes text itself (ggml) also takes `prompt=FILE.txt`: the
prompt's UTF-8 bytes go to its harness, which runs them through the model's own tokenizer. One bad file must not stop a sweep over a folder of photos, so per-file problems
come back as error lines while the other inputs still run; only a spec that names nothing at all,
or a model that cannot take any input, stops the command.
"""
from __future__ import annotations

import glob
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from layerdiff.errors import DumpFormatError, InputError, LayerdiffError
from layerdiff.analyzer.formats.limits import check_plain_file
from layerdiff.collector.inputs.preprocess import IMAGE_SUFFIXES, Preprocess, default_for, image_pixel_limit, load_image

_RANDOM = re.compile(r"^random(?::(\d+))?$")
_PAIR = re.compile(r"^([A-Za-z_][\w./:-]*)=(.+)$")
DATA_SUFFIXES = (".npy", ".npz")


@dataclass
class InputSet:
    label: str
    arrays: dict[str, np.ndarray]
    source: str
    preprocess: dict = field(default_factory=dict)

    def sha256(self) -> str:
        digests = [hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for a in self.arrays.values()]
        if len(digests) == 1:
            return digests[0]
        return hashlib.sha256("".join(digests).encode()).hexdigest()


def resolve_inputs(
    specs: list[str], shapes: dict[str, tuple[int, ...] | None], preprocess: Preprocess | None = None,
    prompt_input: str | None = None,
) -> tuple[list[InputSet], list[str]]:
    """Every run's inputs (default: one `random:0`) plus one error line per unusable file.

    `prompt_input`: the engine's text input (Engine.prompt_input); `NAME=FILE` under that name is a prompt.

    Arrays keep the dtype and rank their file gives (a 0-d scalar stays 0-d), so the input hash is
    the same whichever engine's model takes them; each run casts them to what its model takes.
    """
    sets: list[InputSet] = []
    errors: list[str] = []
    pairs: dict[str, str] = {}
    for spec in specs or ["random:0"]:
        pair = _PAIR.match(spec)
        if pair and prompt_input and pair.group(1) == prompt_input and prompt_input not in shapes:
            _collect(lambda: [prompt_set(prompt_input, Path(pair.group(2)))], sets, errors)
            continue
        if pair and not Path(spec).exists() and pair.group(1) in shapes:
            if pair.group(1) in pairs:
                _collect(lambda: [_paired(pairs, shapes, preprocess)], sets, errors)
                pairs = {}
            pairs[pair.group(1)] = pair.group(2)
            continue
        if pair and not Path(spec).exists() and Path(pair.group(2)).exists():
            errors.append(f"input {spec}: the model has no input {pair.group(1)!r} (its inputs: {', '.join(shapes) or 'none'}); "
                          "name one of those")
            continue
        for one in _expand(spec):
            _collect(lambda one=one: [_one_input(one, shapes, preprocess)], sets, errors)
    if pairs:
        _collect(lambda: [_paired(pairs, shapes, preprocess)], sets, errors)
    _unique_labels(sets)
    return sets, errors


def prompt_set(name: str, path: Path) -> InputSet:
    """A prompt as the harness takes it: its UTF-8 bytes (uint8) under the engine's text input.

    Why bytes, not ids: the model's own tokenizer lives in the harness (llama.cpp's, on every device);
    the run records the text here and the harness's dump header records the ids that ran.
    """
    if not path.is_file():
        raise InputError(f"input {name}={path}: no such file; give a UTF-8 text file with the prompt")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: the prompt is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    if not text.strip():
        raise InputError(f"{path}: the prompt is empty; write the text to run in it")
    array = np.frombuffer(data, dtype=np.uint8).copy()
    return InputSet(path.stem, {name: array}, f"{name}={path}", {name: {"prompt": text, "file": str(path)}})


def _collect(make, sets: list[InputSet], errors: list[str]) -> None:
    try:
        sets.extend(make())
    except LayerdiffError as err:
        errors.append(str(err))


def _expand(spec: str) -> list[str]:
    """A directory or glob → its usable files in name order; anything else stays as it is."""
    path = Path(spec)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES + DATA_SUFFIXES)
        links = [p for p in files if p.is_symlink()]
        if links:
            raise InputError(f"{links[0]}: a symbolic link inside an input folder is not followed; copy the file in "
                             "its place or give it with --input itself")
        if not files:
            raise InputError(f"input directory {path} holds no images, .npy or .npz files")
        return [str(f) for f in files]
    if any(ch in spec for ch in "*?[") and not path.exists():
        files = sorted(glob.glob(spec))
        if not files:
            raise InputError(f"input pattern {spec!r} matches no file")
        return files
    return [spec]


def _unique_labels(sets: list[InputSet]) -> None:
    """Two inputs named alike (a.png and a.npy) get distinct labels: labels name output files."""
    taken: set[str] = set()
    for s in sets:
        label, k = s.label, 1
        while label in taken:  # `a`, `a`, `a-2` → a, a-2, a-2-2: every label differs, whatever the names
            k += 1
            label = f"{s.label}-{k}"
        s.label = label
        taken.add(label)


def _one_input(spec: str, shapes: dict[str, tuple[int, ...]], preprocess: Preprocess | None) -> InputSet:
    match = _RANDOM.match(spec)
    if match:
        seed = int(match.group(1) or 0)
        return InputSet(f"random{seed}", random_inputs(shapes, seed), spec)
    path = Path(spec)
    if not path.exists():
        raise InputError(f"input {spec}: no such file; give a .npy, .npz, an image, a directory or random[:SEED]")
    check_plain_file(path, InputError, follow=True)  # a FIFO would block the reader
    if path.suffix.lower() == ".npz":
        arrays = check_against_model(path, _load_npz(path), shapes)
        return InputSet(path.stem, arrays, str(path))
    name = _single_input_name(path, shapes)
    array, recipe = _load_file(path, shapes[name], preprocess)
    arrays = check_against_model(path, {name: array}, shapes)
    return InputSet(path.stem, arrays, str(path), recipe)


def _paired(pairs: dict[str, str], shapes: dict[str, tuple[int, ...]], preprocess: Preprocess | None) -> InputSet:
    arrays: dict[str, np.ndarray] = {}
    recipes: dict[str, dict] = {}
    for name, file in pairs.items():
        path = Path(file)
        if not path.is_file():
            raise InputError(f"input {name}={file}: no such file")
        arrays[name], recipe = _load_file(path, shapes[name], preprocess)
        if recipe:
            recipes[name] = recipe
    label = "+".join(Path(f).stem for f in pairs.values())
    arrays = check_against_model(label, arrays, shapes)
    return InputSet(label, arrays, ",".join(f"{n}={f}" for n, f in pairs.items()), recipes)


def _single_input_name(path: Path, shapes: dict[str, tuple[int, ...]]) -> str:
    if len(shapes) != 1:
        raise InputError(
            f"{path}: the model has {len(shapes)} inputs ({', '.join(shapes)}); use a .npz or name=FILE pairs"
        )
    return next(iter(shapes))


def _load_file(path: Path, shape: tuple[int, ...] | None, preprocess: Preprocess | None) -> tuple[np.ndarray, dict]:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        if preprocess is None and (shape is None or any(d <= 0 for d in shape)):
            raise InputError(f"{path}: the model does not declare its input size; pass --preprocess resize=WxH "
                                 "or --shape NAME=1x3xHxW")
        recipe = preprocess or default_for(shape)
        return load_image(path, recipe, image_pixel_limit(shape)), recipe.as_dict()
    if suffix == ".npy":
        return _load_npy(path), {}
    raise InputError(f"{path}: unsupported input type; use .npy, .npz, an image or random[:SEED]")


def _load_npy(path: Path) -> np.ndarray:
    """Read by the analyzer's checked reader (like `.npz` members): np.load allocates whatever the
    header declares before reading (a 1 KB file declaring 1x3x1000000x1000000 was a MemoryError)."""
    from layerdiff.analyzer.importers.npyformat import read_npy

    try:
        with open(path, "rb") as fh:
            array = read_npy(fh, path.stat().st_size, str(path))
    except OSError as err:
        raise InputError(f"{path}: not a readable .npy file ({err.strerror or err})") from None
    except DumpFormatError as err:
        raise InputError(str(err)) from None
    if array.dtype.kind not in "fiub":
        raise InputError(f"{path}: input dtype {array.dtype} is not numeric")
    return np.asarray(array, order="C")  # not ascontiguousarray: it makes a 0-d scalar 1-d


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an `.npz`, each read by the analyzer's checked reader.

    Why not `np.load`: a few deflated megabytes can declare gigabytes, and numpy allocates what a
    member declares before reading it. The checked reader compares the header with the bytes that
    really follow and with the per-tensor limit (analyzer/formats/limits.py) before allocating.
    """
    from layerdiff.analyzer.importers.npyfiles import read_npz

    arrays = {layer.name: layer.load() for layer in read_npz(path).layers}
    for name, array in arrays.items():
        if array.dtype.kind not in "fiub":
            raise InputError(f"{path}: array {name!r} has non-numeric dtype {array.dtype}")
    return {name: np.asarray(a, order="C") for name, a in arrays.items()}


def check_against_model(source: Path | str, arrays: dict[str, np.ndarray],
                        shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The arrays as the model takes them, or one line saying which input does not fit.

    Shapes that differ only by leading 1s are the same tensor: ncnn users hold images as CHW
    while the model is declared [1, C, H, W] (and the reverse). Such an array is reshaped (no
    copy, same bytes and hash) to the declared rank, and that shape is what the run records.
    """
    fitted = {}
    for name, array in arrays.items():
        if name not in shapes:
            raise InputError(f"{source}: the model has no input {name!r}; its inputs are {', '.join(shapes)}")
        expected = shapes[name]
        shape = array.shape if expected is None else fit_shape(array.shape, expected)
        if shape is None:
            raise InputError(
                f"{source}: input {name!r} has shape {list(array.shape)} but the model expects {list(expected)}"
            )
        fitted[name] = array.reshape(shape)
    missing = [n for n in shapes if n not in arrays]
    if missing:
        raise InputError(f"{source}: no array for model input(s) {', '.join(missing)}")
    return fitted


def fit_shape(actual: tuple[int, ...], expected: tuple[int, ...]) -> tuple[int, ...] | None:
    """`actual` written in `expected`'s rank when they agree up to leading 1s (dims <= 0 are free)."""
    if len(actual) == len(expected) and all(e <= 0 or e == a for e, a in zip(expected, actual)):
        return tuple(actual)  # same rank: a free leading dim (ONNX's dynamic batch) takes any size

    def core(shape, free_batch: bool = False):
        dims = list(shape)
        if free_batch and dims and dims[0] <= 0:
            dims[0] = 1  # a free batch takes the batch of 1 an array without a batch axis stands for
        while dims and dims[0] == 1:
            dims.pop(0)
        return dims

    if len(actual) == len(expected) and all(d <= 0 or d == x for d, x in zip(expected, actual)):
        return tuple(actual)  # same rank: free dims (a dynamic batch -1 included) take the array's size
    a, e = core(actual), core(expected, free_batch=True)
    if len(a) != len(e) or any(d > 0 and d != x for d, x in zip(e, a)):
        return None
    return tuple([1] * (len(expected) - len(e)) + a)


def batch_of_one(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """A declared shape whose one free dimension is its leading one (a free batch) fed with batch 1."""
    if shape and shape[0] <= 0 and all(d > 0 for d in shape[1:]):
        return (1, *shape[1:])
    return shape


def _shape_example(shape: tuple[int, ...] | None) -> str:
    """`1x3xHxW` from the declared dims (a free batch as 1), or a plain image example without one."""
    if not shape:
        return "1x3x224x224"
    letters = iter("HWDTUV")
    dims = ["1" if k == 0 and d <= 0 else str(d) if d > 0 else next(letters, "N") for k, d in enumerate(shape)]
    return "x".join(dims)


def random_inputs(shapes: dict[str, tuple[int, ...] | None], seed: int) -> dict[str, np.ndarray]:
    """Uniform [0, 1) float32 inputs, reproducible from the seed; unknown dims must be given explicitly.

    (A run casts them to its model's dtypes: integer and bool inputs are then 0; give those in a .npz.)
    """
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, declared in shapes.items():
        shape = batch_of_one(declared)
        if shape is None or any(d <= 0 for d in shape):
            size = "no declared shape" if shape is None else f"an unknown size {list(declared)}"
            raise InputError(f"model input {name!r} has {size}; pass --shape {name}={_shape_example(declared)} "
                             "(its real sizes) or --input with a .npy")
        _check_random_size(name, shape)
        arrays[name] = rng.random(shape, dtype=np.float32)
    return arrays


def _check_random_size(name: str, shape: tuple[int, ...]) -> None:
    """A declared (or --shape) size is checked before allocating: 1x3x100000x100000 is 120 GB of float32."""
    from layerdiff.analyzer.formats.limits import MAX_TENSOR_BYTES, human_bytes

    numel = 1
    for dim in shape:
        numel *= int(dim)
    if numel * 4 > MAX_TENSOR_BYTES:
        raise InputError(f"model input {name!r}: a random input of shape {'x'.join(map(str, shape))} is "
                         f"{human_bytes(numel * 4)}, over the {human_bytes(MAX_TENSOR_BYTES)} per-tensor limit; pass a "
                         f"smaller --shape {name}=..., or set LAYERDIFF_MAX_TENSOR_BYTES")
