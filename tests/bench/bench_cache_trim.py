"""Benchmark: trimming the user's cache after an addition (every analysis adds two to three entries).

Run by hand:  python tests/bench/bench_cache_trim.py [--entries 9500] [--rounds 7] [--dir /tmp]

Why: every analysis stores its measurement, its dumps' headers and its report in the cache
(`layerdiff.analyzer.importers.convcache`) and keeps it within its size limit after each. A cache at its
limit holds thousands of entries (9,500 in a 4 GiB one), and a trim that looked at each of them (one
listing, one stat per entry: about 0.08 s) was paid by every analysis, a re-judged one included. The
cache's byte count now lives in a ledger updated under a lock, so an addition that keeps the cache
within its limit reads and rewrites one small file; the whole cache is counted only when an addition
would go over the limit (which then trims to 90% of it) or when the last count is over an hour old.

Method: a cache of `--entries` entries (a quarter stored report directories of 6 files, the rest
measurement files) in a temporary folder (LAYERDIFF_CACHE_DIR), with a limit high enough that nothing
is removed. In this process (the import is the same for all and not what is measured), CPU time
(`time.process_time`), alternated after one warm-up, median of `--rounds`:
- floor: `os.scandir` of the cache and one lstat per entry: what any trim that looks at every entry does;
- full count: `convcache.trim()` with nothing added (what a trim over the limit, or an hour after the
  last count, does; size records present after the first one);
- addition: a new measurement file written and `convcache.trim(keep=it)` (the ledger is read and
  rewritten), the file removed again outside the timing;
- walk: what a count did before size records: every file of every directory entry lstat'ed.
The first full count of a cache without records (it counts each directory once and records it) is
reported too.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REPORT_FILES = ("index.html", "summary.csv", "layers.csv", "runs.csv", "results.json", "view.json")


def make_cache(root: Path, entries: int) -> None:
    """`entries` entries: every fourth a stored report directory, the rest measurement files."""
    root.mkdir(mode=0o700, parents=True)
    for i in range(entries):
        if i % 4 == 0:
            folder = root / f"report-{i:032x}"
            folder.mkdir()
            for name in REPORT_FILES:
                (folder / name).write_bytes(b"x" * 2048)
        else:
            (root / f"results-{i:032x}.json").write_bytes(b"{}" * 1024)


def listing(root: Path) -> int:
    total = 0
    with os.scandir(root) as items:
        for item in items:
            total += item.stat(follow_symlinks=False).st_size
    return total


def walk(root: Path) -> int:
    total = 0
    for entry in root.iterdir():
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and not entry.is_symlink():
            total += sum(f.lstat().st_size for f in entry.rglob("*") if f.is_file())
        else:
            total += entry.lstat().st_size
    return total


def cpu(work) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=9500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary cache goes (removed after)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="layerdiff-bench-trim-", dir=args.dir))
    try:
        cache = folder / "cache"
        make_cache(cache, args.entries)
        os.environ["LAYERDIFF_CACHE_DIR"] = str(cache)
        os.environ["LAYERDIFF_CACHE_MAX_BYTES"] = str(1 << 40)  # nothing is removed: the same cache every round
        from layerdiff.analyzer.importers import convcache

        first = cpu(convcache.trim)  # no size records yet: each directory counted once, then recorded
        added = cache / f"results-{'f' * 32}.json"

        def addition() -> float:
            added.write_bytes(b"{}" * 1024)
            spent = cpu(lambda: convcache.trim(keep=added))
            added.unlink()
            convcache.trim()  # counted again without it: every round starts from the same ledger
            return spent

        steps = {"floor": lambda: cpu(lambda: listing(cache)), "full count": lambda: cpu(convcache.trim),
                 "addition": addition, "walk": lambda: cpu(lambda: walk(cache))}
        for step in steps.values():
            step()
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                times[name].append(step())
        median = {name: statistics.median(values) for name, values in times.items()}
        ratio = {name: statistics.median(t / f for t, f in zip(times[name], times["floor"])) for name in steps}
        print(f"cache of {args.entries} entries ({(args.entries + 3) // 4} report directories of {len(REPORT_FILES)} files), "
              f"median of {args.rounds} alternating rounds, CPU")
        print(f"first full count (size records written): {first * 1e3:.1f} ms")
        print(f"floor (one listing, lstat per entry): {median['floor'] * 1e3:.2f} ms")
        for name in ("addition", "full count", "walk"):
            print(f"{name}: {median[name] * 1e3:.2f} ms, {ratio[name]:.3f}x the floor")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
