"""Measure what each sample model shows on the host's real engines: `python samples/measure.py`.

For every catalog model and input, runs pip ncnn (cpu, vulkan) at high and low precision and pymnn
(cpu, high) on the committed files, and prints per run: the worst layer error against the numpy
reference, the first layer whose error passes 1e-2, and the first layer holding NaN/Inf, values
saturated at +-65504, or a collapse to zeros the reference does not have.
These are the numbers quoted in samples/README.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from layerdiff.samples.catalog import CATALOG, reference, sample_input  # noqa: E402
from layerdiff.samples.runners import compare, run_mnn, run_ncnn  # noqa: E402

MODEL_DIR = Path(__file__).resolve().parent / "models"
FP16_MAX = 65504.0
DIVERGED = 1e-2
CONFIGS = (("ncnn", "cpu", "high"), ("ncnn", "vulkan", "high"), ("mnn", "cpu", "high"),
           ("ncnn", "cpu", "low"), ("ncnn", "vulkan", "low"))


@dataclass
class RunSummary:
    """What one engine run shows against the reference."""

    worst_key: str
    worst_error: float
    first_diverged: str
    first_nonfinite: str
    first_saturated: str
    first_zero_collapse: str
    output_error: float

    def line(self) -> str:
        return (f"worst {self.worst_error:.2g} at {self.worst_key}; first >{DIVERGED:g}: {self.first_diverged or '-'}; "
                f"NaN/Inf from: {self.first_nonfinite or '-'}; +-65504 at: {self.first_saturated or '-'}; "
                f"zeros from: {self.first_zero_collapse or '-'}; output err {self.output_error:.2g}")


def _first(keys, run, test) -> str:
    return next((k for k in keys if k in run and test(k)), "")


def summarize(ref: dict[str, np.ndarray], run: dict[str, np.ndarray], output_key: str) -> RunSummary:
    """Reduce one run to the facts quoted in the README (all keys in reference order)."""
    errors = compare(ref, run)
    keys = [k for k in ref if k in errors]
    finite = {k: (e if np.isfinite(e) else np.inf) for k, e in errors.items()}
    worst = max(keys, key=lambda k: finite[k])
    return RunSummary(
        worst_key=worst, worst_error=finite[worst],
        first_diverged=_first(keys, run, lambda k: not finite[k] <= DIVERGED),
        first_nonfinite=_first(keys, run, lambda k: not np.all(np.isfinite(run[k]))),
        first_saturated=_first(keys, run, lambda k: bool(np.any(np.abs(run[k]) == FP16_MAX))),
        first_zero_collapse=_first(keys, run, lambda k: bool(np.all(run[k] == 0) and np.any(ref[k] != 0))),
        output_error=finite.get(output_key, np.inf))


def run_config(stem: str, label: str, engine: str, backend: str, precision: str) -> dict[str, np.ndarray]:
    x = sample_input(stem, label)
    if engine == "mnn":
        return run_mnn(MODEL_DIR / f"{stem}.mnn", x, precision)
    return run_ncnn(MODEL_DIR / f"{stem}.param", MODEL_DIR / f"{stem}.bin", x, backend, precision)


def top_k_agreement(a: np.ndarray, b: np.ndarray, k: int) -> bool:
    """True when the k highest classes of `a` and `b` are the same set."""
    return set(np.argsort(-a.ravel())[:k]) == set(np.argsort(-b.ravel())[:k])


def fp16_storage_drift() -> None:
    """Scenario 2: convnet_fp16w vs convnet, both at high precision, against convnet's fp32 reference."""
    ref = reference("convnet")
    for engine, backend in (("ncnn", "cpu"), ("ncnn", "vulkan"), ("mnn", "cpu")):
        run = run_config("convnet_fp16w", "", engine, backend, "high")
        errors = compare(ref, run)
        curve = " ".join(f"{errors[k]:.1e}" for k in ref if k in errors)
        top1, top5 = (top_k_agreement(ref["prob:0"], run["prob:0"], k) for k in (1, 5))
        print(f"convnet_fp16w {engine} {backend}/high vs convnet fp32 reference: per-layer {curve}; "
              f"top-1 agrees {top1}, top-5 agrees {top5}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", metavar="STEM", help="models to measure")
    args = parser.parse_args(argv)
    for stem in args.only or list(CATALOG):
        model = CATALOG[stem]
        output_key = f"{model.network().output_name}:0"
        for label in model.inputs:
            ref = reference(stem, label)
            for engine, backend, precision in CONFIGS:
                run = run_config(stem, label, engine, backend, precision)
                summary = summarize(ref, run, output_key)
                print(f"{stem}{'[' + label + ']' if label else ''} {engine} {backend}/{precision}: {summary.line()}")
    if not args.only or "convnet_fp16w" in args.only:
        fp16_storage_drift()
    return 0


if __name__ == "__main__":
    sys.exit(main())
