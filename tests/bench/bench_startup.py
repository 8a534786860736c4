"""Benchmark: the commands' start-up (`analyze --help`, `collect --help`) against importing the stack.

Run by hand:  python tests/bench/bench_startup.py [--rounds 7]

Method (tests/bench/measure.py): each command runs as a child process alternated with the floor, a
child Python that only runs `import numpy, h5py, pandas` (the analyzer's declared stack), after one
warm-up of each; CPU time (user + sys) per child; the figure printed is the median over rounds of
command CPU minus floor CPU. Target: at most +0.3 s CPU over the floor.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.measure import alternate, child_env, python, run_child, verdict  # noqa: E402

TARGET_EXTRA_CPU = 0.3
COMMANDS = {
    "analyze --help": ("-m", "layerdiff.analyzer.cli.app", "--help"),
    "collect --help": ("-m", "layerdiff.collector.cli", "--help"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    env = child_env()

    def floor():
        return run_child(python("-c", "import numpy, h5py, pandas"), env=env)

    for label, argv in COMMANDS.items():
        result = alternate(floor, lambda: run_child(python(*argv), env=env), args.rounds)
        extra = statistics.median(c.cpu - f.cpu for f, c in zip(result.floor, result.command))
        print(f"{label}: {result.median('command'):.2f} s CPU vs `import numpy, h5py, pandas` "
              f"{result.median('floor'):.2f} s: {extra:+.2f} s (target <= +{TARGET_EXTRA_CPU} s) -> "
              f"{verdict(extra <= TARGET_EXTRA_CPU)}", flush=True)


if __name__ == "__main__":
    main()
