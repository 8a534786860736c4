"""Where the bundled sample model lives, so `collect` runs with no model argument (the quick start)."""
from __future__ import annotations

from pathlib import Path

from layerdiff import samples

from layerdiff.errors import InputError

SAMPLES_DIR = Path(samples.__file__).resolve().parent
DEFAULT_MODEL = SAMPLES_DIR / "models" / "convnet.param"


def default_model() -> Path:
    if not DEFAULT_MODEL.is_file():
        raise InputError(
            f"no --model given and the bundled sample {DEFAULT_MODEL} is missing; pass --model FILE "
            "(or run `python samples/generate.py` in a checkout)"
        )
    return DEFAULT_MODEL
