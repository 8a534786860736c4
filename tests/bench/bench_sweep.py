"""Benchmark: k stand-in phones swept concurrently vs one phone with the same per-phone work.

Run by hand:  python tests/bench/bench_sweep.py [--phones 4] [--sleep 0.3]
Each phone runs the fake harness (tests/standin/fake_harness.py) sleeping `--sleep` seconds per
tensor, so the device side dominates as on real phones. Prints both wall times and their ratio
(goal: k phones ≤ 1.3 × one phone).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.standin.fixtures import FAKE_HARNESS  # noqa: E402
from tests.standin.launcher import AdbServer, StandIn  # noqa: E402


def sweep(devices: str, out: Path, env: dict) -> float:
    args = [sys.executable, "-m", "layerdiff.collector.cli", "--device", devices, "--model",
            str(REPO / "samples" / "models" / "convnet.param"), "--backend", "cpu", "--precision", "high,normal,low",
            "--input", "random:1", "--input", "random:2", "-o", str(out)]
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"sweep failed: {result.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phones", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = AdbServer(root / "adb-home").start()
        os.environ["LAYERDIFF_FAKE_HARNESS_SLEEP"] = str(args.sleep)
        phones = [StandIn.create(root / f"phone{i}").start() for i in range(args.phones)]
        try:
            for phone in phones:
                server.connect(phone.serial)
            env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(server.port), "ADBUTILS_ADB_PATH": server.adb,
                   "LAYERDIFF_HARNESS_X86_64": str(FAKE_HARNESS), "PYTHONPATH": str(REPO)}
            one = sweep(phones[0].serial, root / "one", env)
            many = sweep("all", root / "many", env)
        finally:
            for phone in phones:
                phone.kill()
            server.kill()
    print(json.dumps({"phones": args.phones, "runs_per_phone": 6, "one_phone_s": round(one, 2),
                      "all_phones_s": round(many, 2), "ratio_all_over_one": round(many / one, 3)}, indent=2))


if __name__ == "__main__":
    main()
