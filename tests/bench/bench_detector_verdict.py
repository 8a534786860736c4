"""Manual check: the issue's 640x640 detector case, fp16 Vulkan and bf16 CPU against the ONNX Runtime golden.

    python tests/bench/bench_detector_verdict.py [--size 640]

The PP-OCRv4 detector of the test corpus (tests/corpus.py) is converted with pnnx at `size` x
`size`, fed a rendered page of eight lines of text, and collected on ONNX Runtime (the golden) and on
ncnn cpu/high, vulkan/low (fp16 on lavapipe) and cpu/low (bf16 on x86); then `analyze` judges each
run. Printed per run: the verdict and its reason, the output's rel L2, and what a user of the
detector sees: how many text-mask pixels (probability > 0.3, PP-OCR's threshold) change, and how many
background probabilities below fp16's smallest normal (6.1e-5) became 0. The verdict a user agrees
with: the fp16 flush of negligible background values is no FAIL, and the bf16 run,
which moves more pixels, is not judged better than the fp16 one. Takes a few minutes (the dumps are
0.5-0.7 GB each). The same check at 256x256 runs in CI (tests/test_corpus.py).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from layerdiff.analyzer.analysis import analyze_paths  # noqa: E402
from layerdiff.analyzer.formats.dumpfile import DumpFile  # noqa: E402
from tests.bench.bench_collect_memory import ocr_det_model  # noqa: E402

MASK_THRESHOLD = 0.3
FP16_MIN_NORMAL = 6.1e-5
RUNS = (("onnxruntime", "cpu", "high"), ("ncnn", "cpu", "high"), ("ncnn", "vulkan", "low"), ("ncnn", "cpu", "low"))


def collect(model: Path, inputs: Path, backend: str, precision: str, out: Path) -> Path:
    """One `collect` run on the local device; returns its HDF5."""
    argv = [sys.executable, "-m", "layerdiff.collector.cli", "--device", "local", "--model", str(model), "--input", str(inputs),
            "--backend", backend, "--precision", precision, "--out", str(out), "--no-report"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"collect failed: {proc.stderr.strip()[-600:]}")
    return next(out.glob(f"*_{backend}_{precision}_*.h5"))


def model_output(path: Path) -> np.ndarray:
    """The detector's probability map: the last tensor of the run (both engines end with the Sigmoid)."""
    with DumpFile(path) as dump:
        last = list(dump.layers.itertuples())[-1]
        return dump.tensor(last.order).astype(np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=640)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-detector-verdict-") as tmp:
        folder = Path(tmp)
        models = {engine: ocr_det_model(folder, engine, args.size) for engine in ("onnxruntime", "ncnn")}
        files = {run: collect(*models[run[0]], run[1], run[2], folder / "runs") for run in RUNS}
        golden = files[RUNS[0]]
        paths = [files[r] for r in RUNS]
        analysis = analyze_paths(paths, ref=golden)
        try:
            rows = {Path(row["file"]).name: row for row in analysis.summary.to_dict("records")}
        finally:
            analysis.close()
        reference = model_output(golden)
        mask = reference > MASK_THRESHOLD
        print(f"ocr_det {args.size}x{args.size}: golden text mask {int(mask.sum())} of {mask.size} pixels")
        for run in RUNS[1:]:
            row = rows[files[run].name]
            values = model_output(files[run]).reshape(reference.shape)
            changed = int(((values > MASK_THRESHOLD) != mask).sum())
            flushed = int(((values == 0) & (reference > 0) & (reference < FP16_MIN_NORMAL)).sum())
            print(f"{row['run']:<28} {row['verdict']:<5} output rel L2 {row['output_rel_l2']:.3g}, "
                  f"{row['output_beyond_tolerance']:.3%} beyond tolerance; mask pixels changed {changed}, "
                  f"background values flushed to 0: {flushed}")
            print(f"{'':<28} {row['verdict_reason']}")


if __name__ == "__main__":
    main()
