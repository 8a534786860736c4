"""The floors `analyze` is held to, shared by bench_analyze.py and bench_golden_speed.py.

- `PAIRS_FLOOR`: a fresh analysis's tight floor on any set of runs: the matched layer pairs of a stored
  measurement (which tensor of which run against which tensor of the reference; finding them is the
  analyzer's work, not the floor's) are read with numpy and h5py alone, each reference tensor once and
  each run tensor once, into buffers reused for the whole run (h5py `read_direct`), and the same two
  numbers per pair as the synthetic floors (max |run - ref|, relative L2), ending without the interpreter's
  teardown as `analyze` does.
- `STORED_FLOOR`: the floor of re-showing an analysis: the stored measurement (every results-*.json
  entry of the cache, and the dumps' /layers tables of every header-*.json entry) read into DataFrames with
  numpy, orjson and pandas alone, no layerdiff import, and the kept model outputs' bytes (results-*.outputs), with
  the garbage collector set as the commands set it, ending as they end (no interpreter teardown).
- `rejudge_lines`: `analyze` again on the same runs (the stored report copied), then a threshold change
  and a `--task` change (a new value every round, so no stored report answers): each alternated with
  `STORED_FLOOR` and printed beside it and beside the `analyze again` figure; then the floor with a
  re-judge's other imports against the floor (the share of the ratio no judging or writing can remove).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

from tests.bench.measure import Usage, alternate, python, run_child, verdict

REJUDGE_TARGET = 1.3  # a threshold or task change: at most 1.3x the floor of reading the stored measurement
FRESH_TARGET = 1.5  # a fresh analysis: at most 1.5x the tight floor wherever that floor is at least 2 s of CPU
FRESH_TARGET_FROM_CPU = 2.0

STORED_FLOOR = """
import gc; gc.set_threshold(20000, 10, 10)  # the collector setting the commands run with (layerdiff/console.py)
import base64, os, sys
from pathlib import Path
import numpy as np, orjson, pandas as pd

def column(cells):
    if isinstance(cells, dict) and "strings" in cells:
        codes = np.frombuffer(base64.b64decode(cells["codes"]["base64"]), dtype=cells["codes"]["dtype"])
        return np.asarray(cells["strings"], dtype=object)[codes]
    if isinstance(cells, dict):
        return np.frombuffer(base64.b64decode(cells["base64"]), dtype=cells["dtype"])
    return cells

def frame(doc):
    return pd.DataFrame({c: column(v) for c, v in doc["data"].items()}, columns=doc["columns"])

for entry in sorted(Path(sys.argv[1]).glob("results-*.json")):
    doc = orjson.loads(entry.read_bytes())
    frames = [frame(a[part]) for a in doc["alignments"] for part in ("matched", "only_base", "only_other")]
    table = frame(doc["table"])
for entry in sorted(Path(sys.argv[1]).glob("header-*.json")):
    layers = frame(orjson.loads(entry.read_bytes())["layers"])
for side in sorted(Path(sys.argv[1]).glob("results-*.outputs")):
    kept = np.fromfile(side, dtype=np.uint8)
print(len(table), flush=True)
os._exit(0)  # the commands end without the interpreter's teardown (layerdiff/console.py): so does the floor
"""

# The floor with everything a re-judge imports beyond numpy, orjson and pandas (the command line's typer and
# rich, the analyzer's own modules), imported before the same reading: how much of the ratio the imports take.
REJUDGE_IMPORTS = ("import typer, rich.console, rich.table, rich.text\n"
                   "import layerdiff.analyzer.cli.app, layerdiff.analyzer.report.job, layerdiff.analyzer.align.byname\n")
STORED_FLOOR_WITH_IMPORTS = STORED_FLOOR.replace("import numpy as np, orjson, pandas as pd\n",
                                                 "import numpy as np, orjson, pandas as pd\n" + REJUDGE_IMPORTS)

PAIRS_FLOOR = """
import json, os, sys
import h5py, numpy as np
plan = json.loads(open(sys.argv[1]).read())
files = {path: h5py.File(path, "r") for path in [plan["reference"], *plan["runs"]]}
targets = {}
for path, pairs in plan["runs"].items():
    for base, other in pairs:
        targets.setdefault(base, []).append((files[path]["tensors"][str(other)]))
ref = files[plan["reference"]]["tensors"]
largest = max(ref[str(b)].size for b in targets)
bx, by = np.empty(largest, np.float32), np.empty(largest, np.float32)
worst = 0.0
for base, others in sorted(targets.items()):
    x = ref[str(base)]
    n = x.size
    if n == 0:
        continue
    xv = bx[:n].reshape(x.shape)
    x.read_direct(xv)
    xx = float(np.dot(bx[:n], bx[:n]))
    for y in others:
        if y.size != n:
            continue
        y.read_direct(by[:n].reshape(y.shape))
        np.subtract(by[:n], bx[:n], out=by[:n])
        dd = float(np.dot(by[:n], by[:n]))
        max_abs = float(np.abs(by[:n], out=by[:n]).max()) if n else 0.0
        worst = max(worst, (dd ** 0.5) / max(xx ** 0.5, 1e-30))
print(worst, flush=True)
os._exit(0)  # the commands end without the interpreter's teardown (layerdiff/console.py): so does the floor
"""


def pairs_plan(cache: Path, report: Path, out: Path) -> Path:
    """The floor's plan, from the one stored measurement in `cache` and the report's results.json (run
    label -> file): for every compared run the matched (reference order, run order) pairs; written to
    `out` (JSON) and returned."""
    import orjson

    from layerdiff.analyzer.formats.jsontable import table_frame as _frame

    results = json.loads((report / "results.json").read_text())
    files = {run["run"]: run["file"] for run in results["runs"]}
    (entry,) = sorted(cache.glob("results-*.json"))
    doc = orjson.loads(entry.read_bytes())
    table = _frame(doc["table"])
    runs: dict[str, list] = {}
    for index, alignment in enumerate(doc["alignments"]):
        matched = _frame(alignment["matched"])
        rows = table[table["pair"] == index]
        if rows.empty:
            continue
        run_file = files[str(rows["run"].iloc[0])]
        runs.setdefault(run_file, []).extend(
            [int(b), int(o)] for b, o in zip(matched["base_order"], matched["other_order"]))
    reference = files[str(rows["reference"].iloc[0])]
    out.write_text(json.dumps({"reference": reference, "runs": runs}))
    return out


def rejudge_lines(name: str, analyze: Callable[..., Usage], stored_floor: Callable[[], Usage], rounds: int,
                  task_values: Iterator[str], warmup: bool = True) -> list[str]:
    """`analyze` again, a threshold change and a task change, each against the stored-table floor
    (each line printed as soon as it is measured, and all returned).

    `analyze(*options)` runs the command on the same runs with the measurement kept in the cache."""
    again = alternate(stored_floor, lambda: analyze(), rounds, warmup=warmup)
    lines = [f"[{name}] analyze again, same runs (stored report copied): {again.median('command'):.2f} s CPU vs "
             f"reading the stored measurement {again.median('floor'):.2f} s: ratio {again.ratio():.2f} "
             f"(target <= {REJUDGE_TARGET}) -> {verdict(again.ratio() <= REJUDGE_TARGET)}"]
    print(lines[-1], flush=True)
    thresholds = (f"{0.02 + k * 1e-4:.4f}" for k in range(10**6))  # a new value every round: never a stored report
    changes = (("a threshold change (--warn-rel-l2)", lambda: analyze("--warn-rel-l2", next(thresholds))),
               ("a task change (--task)", lambda: analyze("--task", next(task_values))))
    for label, command in changes:
        result = alternate(stored_floor, command, rounds, warmup=warmup)
        ratio = result.ratio()
        lines.append(f"[{name}] {label}, stored measurement re-judged: {result.median('command'):.2f} s CPU vs "
                     f"reading the stored measurement {result.median('floor'):.2f} s: ratio {ratio:.2f} "
                     f"(target <= {REJUDGE_TARGET}) -> {verdict(ratio <= REJUDGE_TARGET)}; "
                     f"{result.median('command') / again.median('command'):.2f}x analyze again")
        print(lines[-1], flush=True)
    imports = alternate(stored_floor, lambda: stored_floor(STORED_FLOOR_WITH_IMPORTS), rounds, warmup=warmup)
    lines.append(f"[{name}] the floor with a re-judge's other imports (typer, rich, the analyzer's modules): "
                 f"{imports.median('command'):.2f} s CPU vs {imports.median('floor'):.2f} s: ratio {imports.ratio():.2f}, "
                 "before any judging or writing")
    print(lines[-1], flush=True)
    return lines


def fresh_line(name: str, floor_name: str, floor_cpu: float, command_cpu: float, ratio: float,
               fallback_target: float | None) -> str:
    """A fresh analysis against its floor, with the target that applies to a floor of that size."""
    if floor_cpu >= FRESH_TARGET_FROM_CPU:
        target, why = FRESH_TARGET, f"floor >= {FRESH_TARGET_FROM_CPU:g} s CPU"
    else:
        target, why = fallback_target, f"floor < {FRESH_TARGET_FROM_CPU:g} s CPU"
    head = (f"[{name}] fresh analyze {command_cpu:.2f} s CPU vs {floor_name} {floor_cpu:.2f} s: "
            f"ratio {ratio:.2f}")
    if target is None:
        return head + f" (no target: {why})"
    return head + f" (target <= {target:g}, {why}) -> {verdict(ratio <= target)}"


def stored_floor_runner(script_dir: Path, cache: Path, env: dict) -> Callable[..., Usage]:
    """Runs `STORED_FLOOR` on `cache` (or, given, another script's text on it) in a child process."""
    scripts = {}

    def run(text: str = STORED_FLOOR) -> Usage:
        if text not in scripts:
            scripts[text] = script_dir / f"stored_floor_{len(scripts)}.py"
            scripts[text].write_text(text)
        return run_child(python(str(scripts[text]), str(cache)), env=env)
    return run


def pairs_floor_runner(script_dir: Path, plan: Path, env: dict) -> Callable[[], Usage]:
    script = script_dir / "pairs_floor.py"
    script.write_text(PAIRS_FLOOR)
    return lambda: run_child(python(str(script), str(plan)), env=env)
