"""Benchmark: pulling a raw dump through our collector vs `adb pull` of the same bytes.

Same adb server, same stand-in phone, the same dump directory: a 320 MB tensors.bin and its
manifest, both files pulled by both tools (the stand-in answers each file after an OKAY round trip
of ~40 ms, which a one-file `adb pull` did not pay). Method: one warm-up of each, then alternating
rounds (adb pull, ours, adb pull, ours, ...) timed by wall clock (a pull is I/O through the adb
server, not CPU in this process). Each pull's output is deleted and the page cache synced before
the next pull starts (the pull that ran second used to pay the first one's writeback: every third
round took twice as long). Each round gives one throughput ratio adb_time / our_time and the
figure printed is the median of those ratios (robust to one disturbed round; see
tests/bench/measure.py). Goal: >= 0.9.

    python -m tests.bench.bench_adb_pull [--mb 320] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
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
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="layerdiff-bench-pull-"))
    server = AdbServer(work / "home").start()
    os.environ["ANDROID_ADB_SERVER_PORT"], os.environ["ADBUTILS_ADB_PATH"] = str(server.port), server.adb
    standin = StandIn.create(work / "phone").start()
    try:
        server.connect(standin.serial)
        from layerdiff.collector.transport.adb import AdbDevice

        size = _write_dump(standin, args.mb)
        device = AdbDevice(standin.serial)
        ours, theirs = [], []
        for k in range(args.rounds + 1):  # round 0 warms both up and is not counted
            os.sync()  # each pull starts with no dirty pages: the one that ran second paid the other's writeback
            t = time.perf_counter()
            result = server.run("-s", standin.serial, "pull", DUMP, str(work / "adb"), timeout=600)
            theirs.append(time.perf_counter() - t)
            assert result.returncode == 0, result.stderr
            assert (work / "adb" / "tensors.bin").stat().st_size == size
            shutil.rmtree(work / "adb")
            os.sync()
            t = time.perf_counter()
            device.fetch_dir(DUMP, work / "ours")
            ours.append(time.perf_counter() - t)
            assert (work / "ours" / "tensors.bin").stat().st_size == size
            shutil.rmtree(work / "ours")
        ours, theirs = ours[1:], theirs[1:]
        mb = size / 1e6
        ratio = statistics.median(a / o for a, o in zip(theirs, ours))
        print(f"dump: {mb:.0f} MB tensors.bin + manifest, {args.rounds} alternating rounds after a warm-up")
        print(f"collector fetch_dir: median {statistics.median(ours):.2f} s  {mb / statistics.median(ours):.0f} MB/s"
              f"   (all: {', '.join(f'{x:.2f}' for x in ours)})")
        print(f"adb pull:            median {statistics.median(theirs):.2f} s  {mb / statistics.median(theirs):.0f} MB/s"
              f"   (all: {', '.join(f'{x:.2f}' for x in theirs)})")
        print(f"throughput ratio collector / adb pull (median of rounds): {ratio:.2f} (goal >= 0.9)"
              f" -> {'met' if ratio >= 0.9 else 'NOT MET'}")
    finally:
        standin.kill()
        server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
