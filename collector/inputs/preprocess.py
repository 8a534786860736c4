"""Image preprocessing the way mobile apps do it, declared once and recorded in every run.

Input-dependent failures (seed 003: some photos collapse to zero at low precision) only show up
with real inputs prepared exactly as the app prepares them, so the recipe is explicit:
`resize=224x224,crop=center,color=rgb,mean=0.485,0.456,0.406,std=0.229,0.224,0.225,scale=1/255,layout=nchw`
or the same keys in a JSON/TOML file. Order of operations: decode → color → resize (+ center crop)
→ × scale → − mean → ÷ std → layout → batch of 1.
"""
from __future__ import annotations

import math
import os
import tomllib
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from layerdiff.errors import InputError, UsageError
from layerdiff.analyzer.formats.limits import load_json

KEYS = ("resize", "crop", "color", "mean", "std", "scale", "layout")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")
# Photos up to 64 megapixels always decode; beyond that an image may be up to 256 model inputs large.
MIN_IMAGE_PIXELS = 64 << 20
MODEL_INPUTS_PER_IMAGE = 256
PIXELS_ENV = "LAYERDIFF_MAX_IMAGE_PIXELS"


@dataclass
class Preprocess:
    resize: tuple[int, int] | None = None  # (width, height)
    crop: str = "none"  # "center": resize to cover, then center-crop; "none": stretch
    color: str = "rgb"
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    scale: float = 1.0 / 255.0
    layout: str = "nchw"

    def as_dict(self) -> dict:
        return asdict(self)


def parse_preprocess(spec: str | None) -> Preprocess | None:
    """A `--preprocess` value: inline `key=value,...` or a .json/.toml file with the same keys."""
    if not spec:
        return None
    path = Path(spec)
    if path.suffix in (".json", ".toml") and path.is_file():
        return _from_mapping(_read_file(path), str(path))
    return _from_mapping(_parse_inline(spec), "--preprocess")


def _read_file(path: Path) -> dict:
    try:
        if path.suffix == ".json":
            data = load_json(path.read_text(), f"{path}: preprocessing file", InputError)
        else:
            data = tomllib.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise InputError(f"{path}: cannot read the preprocessing file ({err})") from None
    data = data.get("preprocess", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a table of preprocessing keys ({', '.join(KEYS)})")
    return data


def _parse_inline(spec: str) -> dict:
    """`mean=0.485,0.456,0.406,std=...`: a bare value continues the previous key's list."""
    out: dict[str, list[str]] = {}
    key = None
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        if "=" in token:
            key, value = token.split("=", 1)
            out[key.strip()] = [value.strip()]
        elif key is not None:
            out[key].append(token)
        else:
            raise UsageError(f"--preprocess: {token!r} has no key; write key=value ({', '.join(KEYS)})")
    return {k: v if len(v) > 1 else v[0] for k, v in out.items()}


def _from_mapping(data: dict, where: str) -> Preprocess:
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise InputError(f"{where}: unknown preprocessing key {unknown[0]!r}; known keys: {', '.join(KEYS)}")
    p = Preprocess()
    try:
        if "resize" in data:
            p.resize = _size(data["resize"])
        if "crop" in data:
            p.crop = _choice(data["crop"], ("center", "none"), "crop")
        if "color" in data:
            p.color = _choice(data["color"], ("rgb", "bgr", "gray"), "color")
        if "layout" in data:
            p.layout = _choice(data["layout"], ("nchw", "nhwc"), "layout")
        if "mean" in data:
            p.mean = _floats(data["mean"])
        if "std" in data:
            p.std = _floats(data["std"])
        if "scale" in data:
            p.scale = _number(data["scale"], "scale")
    except ValueError as err:
        raise InputError(f"{where}: {err}") from None
    if any(s == 0 for s in p.std):
        raise InputError(f"{where}: std must not be 0")
    return p


def _size(value) -> tuple[int, int]:
    text = "x".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    parts = text.lower().split("x")
    if len(parts) == 1:
        parts = parts * 2
    try:
        width, height = (int(v) for v in parts)
    except ValueError:
        raise ValueError(f"resize={text!r} is not WIDTHxHEIGHT, like 224x224") from None
    if width <= 0 or height <= 0:
        raise ValueError(f"resize={text!r} must be positive, like 224x224")
    return width, height


def _choice(value, allowed: tuple[str, ...], key: str) -> str:
    text = str(value).strip().lower()
    if text not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    return text


def _floats(value) -> tuple[float, ...]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return tuple(_number(v, "mean/std") for v in items)


def _number(value, key: str) -> float:
    """A finite number written as a decimal or a fraction (`1/255`)."""
    text = str(value).strip()
    try:
        number = float(Fraction(text))
    except (ValueError, ZeroDivisionError, OverflowError):
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{key}={text!r} is not a finite number; write e.g. 0.5 or 1/255")
    return number


def image_pixel_limit(shape: tuple[int, ...] | None) -> int:
    """Largest image (decoded or resized, in pixels) read for a model input of `shape`.

    Derived from the input so a typo like resize=50000x50000 cannot take the machine's memory;
    LAYERDIFF_MAX_IMAGE_PIXELS overrides it."""
    raw = os.environ.get(PIXELS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) <= 0:
            raise UsageError(f"{PIXELS_ENV}={raw!r}: expected a positive pixel count, e.g. 100000000")
        return int(raw)
    dims = [d for d in shape[-3:] if d > 3] if shape is not None and len(shape) >= 3 else []  # None: no declared shape
    model_pixels = math.prod(dims[-2:]) if len(dims) >= 2 else 0
    return max(MIN_IMAGE_PIXELS, MODEL_INPUTS_PER_IMAGE * model_pixels)


def default_for(shape: tuple[int, ...]) -> Preprocess:
    """Without a recipe: fit the model's input size, RGB, [0, 1], NCHW (or NHWC if the shape says so)."""
    if len(shape) == 4 and shape[-1] in (1, 3) and shape[1] not in (1, 3):
        return Preprocess(resize=(shape[2], shape[1]), layout="nhwc", color="gray" if shape[-1] == 1 else "rgb")
    if len(shape) == 4:
        return Preprocess(resize=(shape[3], shape[2]), color="gray" if shape[1] == 1 else "rgb")
    raise InputError(f"model input shape {list(shape)} is not an image; pass a .npy instead")


def load_image(path: Path, recipe: Preprocess, max_pixels: int = MIN_IMAGE_PIXELS) -> np.ndarray:
    """Decode and prepare one image; the array returned is exactly what the model is fed.

    Sizes are checked against `max_pixels` before anything is decoded or resized."""
    from PIL import Image, UnidentifiedImageError

    if recipe.resize:
        _check_pixels(path, "resize target", *recipe.resize, max_pixels)
    try:
        with warnings.catch_warnings(), _pillow_limit(Image, max_pixels):
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                _check_pixels(path, "image", img.width, img.height, max_pixels)
                img = img.convert("L" if recipe.color == "gray" else "RGB")
                if recipe.resize:
                    img = _resize(img, recipe, path, max_pixels)
                pixels = np.asarray(img, dtype=np.float32)
    except Image.DecompressionBombError as err:
        raise InputError(f"{path}: refused as a decompression bomb ({err}); set {PIXELS_ENV} if it is genuine") from None
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read this image ({type(err).__name__}: {err})") from None
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if recipe.color == "bgr":
        pixels = pixels[:, :, ::-1]
    pixels = pixels * recipe.scale
    pixels = (pixels - np.asarray(recipe.mean, np.float32)) / np.asarray(recipe.std, np.float32)
    if recipe.layout == "nchw":
        pixels = pixels.transpose(2, 0, 1)
    return np.ascontiguousarray(pixels[None], dtype=np.float32)


@contextmanager
def _pillow_limit(image_module, max_pixels: int):
    """Pillow's own bomb check, at our limit for the length of one decode (it errs at twice its value)."""
    saved = image_module.MAX_IMAGE_PIXELS
    image_module.MAX_IMAGE_PIXELS = max_pixels // 2
    try:
        yield
    finally:
        image_module.MAX_IMAGE_PIXELS = saved


def _check_pixels(path: Path, what: str, width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise InputError(
            f"{path}: {what} {width}x{height} is over the {max_pixels}-pixel limit derived from the model input; "
            f"check --preprocess resize, or set {PIXELS_ENV} to allow it"
        )


def _resize(img, recipe: Preprocess, path: Path, max_pixels: int):
    from PIL import Image

    width, height = recipe.resize
    if recipe.crop != "center":
        return img.resize((width, height), Image.BILINEAR)
    factor = max(width / img.width, height / img.height)
    size = (max(width, round(img.width * factor)), max(height, round(img.height * factor)))
    _check_pixels(path, "scaled image (before the center crop)", *size, max_pixels)
    scaled = img.resize(size, Image.BILINEAR)
    left, top = (scaled.width - width) // 2, (scaled.height - height) // 2
    return scaled.crop((left, top, left + width, top + height))
