"""Benchmark: time per run on the emulated `arm64` device vs the `local` device, per engine.

Run by hand:  python tests/bench/bench_arm64.py [--model convnet] [--rounds 2] [--cpu cortex-a76]
For each engine (MNN `.mnn`, ncnn `.param`) and precision (high, low) it runs the sample model
through `collect_run` (the same call a sweep makes) on both devices and prints, per run, the wall
time, the harness process time (start-up + load + inference + dump, as `collect` records it), the
engine's own inference time, and the arm64/local ratios. The runtime is built before timing.
qemu-user translates every ARM instruction, so the arm64 numbers say how long a sweep waits, not
how fast a phone is.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from layerdiff.analyzer.formats.dumpfile import DumpFile  # noqa: E402
from layerdiff.collector.transport.arm64 import Arm64Device  # noqa: E402
from layerdiff.collector.transport.devices import LocalDevice  # noqa: E402
from layerdiff.collector.inputs.inputset import InputSet  # noqa: E402
from layerdiff.collector.inputs.modelfiles import resolve_model  # noqa: E402
from layerdiff.collector.run.pipeline import RunSpec, collect_run  # noqa: E402
from tests.conftest import MODELS, sample_input  # noqa: E402


def one_run(device, model: str, precision: str, out: Path) -> tuple[float, float, float]:
    """(wall s, harness process s, engine inference ms) of one run."""
    stem = Path(model).stem
    inputs = InputSet(stem, {"data": sample_input(stem)}, f"samples/inputs/{stem}.npy")
    spec = RunSpec(resolve_model(MODELS / model), "cpu", precision, inputs)
    start = time.perf_counter()
    outcome = collect_run(device, spec, out, force=True)
    wall = time.perf_counter() - start
    if outcome.status != "done":
        raise SystemExit(f"{device.serial} {model} {precision}: {outcome.message}")
    with DumpFile(outcome.paths[0]) as dump:
        return wall, float(dump.provenance["harness_duration_s"]), float(dump.attrs["infer_ms"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="convnet", help="sample stem (samples/models/STEM.mnn and .param)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpu", default="cortex-a76")
    args = parser.parse_args()
    arm64, local = Arm64Device(args.cpu), LocalDevice()
    arm64.runtime()  # built (or found) before the clock starts
    print(f"{'engine':6s} {'prec':5s} {'device':8s} {'wall s':>8s} {'process s':>10s} {'infer ms':>10s}")
    with tempfile.TemporaryDirectory(prefix="bench-arm64-") as tmp:
        for suffix in (".mnn", ".param"):
            for precision in ("high", "low"):
                medians = {}
                for device in (local, arm64):
                    rows = [one_run(device, args.model + suffix, precision, Path(tmp)) for _ in range(args.rounds)]
                    medians[device.serial] = [statistics.median(col) for col in zip(*rows)]
                    wall, process, infer = medians[device.serial]
                    print(f"{suffix[1:]:6s} {precision:5s} {device.serial:8s} {wall:8.2f} {process:10.2f} {infer:10.1f}")
                ratio = [a / b for a, b in zip(medians[arm64.serial], medians["local"])]
                print(f"{'':6s} {'':5s} {'ratio':8s} {ratio[0]:7.1f}x {ratio[1]:9.1f}x {ratio[2]:9.1f}x")


if __name__ == "__main__":
    main()
