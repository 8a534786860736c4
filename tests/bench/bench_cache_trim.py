"""Benchmark: trimming the user's cache (after every analysis, twice) against one listing of it.

Run by hand:  python tests/bench/bench_cache_trim.py [--entries 3000] [--rounds 7] [--dir /tmp]

Why: every analysis stores its measurement and its report in the cache
(`layerdiff.analyzer.importers.convcache`) and trims it to its size limit each time. A trim used to
walk every file of every stored report (a developer's cache held 2,785 entries, 685 of them report
directories: 0.2 s a trim, twice an analysis), a cost that grows with the user's history, not with
the runs being analyzed. Directory sizes are now recorded once, in the name of an empty file beside
each directory, so a trim reads one directory listing.

Method: a cache of `--entries` entries shaped like that one (a quarter stored report directories of 6
files, the rest measurement files) in a temporary folder (LAYERDIFF_CACHE_DIR), with a limit high
enough that nothing is removed, so every round sees the same cache. In this process (the import is
the same for all three and not what is measured), CPU time (`time.process_time`), alternated after one
warm-up, median of `--rounds`:
- floor: `os.scandir` of the cache and one lstat per entry: the least an LRU trim must do (it needs
  each entry's size and last use);
- trim: `convcache.trim()` (size records present after the first trim);
- walk: what a trim did before: every file of every directory entry lstat'ed.
The first trim of a cache without records (it counts each directory once and records it) is reported too.
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
    parser.add_argument("--entries", type=int, default=3000)
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
        steps = {"floor": lambda: listing(cache), "trim": convcache.trim, "walk": lambda: walk(cache)}
        for step in steps.values():
            step()
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                times[name].append(cpu(step))
        median = {name: statistics.median(values) for name, values in times.items()}
        ratio = {name: statistics.median(t / f for t, f in zip(times[name], times["floor"])) for name in ("trim", "walk")}
        print(f"cache of {args.entries} entries ({(args.entries + 3) // 4} report directories of {len(REPORT_FILES)} files), "
              f"median of {args.rounds} alternating rounds, CPU")
        print(f"first trim (size records written): {first * 1e3:.1f} ms")
        print(f"floor (one listing, lstat per entry): {median['floor'] * 1e3:.1f} ms")
        print(f"trim: {median['trim'] * 1e3:.1f} ms, {ratio['trim']:.2f}x the floor")
        print(f"walk (a trim before size records): {median['walk'] * 1e3:.1f} ms, {ratio['walk']:.2f}x the floor")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
