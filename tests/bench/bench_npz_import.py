"""Benchmark: importing an `.npz` golden is linear in its members (2,000 members took 22 s).

Run by hand:  python tests/bench/bench_npz_import.py [--members 200 2000]

Each size is an ONNX Runtime-style archive (name -> 4x4 float32 array) written with numpy into a
temporary directory and imported with `import_any` (to an explicit output, so no cache is involved);
printed: CPU seconds of the import (`time.process_time`, the machine is shared) and the ratio to the
first size against the ratio of members.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from layerdiff.analyzer.importers import import_any  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[200, 2000])
    args = parser.parse_args()
    first = None
    with tempfile.TemporaryDirectory() as tmp:
        for members in args.members:
            path = Path(tmp) / f"golden{members}.npz"
            np.savez(path, **{f"/blk{i}/Conv_output_0": np.full((4, 4), i, np.float32) for i in range(members)})
            start = time.process_time()
            import_any(path, None, Path(tmp) / f"golden{members}.h5")
            seconds = time.process_time() - start
            first = first or (members, seconds)
            print(f"{members:6d} members: {seconds:6.2f} s CPU; x{members / first[0]:.0f} members -> "
                  f"x{seconds / first[1]:.1f} time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
