"""Benchmark: pulling a raw dump through our collector vs `adb pull` of the same bytes.

Same adb server, same stand-in phone, same 320 MB tensors.bin; alternating runs, best of N each.
Prints MB/s for both and the throughput ratio (ours / adb pull; goal >= 0.9).

    python -m tests.bench.bench_adb_pull [--mb 320] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from tests.standin.launcher import AdbServer, StandIn

DUMP = "/data/local/tmp/layerdiff/runs/bench/dump"


def _write_dump(standin: StandIn, megabytes: int) -> int:
    target = standin.host_path(DUMP)
    target.mkdir(parents=True, exist_ok=True)
    (target / "manifest.jsonl").write_text('{"record": "header"}\n')
    block = os.urandom(1 << 20)
    with open(target / "tensors.bin", "wb") as f:
        for _ in range(megabytes):
            f.write(block)
    return megabytes << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="layerdiff-bench-pull-"))
    server = AdbServer(work / "home").start()
    os.environ["ANDROID_ADB_SERVER_PORT"], os.environ["ADBUTILS_ADB_PATH"] = str(server.port), server.adb
    standin = StandIn.create(work / "phone").start()
    try:
        server.connect(standin.serial)
        from collector.adb import AdbDevice

        size = _write_dump(standin, args.mb)
        device = AdbDevice(standin.serial)
        ours, theirs = [], []
        for k in range(args.rounds):
            t = time.perf_counter()
            device.fetch_dir(DUMP, work / f"ours{k}")
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            result = server.run("-s", standin.serial, "pull", f"{DUMP}/tensors.bin", str(work / f"adb{k}.bin"), timeout=600)
            theirs.append(time.perf_counter() - t)
            assert result.returncode == 0, result.stderr
            assert (work / f"ours{k}" / "tensors.bin").stat().st_size == size == (work / f"adb{k}.bin").stat().st_size
            shutil.rmtree(work / f"ours{k}")
            (work / f"adb{k}.bin").unlink()
        mb = size / 1e6
        best_ours, best_adb = min(ours), min(theirs)
        print(f"dump: {mb:.0f} MB tensors.bin + manifest, {args.rounds} alternating rounds (best of each)")
        print(f"collector fetch_dir: {best_ours:.2f} s  {mb / best_ours:.0f} MB/s   (all: {', '.join(f'{x:.2f}' for x in ours)})")
        print(f"adb pull:            {best_adb:.2f} s  {mb / best_adb:.0f} MB/s   (all: {', '.join(f'{x:.2f}' for x in theirs)})")
        print(f"throughput ratio collector / adb pull: {best_adb / best_ours:.2f} (goal >= 0.9)")
    finally:
        standin.kill()
        server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
