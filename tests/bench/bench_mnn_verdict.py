"""Benchmark: layerdiff's end-to-end verdict on an MNN model vs MNN's own backendTest.

    MNN_ROOT=<MNN build> python tests/bench/bench_mnn_verdict.py [--rounds 5] [--backend-test PATH]

Method. Both sides answer "does Vulkan at low precision compute this model like the CPU?" on
samples/models/convnet.mnn. Wall clock around whole processes (the device's work happens outside
the measured process, so CPU time would not compare); the commands alternate (backendTest,
layerdiff, backendTest, ...) after one warm-up of each, so both see the same load, and every
figure is the median over rounds; ratio = median of the per-round layerdiff / backendTest ratios.

- layerdiff, one command: `collect --config cpu/high,vulkan/low` (the two runs, then the report,
  which prints its verdict table and findings before drawing the plots); also the cross product
  `--backend cpu,vulkan --precision high,low` (four runs). Two times each:
  *verdict* = until the last line of that verdict is printed, *command* = until the process exits
  (report page and plots written). The device is an x86_64 adb stand-in (tests/standin) running
  the C++ MNN harness built against $MNN_ROOT on this host, so the phone path (push, run, pull,
  HDF5) is what is timed; the harness, model and input are staged by the warm-up, as on a phone
  that already has them. Python children may keep compiled bytecode (in a temporary
  PYTHONPYCACHEPREFIX), as an installed package does, even when the environment says
  PYTHONDONTWRITEBYTECODE.
- layerdiff, three commands (`--three-commands`): `collect` cpu/high, `collect` vulkan/low, then
  `analyze`, the sequence the issue first timed.
- MNN: `backendTest.out convnet.mnn 7 0.05` (7 = MNN_FORWARD_VULKAN, tolerance 0.05), MNN's
  per-op CPU-vs-backend check, found in $MNN_ROOT/bin, beside lib/, or given by --backend-test.
  With MNN_SEP_BUILD the binary must be linked with libMNN_Vulkan.so (MNN's own tools build does
  so); without it MNN silently tests the CPU against itself in well under a second.

Goal: ratio below 1. Exits with a message when MNN_ROOT is unset or no
backendTest.out is found: there is nothing to compare with.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from layerdiff.collector.engines.mnn.harness import mnn_spec  # noqa: E402
from layerdiff.collector.harness.build import ensure_built  # noqa: E402
from tests.standin.launcher import AdbServer, StandIn  # noqa: E402

MODEL = REPO / "samples" / "models" / "convnet.mnn"
INPUT = REPO / "samples" / "inputs" / "convnet.npy"


@dataclass
class Timing:
    command: float       # seconds until the process (or the last of the processes) exits
    verdict: float       # seconds until the verdict is on the screen


def timed(cmd: list[str], env: dict, cwd: Path = REPO) -> Timing:
    """Run to completion; `verdict` is when the last stdout line arrived (the verdict printout)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    last_line = start
    for _line in proc.stdout:
        last_line = time.perf_counter()
    stderr = proc.stderr.read()
    code = proc.wait()
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed ({code}): {stderr[-2000:]}")
    return Timing(elapsed, last_line - start)


def collect_argv(serial: str, out: Path, *selection: str) -> list[str]:
    return [sys.executable, "-m", "layerdiff.collector.cli", "--device", serial, "--model", str(MODEL),
            "--input", f"data={INPUT}", *selection, "-o", str(out)]


def one_command(serial: str, out: Path, env: dict) -> Timing:
    """`--config cpu/high,vulkan/low`: the two runs the question needs, ending in the report and verdict."""
    shutil.rmtree(out, ignore_errors=True)
    return timed(collect_argv(serial, out, "--config", "cpu/high,vulkan/low"), env)


def cross_product(serial: str, out: Path, env: dict) -> Timing:
    """`--backend cpu,vulkan --precision high,low`: four runs (cpu/low and vulkan/high too)."""
    shutil.rmtree(out, ignore_errors=True)
    return timed(collect_argv(serial, out, "--backend", "cpu,vulkan", "--precision", "high,low"), env)


def three_commands(serial: str, out: Path, env: dict) -> Timing:
    """collect cpu/high, collect vulkan/low, analyze: verdict and end are the analyze's."""
    shutil.rmtree(out, ignore_errors=True)
    runs = out / "runs"
    first = timed(collect_argv(serial, runs, "--config", "cpu/high", "--no-report"), env).command
    second = timed(collect_argv(serial, runs, "--config", "vulkan/low", "--no-report"), env).command
    analyze = timed([sys.executable, "-m", "layerdiff.analyzer.cli.app", "compare", str(runs), "-o", str(out / "report")], env)
    return Timing(first + second + analyze.command, first + second + analyze.verdict)


def find_backend_test(mnn_root: Path, given: str | None) -> Path | None:
    candidates = [Path(given)] if given else [mnn_root / "bin" / "backendTest.out", mnn_root / "backendTest.out"]
    return next((c for c in candidates if c.is_file()), None)


def backend_test(binary: Path, mnn_root: Path) -> tuple[float, str]:
    """Seconds for `backendTest.out convnet.mnn 7 0.05`, and a summary of what it said."""
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


def child_env(root: Path, server: AdbServer, binary: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(ANDROID_ADB_SERVER_PORT=str(server.port), ADBUTILS_ADB_PATH=server.adb, PYTHONPATH=str(REPO),
               LAYERDIFF_HARNESS_X86_64=str(binary), PYTHONPYCACHEPREFIX=str(root / "pycache"))
    return env


def report(name: str, ours: list[Timing], reference: list[float]) -> None:
    for field in ("verdict", "command"):
        values = [getattr(t, field) for t in ours]
        ratio = statistics.median(v / r for v, r in zip(values, reference))
        print(f"{name} {field:8s} {statistics.median(values):6.2f} s median "
              f"(min {min(values):.2f}, max {max(values):.2f}); ratio to backendTest {ratio:5.2f} "
              f"({'met' if ratio < 1 else 'NOT MET'}, goal < 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend-test", help="MNN's backendTest.out (default: under $MNN_ROOT)")
    parser.add_argument("--three-commands", action="store_true", help="also time collect + collect + analyze")
    args = parser.parse_args()
    if not os.environ.get("MNN_ROOT"):
        raise SystemExit("set MNN_ROOT to an MNN build (include/ and lib/) to run this benchmark")
    mnn_root = Path(os.environ["MNN_ROOT"])
    mnn_check = find_backend_test(mnn_root, args.backend_test)
    if mnn_check is None:
        raise SystemExit(f"no backendTest.out under {mnn_root}/bin (build MNN with -DMNN_BUILD_TOOLS=ON, "
                         "or pass --backend-test PATH)")
    binary = ensure_built(mnn_spec("host", str(mnn_root)))
    sides = {"one command   ": one_command, "cross product ": cross_product}
    if args.three_commands:
        sides["three commands"] = three_commands
    timings: dict[str, list[Timing]] = {name: [] for name in sides}
    reference: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ld-bench-mnn-") as tmp:
        root = Path(tmp)
        server = AdbServer(root / "adb-home").start()
        phone = StandIn.create(root / "phone").start()
        try:
            server.connect(phone.serial)
            env = child_env(root, server, binary)
            backend_test(mnn_check, mnn_root)  # warm-up of each side: page cache, staging, bytecode
            for name, side in sides.items():
                side(phone.serial, root / "warm", env)
            for k in range(args.rounds):
                seconds, said = backend_test(mnn_check, mnn_root)
                reference.append(seconds)
                for name, side in sides.items():
                    timings[name].append(side(phone.serial, root / f"round{k}", env))
        finally:
            phone.kill()
            server.kill()
    print(f"model: {MODEL.name}, MNN_ROOT={mnn_root}, {args.rounds} alternating rounds after one warm-up")
    print(f"backendTest.out 7 0.05  {statistics.median(reference):6.2f} s median "
          f"(min {min(reference):.2f}, max {max(reference):.2f}); {said}")
    for name, values in timings.items():
        report(name, values, reference)


if __name__ == "__main__":
    main()
