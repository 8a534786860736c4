"""Regenerate every sample model and input: `python samples/generate.py [--out DIR] [--only STEM ...]`.

Writes, for each model stem in `layerdiff.samples.catalog.CATALOG`:
    DIR/models/<stem>.param, <stem>.bin   ncnn (weights stored fp32, or fp16 where the catalog says)
    DIR/models/<stem>.onnx                 ONNX opset 14, node names = layer names, fp32 weights
    DIR/models/<stem>.mnn                  converted by MNN's converter from the .onnx (`--fp16` likewise)
    DIR/inputs/<stem>.npy, <stem>_<label>.npy   the deterministic sample inputs
Every file is byte-identical from run to run (the .mnn's random UUID is replaced by one derived
from the ONNX bytes). DIR defaults to the samples/ directory itself.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from layerdiff.samples import images# noqa: E402
from layerdiff.samples.catalog import CATALOG, input_filename, sample_input  # noqa: E402
from layerdiff.samples.ncnn_emit import write_ncnn  # noqa: E402
from layerdiff.samples.onnx_emit import ConversionError, convert_many, write_onnx  # noqa: E402

SAMPLES_DIR = Path(__file__).resolve().parent


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)


def _write_sources(stem: str, out_dir: Path) -> tuple[list[Path], tuple[Path, Path, bool]]:
    """Write one model's ncnn files, ONNX and inputs; returns them and its pending MNN conversion."""
    model = CATALOG[stem]
    net = model.network()
    models, inputs = out_dir / "models", out_dir / "inputs"
    models.mkdir(parents=True, exist_ok=True)
    inputs.mkdir(parents=True, exist_ok=True)
    param, weights, onnx_file, mnn = (models / f"{stem}.{ext}" for ext in ("param", "bin", "onnx", "mnn"))
    write_ncnn(net, param, weights, storage=model.weight_storage)
    write_onnx(net, onnx_file)
    written = [param, weights, onnx_file, mnn]
    for label in model.inputs:
        written.append(inputs / input_filename(stem, label))
        _save_npy(written[-1], sample_input(stem, label))
    return written, (onnx_file, mnn, model.weight_storage == "fp16")


def generate(out_dir: str | os.PathLike = SAMPLES_DIR, only: list[str] | None = None) -> list[Path]:
    """Generate the chosen models (all by default) under `out_dir`; returns every path written."""
    unknown = sorted(set(only or []) - set(CATALOG))
    if unknown:
        raise KeyError(f"unknown sample model(s) {', '.join(unknown)}; known: {', '.join(CATALOG)}")
    written: list[Path] = []
    conversions = []
    if not only:
        written += images.generate(Path(out_dir) / "images")
    for stem in only or list(CATALOG):
        paths, conversion = _write_sources(stem, Path(out_dir))
        written += paths
        conversions.append(conversion)
    convert_many(conversions)  # one MNN process for all models
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate layerdiff's sample models and inputs.")
    parser.add_argument("--out", default=str(SAMPLES_DIR), help="output directory (default: samples/)")
    parser.add_argument("--only", nargs="*", metavar="STEM", help=f"models to build (from: {', '.join(CATALOG)})")
    args = parser.parse_args(argv)
    try:
        for path in generate(args.out, args.only):
            print(path)
    except (KeyError, ConversionError, OSError) as exc:
        print(f"generate.py: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
