"""Benchmark: isolating k layers vs re-running the whole model k times (ncnn, local device).

Run by hand:  python tests/bench/bench_isolate.py [--model samples/models/deepnet.param] [--k 8]
              [--backend vulkan --precision low]
Prints wall-clock times (process start included, as a user waits for them) and engine times (the
sum of per-op `time_ms` for the isolated layers vs k full inferences), and their ratios.
Method: after the reference run (which also warms caches), rounds alternate "k full runs" and
"isolate k layers"; each round gives one ratio, and the figure printed is the median over rounds
(see tests/bench/measure.py for why).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from layerdiff.analyzer.formats.dumpfile import DumpFile  # noqa: E402
from layerdiff.collector.transport.devices import LocalDevice  # noqa: E402
from layerdiff.collector.inputs.inputset import random_inputs, InputSet  # noqa: E402
from layerdiff.collector.run.isolate import isolate  # noqa: E402
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model  # noqa: E402
from layerdiff.collector.run.pipeline import RunSpec, collect_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(REPO / "samples" / "models" / "deepnet.param"))
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--backend", default="vulkan")
    parser.add_argument("--precision", default="low")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = resolve_model(args.model)
    inputs = InputSet("random0", random_inputs(input_shapes(model), 0), "random:0")
    device = LocalDevice()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        ref = collect_run(device, RunSpec(model, "cpu", "high", inputs), out / "ref").paths[0]
        with DumpFile(ref) as dump:
            keys = [k for k in dump.layers["key"] if not k.startswith(("data", "splitncnn"))][: args.k]
        rounds = []
        for r in range(args.rounds):
            start = time.perf_counter()
            full_engine_ms = 0.0
            for i in range(len(keys)):
                path = collect_run(device, RunSpec(model, args.backend, args.precision, inputs),
                                   out / f"full{r}_{i}").paths[0]
                with DumpFile(path) as dump:
                    full_engine_ms += float(dump.attrs["infer_ms"])
            full_s = time.perf_counter() - start
            start = time.perf_counter()
            iso = isolate(device, model, args.backend, args.precision, ref, keys, out / f"iso{r}").paths[0]
            iso_s = time.perf_counter() - start
            with DumpFile(iso) as dump:
                iso_engine_ms = float(dump.layers["time_ms"].sum())
            rounds.append((full_s, iso_s, full_engine_ms, iso_engine_ms))
    print(json.dumps({
        "model": Path(args.model).name, "k": len(keys), "backend": args.backend, "precision": args.precision,
        "rounds": len(rounds),
        "k_full_runs_wall_s": round(statistics.median(r[0] for r in rounds), 2),
        "isolate_k_wall_s": round(statistics.median(r[1] for r in rounds), 2),
        "wall_ratio_isolate_over_k_full": round(statistics.median(r[1] / r[0] for r in rounds), 3),
        "engine_ratio_isolate_over_k_full": round(statistics.median(r[3] / r[2] for r in rounds), 3),
    }, indent=2))

if __name__ == "__main__":
    main()
