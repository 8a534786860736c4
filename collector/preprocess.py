"""Image preprocessing the way mobile apps do it, declared once and recorded in every run.

Input-dependent failures (seed 003: some photos collapse to zero at low precision) only show up
with real inputs prepared exactly as the app prepares them, so the recipe is explicit:
`resize=224x224,crop=center,color=rgb,mean=0.485,0.456,0.406,std=0.229,0.224,0.225,scale=1/255,layout=nchw`
or the same keys in a JSON/TOML file. Order of operations: decode → color → resize (+ center crop)
→ × scale → − mean → ÷ std → layout → batch of 1.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from analyzer.errors import LayerdiffError

KEYS = ("resize", "crop", "color", "mean", "std", "scale", "layout")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")


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
            data = json.loads(path.read_text())
        else:
            data = tomllib.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise LayerdiffError(f"{path}: cannot read the preprocessing file ({err})") from None
    data = data.get("preprocess", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise LayerdiffError(f"{path}: expected a table of preprocessing keys ({', '.join(KEYS)})")
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
            raise LayerdiffError(f"--preprocess: {token!r} has no key; write key=value ({', '.join(KEYS)})")
    return {k: v if len(v) > 1 else v[0] for k, v in out.items()}


def _from_mapping(data: dict, where: str) -> Preprocess:
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise LayerdiffError(f"{where}: unknown preprocessing key {unknown[0]!r}; known keys: {', '.join(KEYS)}")
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
            p.scale = float(Fraction(str(data["scale"]).strip()))
    except (ValueError, ZeroDivisionError) as err:
        raise LayerdiffError(f"{where}: {err}") from None
    if any(s == 0 for s in p.std):
        raise LayerdiffError(f"{where}: std must not be 0")
    return p


def _size(value) -> tuple[int, int]:
    text = "x".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    parts = text.lower().split("x")
    if len(parts) == 1:
        parts = parts * 2
    width, height = (int(v) for v in parts)
    if width <= 0 or height <= 0:
        raise ValueError(f"resize {text!r} must be positive, like 224x224")
    return width, height


def _choice(value, allowed: tuple[str, ...], key: str) -> str:
    text = str(value).strip().lower()
    if text not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    return text


def _floats(value) -> tuple[float, ...]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return tuple(float(Fraction(str(v).strip())) for v in items)


def default_for(shape: tuple[int, ...]) -> Preprocess:
    """Without a recipe: fit the model's input size, RGB, [0, 1], NCHW (or NHWC if the shape says so)."""
    if len(shape) == 4 and shape[-1] in (1, 3) and shape[1] not in (1, 3):
        return Preprocess(resize=(shape[2], shape[1]), layout="nhwc", color="gray" if shape[-1] == 1 else "rgb")
    if len(shape) == 4:
        return Preprocess(resize=(shape[3], shape[2]), color="gray" if shape[1] == 1 else "rgb")
    raise LayerdiffError(f"model input shape {list(shape)} is not an image; pass a .npy instead")


def load_image(path: Path, recipe: Preprocess) -> np.ndarray:
    """Decode and prepare one image; the array returned is exactly what the model is fed."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img = img.convert("L" if recipe.color == "gray" else "RGB")
            if recipe.resize:
                img = _resize(img, recipe)
            pixels = np.asarray(img, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise LayerdiffError(f"{path}: cannot read this image ({type(err).__name__}: {err})") from None
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if recipe.color == "bgr":
        pixels = pixels[:, :, ::-1]
    pixels = pixels * recipe.scale
    pixels = (pixels - np.asarray(recipe.mean, np.float32)) / np.asarray(recipe.std, np.float32)
    if recipe.layout == "nchw":
        pixels = pixels.transpose(2, 0, 1)
    return np.ascontiguousarray(pixels[None], dtype=np.float32)


def _resize(img, recipe: Preprocess):
    from PIL import Image

    width, height = recipe.resize
    if recipe.crop != "center":
        return img.resize((width, height), Image.BILINEAR)
    factor = max(width / img.width, height / img.height)
    scaled = img.resize((max(width, round(img.width * factor)), max(height, round(img.height * factor))), Image.BILINEAR)
    left, top = (scaled.width - width) // 2, (scaled.height - height) // 2
    return scaled.crop((left, top, left + width, top + height))
