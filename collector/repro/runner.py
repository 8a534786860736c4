"""Re-run one layer cut out of a model, as the failing and the reference configuration ran it.

Needs only the engine's wheel and numpy. Reads repro.json beside it (the cut model, the reference's input and
output tensors, and each configuration's options) and runs the model with the engine's half of the runner beside
it (engine_runner.py: how the engine's wheel runs the cut model). Prints, per configuration, the output against
the reference output (rel L2, max abs, NaN/Inf counts) and whether the failure reproduces; `--json` prints the same as one JSON document.

    python run_repro.py            # both configurations
    python run_repro.py --config run --json
"""
import argparse
import importlib
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def engine_version(engine_runner, engine):
    """The engine's version as its half of the runner says (`version(module)`), else the wheel's `__version__`,
    else its `version()` function."""
    if callable(getattr(engine_runner, "version", None)):
        return str(engine_runner.version(engine))
    version = getattr(engine, "__version__", None)
    if version is None and callable(getattr(engine, "version", None)):
        version = engine.version()
    return str(version or "unknown")


def gpu_info(engine_runner, engine):
    """The GPU the engine's wheel uses, when its half of the runner can tell (empty otherwise)."""
    ask = getattr(engine_runner, "gpu_info", None)
    return ask(engine) if ask else {}


def measure(out, ref):
    """How far `out` is from `ref` (float64), with the non-finite values counted."""
    out, ref = np.asarray(out), np.asarray(ref)
    same = out.shape == ref.shape and out.dtype == ref.dtype and out.tobytes() == ref.tobytes()
    a, b = out.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    both = np.isfinite(a) & np.isfinite(b)
    norm = float(np.linalg.norm(b[both])) if both.any() else 0.0
    diff = a[both] - b[both]
    finite_ok = bool(np.isfinite(a).all())
    return {
        "rel_l2": (float(np.linalg.norm(diff)) / norm if norm else float(np.linalg.norm(diff))) if finite_ok else None,
        "max_abs": float(np.abs(diff).max()) if diff.size and finite_ok else None,
        "nan": int(np.isnan(a).sum()),
        "pos_inf": int(np.isposinf(a).sum()),
        "neg_inf": int(np.isneginf(a).sum()),
        "bit_identical": bool(same),
    }


def reproduces(error, recorded):
    """The failure is there again: non-finite values if the failing run had them, else at least half its error."""
    if recorded["nan"] + recorded["pos_inf"] + recorded["neg_inf"]:
        return error["nan"] + error["pos_inf"] + error["neg_inf"] > 0
    if error["rel_l2"] is None:
        return True
    return error["rel_l2"] >= 0.5 * (recorded["rel_l2"] or 0.0) and error["rel_l2"] > 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="Re-run the cut-out layer and compare it with the reference.")
    parser.add_argument("--config", choices=("run", "reference", "both"), default="both")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--save", metavar="DIR", help="also write each configuration's outputs as .npy into DIR")
    args = parser.parse_args(argv)
    json_out = None
    if args.json:  # engines print to fd 1 from C (MNN: "MNN use low precision"): keep stdout for the JSON alone
        sys.stdout.flush()
        json_out = os.dup(1)
        os.dup2(2, 1)
    spec = json.loads((HERE / "repro.json").read_text())
    sys.path.insert(0, str(HERE))
    engine_runner = importlib.import_module("engine_runner")  # the engine's half, beside this file in the bundle

    engine = __import__(spec["module"]) if spec.get("module") else None  # None: an engine without a Python module
    names = ("run", "reference") if args.config == "both" else (args.config,)
    result = {"engine": spec["engine"], "engine_version": engine_version(engine_runner, engine),
              "platform": platform.platform(), "gpu": gpu_info(engine_runner, engine),
              "layer": spec["layer"], "configs": {}}
    for name in names:
        config = spec["configs"][name]
        outputs, reason = engine_runner.run(engine, spec, config, HERE)
        entry = {"backend": config["backend"], "precision": config["precision"], "ran": outputs is not None,
                 "reason": reason, "outputs": {}}
        for item in spec["outputs"] if outputs is not None else ():
            ref = np.load(HERE / item["reference_npy"])
            error = measure(outputs[item["blob"]], ref)
            if name == "run":
                error["reproduces"] = reproduces(error, item["recorded_error"])
            entry["outputs"][item["blob"]] = error
            if args.save:
                Path(args.save, name).mkdir(parents=True, exist_ok=True)
                np.save(Path(args.save, name, item["npy_name"]), outputs[item["blob"]])
        result["configs"][name] = entry
    if json_out is not None:
        sys.stdout.flush()
        with os.fdopen(json_out, "w") as out:
            out.write(json.dumps(result, indent=2) + "\n")
    else:
        print_text(result, spec)
    return 0


def print_text(result, spec):
    gpu = result["gpu"]
    gpu_text = (f"{gpu['device']} (vendor {gpu['vendor_id']}, device {gpu['device_id']}, driver {gpu['driver_version']}, "
                f"Vulkan {gpu['api_version']})" if gpu else "none")
    print(f"layer {result['layer']}  {result['engine']} {result['engine_version']}  {result['platform']}  GPU: {gpu_text}")
    for name, entry in result["configs"].items():
        head = f"{name:9s} {entry['backend']}/{entry['precision']}"
        if not entry["ran"]:
            print(f"{head}: not run: {entry['reason']}")
            continue
        for blob, e in entry["outputs"].items():
            rel = "n/a" if e["rel_l2"] is None else f"{e['rel_l2']:.3e}"
            peak = "n/a" if e["max_abs"] is None else f"{e['max_abs']:.3e}"
            line = (f"{head} {blob}: rel L2 {rel}, max abs {peak}, NaN {e['nan']}, +Inf {e['pos_inf']}, "
                    f"-Inf {e['neg_inf']}, bit-identical to reference: {'yes' if e['bit_identical'] else 'no'}")
            if "reproduces" in e:
                line += f"  => {'REPRODUCES' if e['reproduces'] else 'does not reproduce'}"
            print(line)
    recorded = spec["outputs"][0]["recorded_error"]
    rel = "n/a" if recorded["rel_l2"] is None else f"{recorded['rel_l2']:.3e}"
    peak = "n/a" if recorded["max_abs"] is None else f"{recorded['max_abs']:.3e}"
    print(f"recorded in the failing run: rel L2 {rel}, max abs {peak}, "
          f"NaN {recorded['nan']}, +Inf {recorded['pos_inf']}, -Inf {recorded['neg_inf']}")


if __name__ == "__main__":
    sys.exit(main())
