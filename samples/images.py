"""Small generated photos for seed 003 ("all-zero output for some photos only, at low precision").

No downloads: each image is a smooth random scene (low-frequency noise, like a blurred photo) whose
brightness range decides its fate on the `underflow` model. Prepared with `scale=1/255` and no
mean subtraction, a well-exposed photo keeps the model's activations far above fp16's subnormal
range, a dim one pushes `gate/scale` into fp16 subnormals, and a nearly black one below fp16's
smallest subnormal (6e-8), where fp16 arithmetic returns exact zeros.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

IMAGES_DIR = Path(__file__).resolve().parent / "images"
SIZE = 48  # not the model's 32x32: the preprocessing (resize + center crop) is part of the story
# name -> (seed, brightest pixel value)
PHOTOS = {
    "street_day": (21, 255), "beach_noon": (22, 255),
    "room_dusk": (23, 3), "alley_dusk": (24, 3),
    "garden_night": (25, 1), "tunnel_night": (26, 1),
}
RECIPE = "resize=32x32,crop=center,color=rgb,scale=1/255,layout=nchw"


def scene(seed: int, brightest: int, size: int = SIZE) -> np.ndarray:
    """A smooth RGB scene scaled so its brightest pixel is `brightest` (uint8, HxWx3)."""
    rng = np.random.default_rng(seed)
    coarse = rng.random((6, 6, 3))
    image = np.asarray(Image.fromarray((coarse * 255).astype(np.uint8)).resize((size, size), Image.BICUBIC),
                       dtype=np.float64) / 255.0
    image = image + 0.15 * rng.random((size, size, 3))
    image = (image - image.min()) / (image.max() - image.min())
    return np.round(image * brightest).astype(np.uint8)


def generate(out_dir: Path = IMAGES_DIR) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (seed, brightest) in PHOTOS.items():
        path = out_dir / f"{name}.png"
        Image.fromarray(scene(seed, brightest)).save(path, optimize=False)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in generate():
        print(path)
