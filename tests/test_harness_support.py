"""Helpers shared by the C++ harness tests: build (cached), run, and read raw dumps.

Builds go through layerdiff.collector.harness.build, so a test session (and every later one) builds each variant
once; the first cold build of ncnn takes a few minutes, later sessions reuse the cache.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layerdiff.analyzer.formats.rawdump import RawDump, read_raw_dump
from layerdiff.collector.engines.ncnn.harness import ncnn_spec
from layerdiff.collector.harness.build import ensure_built

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "samples" / "models"
INPUTS = REPO / "samples" / "inputs"
HOST_SPEC = ncnn_spec("host", vulkan=True, test_build=True)
AARCH64_SPEC = ncnn_spec("aarch64", vulkan=False, test_build=True)


@dataclass
class HarnessRun:
    """What one harness invocation produced."""

    returncode: int
    stdout: str
    stderr: str
    out: Path

    def dump(self) -> RawDump:
        return read_raw_dump(self.out)

    def progress(self) -> list[dict]:
        return [json.loads(line[5:]) for line in self.stdout.splitlines() if line.startswith("@@ld ")]


def host_harness() -> Path:
    return ensure_built(HOST_SPEC)


def aarch64_harness() -> Path:
    return ensure_built(AARCH64_SPEC)


def model_args(stem: str) -> list[str]:
    return ["--engine", "ncnn", "--model", str(MODELS / f"{stem}.param"), "--model", str(MODELS / f"{stem}.bin"),
            "--input", f"data={INPUTS / f'{stem}.npy'}"]


def run_harness(prefix: list[str], args: list[str], out: Path | None, timeout: float = 300) -> HarnessRun:
    """Run `prefix + args (+ --out out)`; prefix is the binary, or qemu plus the binary."""
    cmd = [*prefix, *args] + (["--out", str(out)] if out is not None else [])
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return HarnessRun(result.returncode, result.stdout, result.stderr, out or Path())


def dump_model(prefix: list[str], stem: str, backend: str, precision: str, out: Path, *extra: str) -> HarnessRun:
    """A complete run of a sample model; fails the test with the harness's stderr if it fails."""
    run = run_harness(prefix, [*model_args(stem), "--backend", backend, "--precision", precision, *extra], out)
    assert run.returncode == 0, f"harness failed ({run.returncode}): {run.stderr}"
    return run


def arrays_by_key(dump: RawDump) -> dict[str, np.ndarray]:
    """Tensors keyed `<op>:<output index>`, the alignment key of FORMATS.md."""
    return {f"{t.op}:{t.output_index}": arr for t, arr in dump.iter_arrays()}


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


def max_scaled_diff(ours: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """Largest |ours - reference| over layers, divided by max(1, the layer's largest |reference|).

    Absolute on O(1) activations (the harness's 1e-4), relative on layers that reach 1e5 and
    more (the overflow sample), where fp32 rounding alone exceeds 1e-4 absolute.
    """
    worst = 0.0
    for key, ref in reference.items():
        ref64 = ref.astype(np.float64)
        scale = max(1.0, float(np.max(np.abs(ref64))) if ref64.size else 1.0)
        worst = max(worst, float(np.max(np.abs(ours[key].astype(np.float64) - ref64))) / scale if ref64.size else 0.0)
    return worst


def check_well_formed(run: HarnessRun) -> RawDump:
    """The raw-dump invariants this harness promises: contiguous bytes (the inputs read back first,
    then the tensors), sizes, footer, progress."""
    dump = run.dump()
    assert dump.footer is not None and dump.footer["status"] == "ok", dump.problems
    offset = 0
    for fed in dump.fed:
        assert fed.offset == offset and fed.nbytes == int(np.prod(fed.shape)) * 4
        offset += fed.nbytes
    for order, tensor in enumerate(dump.tensors):
        assert tensor.order == order and tensor.offset == offset
        assert tensor.dtype == "float32"
        assert tensor.nbytes == int(np.prod(tensor.shape)) * 4
        offset += tensor.nbytes
    assert dump.footer["tensors"] == len(dump.tensors)
    assert dump.footer["bytes"] == offset == (run.out / "tensors.bin").stat().st_size
    progress = run.progress()
    assert [p["k"] for p in progress] == list(range(1, len(dump.tensors) + 1))
    assert [p["op"] for p in progress] == [t.op for t in dump.tensors]
    return dump
