"""Benchmark: layerdiff's end-to-end verdict on an MNN model vs MNN's own backendTest (issue 20).

    MNN_ROOT=<MNN build> python tests/bench/bench_mnn_verdict.py [--rounds 3] [--backend-test PATH]

Method. Both sides answer "does Vulkan at low precision compute this model like the CPU?" on
samples/models/convnet.mnn, timed as wall clock around whole processes, median over `rounds`:

- layerdiff: `collect --backend cpu --precision high`, then `collect --backend vulkan --precision
  low` (same output directory, `--no-report`), then `analyze compare` of the two runs, i.e. the
  commands a user types up to the first-divergence verdict. The device is an x86_64 adb stand-in
  (tests/standin) running the C++ MNN harness built against $MNN_ROOT on this host, so the phone
  path (push, run, pull, HDF5) is what is timed; the harness, model and input are pushed once,
  before the first round, as on a phone that already has them.
- MNN: `backendTest.out convnet.mnn 7 0.05` (7 = MNN_FORWARD_VULKAN, tolerance 0.05), MNN's
  per-op CPU-vs-backend check, found in $MNN_ROOT/bin, beside lib/, or given by --backend-test.
  Without it only layerdiff's time is printed. With MNN_SEP_BUILD the binary must be linked with
  libMNN_Vulkan.so (MNN's own tools build does so); without it MNN silently tests the CPU against
  itself in well under a second and says "Correct".

ratio = layerdiff seconds / backendTest seconds (goal from issue 20: below 1). Exits with a
message when MNN_ROOT is unset: there is nothing to measure without an MNN build.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from collector.harness import HarnessSpec, ensure_built  # noqa: E402
from tests.standin.launcher import AdbServer, StandIn  # noqa: E402

MODEL = REPO / "samples" / "models" / "convnet.mnn"
INPUT = REPO / "samples" / "inputs" / "convnet.npy"


def timed(cmd: list[str], env: dict, cwd: Path = REPO) -> float:
    """Seconds the command took; a failing command ends the benchmark with its stderr."""
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({result.returncode}): {result.stderr[-2000:]}")
    return elapsed


def layerdiff_verdict(serial: str, out: Path, env: dict) -> tuple[float, list[float]]:
    """(total seconds, [collect cpu/high, collect vulkan/low, analyze]) for one round."""
    runs = out / "runs"
    collect = [sys.executable, "-m", "collector.cli", "--device", serial, "--model", str(MODEL),
               "--input", f"data={INPUT}", "--no-report", "-o", str(runs)]
    steps = [timed([*collect, "--backend", "cpu", "--precision", "high"], env),
             timed([*collect, "--backend", "vulkan", "--precision", "low"], env),
             timed([sys.executable, "-m", "analyzer.cli", "compare", str(runs), "-o", str(out / "report")], env)]
    return sum(steps), steps


def find_backend_test(mnn_root: Path, given: str | None) -> Path | None:
    candidates = [Path(given)] if given else [mnn_root / "bin" / "backendTest.out", mnn_root / "backendTest.out"]
    return next((c for c in candidates if c.is_file()), None)


def backend_test_time(binary: Path, mnn_root: Path) -> tuple[float, str]:
    """Seconds for `backendTest.out convnet.mnn 7 0.05`, and its last line."""
    env = {**os.environ, "LD_LIBRARY_PATH": f"{mnn_root / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    start = time.perf_counter()
    result = subprocess.run([str(binary), str(MODEL), "7", "0.05"], capture_output=True, text=True, env=env,
                            cwd=binary.parent)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"backendTest.out failed ({result.returncode}): {result.stderr[-2000:]}")
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    correct = sum("Correct" in ln for ln in lines)
    return elapsed, f"{correct} lines say Correct; last: {lines[-1] if lines else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend-test", help="MNN's backendTest.out (default: under $MNN_ROOT)")
    args = parser.parse_args()
    if not os.environ.get("MNN_ROOT"):
        raise SystemExit("set MNN_ROOT to an MNN build (include/ and lib/) to run this benchmark")
    mnn_root = Path(os.environ["MNN_ROOT"])
    binary = ensure_built(HarnessSpec("host", with_ncnn=False, mnn_root=str(mnn_root)))
    with tempfile.TemporaryDirectory(prefix="ld-bench-mnn-") as tmp:
        root = Path(tmp)
        server = AdbServer(root / "adb-home").start()
        phone = StandIn.create(root / "phone").start()
        try:
            server.connect(phone.serial)
            env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(server.port), "ADBUTILS_ADB_PATH": server.adb,
                   "LAYERDIFF_HARNESS_X86_64": str(binary), "PYTHONPATH": str(REPO)}
            layerdiff_verdict(phone.serial, root / "warm", env)  # stages harness, libMNN, model, input once
            rounds = [layerdiff_verdict(phone.serial, root / f"round{i}", env) for i in range(args.rounds)]
        finally:
            phone.kill()
            server.kill()
    totals = [total for total, _ in rounds]
    median = statistics.median(totals)
    steps = [statistics.median(r[1][i] for r in rounds) for i in range(3)]
    print(f"model: {MODEL.name}, MNN_ROOT={mnn_root}, {args.rounds} rounds (after one warm-up)")
    print(f"layerdiff verdict:        {median:7.2f} s median (min {min(totals):.2f}, max {max(totals):.2f})")
    print(f"  collect cpu/high        {steps[0]:7.2f} s")
    print(f"  collect vulkan/low      {steps[1]:7.2f} s")
    print(f"  analyze compare         {steps[2]:7.2f} s")
    backend_test = find_backend_test(mnn_root, args.backend_test)
    if backend_test is None:
        print("backendTest.out: not found (pass --backend-test PATH); no ratio")
        return
    times, summary = zip(*(backend_test_time(backend_test, mnn_root) for _ in range(args.rounds)))
    reference = statistics.median(times)
    print(f"backendTest.out 7 0.05:   {reference:7.2f} s median ({summary[0]})")
    print(f"ratio layerdiff/backendTest: {median / reference:5.2f} (goal < 1)")


if __name__ == "__main__":
    main()
