"""Op isolation: re-run chosen layers on the target backend fed with the reference run's own inputs.

Cumulative comparisons cannot tell a broken kernel from error that grew on the way. Feeding a layer
exactly the reference's input tensors and running only that layer on the suspect backend/precision
answers it: if the isolated output is still off, the kernel is; if it is clean, the error came from
upstream. Only the tensors the targets consume travel to the device (an "inject" raw dump).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import DumpFormatError, InputError, NothingToCompareError, UsageError
from layerdiff.analyzer.formats.rawdump import RawDumpWriter, sha256_file
from layerdiff.analyzer.formats.limits import load_json
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.transport.devices import Device
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.run.outdir_lock import OutdirLock
from layerdiff.collector.run.pipeline import RunOutcome, RunSpec, check_run_options, collect_run

ISOLATE_PREFIX = "isolated_"
RANGE = ".."  # --layer FIRST..LAST: the layers between, isolated as one sub-graph (ggml)


def target_inputs(ref: DumpFile, keys: list[str]) -> dict[str, list[str]]:
    """Each target's input tensor names in the reference, plus what MNN's raster helpers read.

    MNN inserts `<op>_raster_<k>` ops at run time; they are not graph tensors a sub-graph can start
    from, so the tensors behind them travel too and the engine picks what its graph needs.
    """
    layers = ref.layers
    by_key = {row.key: row for row in layers.itertuples()}
    by_name = {row.name: row for row in layers.itertuples()}
    out: dict[str, list[str]] = {}
    for key in keys:
        if RANGE in key:
            first, last = (_row(ref, by_key, side) for side in key.split(RANGE, 1))
            out[f"{first.key}{RANGE}{last.key}"] = range_inputs(layers, first.order, last.order, key, ref.path)
            continue
        row = _row(ref, by_key, key)
        direct = _names(row.inputs, f"{ref.path}: /layers {row.key} inputs")
        out[row.key] = list(dict.fromkeys(direct + _through_rasters(direct, by_name)))
    return out


def _row(ref: DumpFile, by_key: dict, key: str):
    row = by_key.get(key) or by_key.get(f"{key}:0")
    if row is None:
        raise InputError(f"{ref.path}: no layer {key!r} in the reference; `analyze inspect {ref.path}` lists them")
    return row


def range_inputs(layers, first: int, last: int, key: str, path: Path) -> list[str]:
    """What the layers first..last (execution order) read from outside the range: a sub-graph such as the
    convolution ggml builds on an IM2COL (IM2COL, reshapes, MUL_MAT, ...) isolated as one piece."""
    if last < first:
        raise InputError(f"{path}: --layer {key}: the range's last layer runs before its first; name it FIRST..LAST "
                         "in execution order")
    inside = layers[(layers["order"] >= first) & (layers["order"] <= last)]
    made = set(inside["name"])
    needed = [name for inputs in inside["inputs"] for name in _names(inputs, f"{path}: /layers inputs") if name not in made]
    return list(dict.fromkeys(needed))


def _names(cell: str, where: str) -> list[str]:
    """An inputs cell of the reference's /layers table: a JSON list of tensor names (one line when not)."""
    value = load_json(cell, where)
    if not isinstance(value, list):
        raise DumpFormatError(f"{where}: not a JSON list of tensor names")
    return [str(name) for name in value]


def _through_rasters(names: list[str], by_name: dict) -> list[str]:
    resolved: list[str] = []
    for name in names:
        producer = by_name.get(name)
        if producer is not None and producer.op_type == "Raster":
            resolved.extend(_through_rasters(_names(producer.inputs, f"/layers {producer.key} inputs"), by_name))
        elif name not in resolved:
            resolved.append(name)
    return resolved


def write_inject_dump(ref: DumpFile, targets: dict[str, list[str]], out_dir: Path, *,
                      weights_in_model: bool = False) -> Path:
    """A raw dump holding only the reference tensors the targets consume, plus the target map.

    `weights_in_model` (ggml): a target's edges also name the weights it reads, which are in the model,
    not in the reference; names the reference has neither as a layer nor as an input are left to the
    harness (it refuses, naming the input, if one of them was not a weight after all)."""
    needed = list(dict.fromkeys(name for names in targets.values() for name in names))
    layers = ref.layers.set_index("name", drop=False)
    model_inputs = dict(ref.inputs())
    writer = RawDumpWriter(out_dir, {"engine": ref.attrs.get("engine", ""), "harness": "layerdiff-inject",
                                     "targets": targets, "reference": ref.path.name}, summary=False)
    for name in needed:
        if name in layers.index:
            row = layers.loc[name]
            array, op, op_type = ref.tensor(int(row["order"])), row["op"], row["op_type"]
        elif name in model_inputs:
            array, op, op_type = model_inputs[name], name, "Input"
        elif weights_in_model:
            continue
        else:
            raise InputError(f"{ref.path}: the reference has no tensor {name!r} that a target consumes")
        writer.add(op=op, op_type=op_type, array=array, name=name)
    writer.close(infer_ms=0.0)
    return out_dir


def isolate(device: Device, model: ModelFiles, backend: str, precision: str, ref_path: Path, keys: list[str],
            out_dir: Path, *, force: bool = False, deadline_s: float = 900.0, threads: int = 1) -> RunOutcome:
    """Run `keys` in isolation on `device`; writes `isolated_<engine>_<backend>_<precision>_<ref>.h5`."""
    check_run_options(threads, 1, deadline_s, None, None)
    if not keys:
        raise UsageError("no layer to isolate; pass --layer KEY (or --failing-from REPORT_DIR)")
    rebuilds = ENGINES[model.engine].isolate_rebuilds_graph
    if not rebuilds and any(RANGE in key for key in keys):
        able = ", ".join(name for name, engine in ENGINES.items() if engine.isolate_rebuilds_graph) or "none"
        raise UsageError(f"--layer FIRST..LAST (a sub-graph) needs an engine that rebuilds graphs ({able}), not "
                         f"{model.engine}; name the layers one by one")
    with DumpFile(ref_path) as ref:
        if ref.attrs.get("model_sha256") and ref.attrs["model_sha256"] != model.sha256:
            raise InputError(f"{ref_path} was made with another model than {model.name}; isolate against its own reference")
        targets = target_inputs(ref, keys)
        arrays = dict(ref.inputs()) if rebuilds else {}  # the graph is rebuilt on the reference's own input
        if rebuilds and not arrays:
            raise InputError(f"{ref_path}: the reference keeps no model input, and {model.engine} rebuilds the graph "
                             "on it; isolate against a dump that `collect` made")
        with tempfile.TemporaryDirectory(prefix="layerdiff-inject-") as tmp:
            inject = write_inject_dump(ref, targets, Path(tmp) / "inject", weights_in_model=rebuilds)
            spec = RunSpec(
                model, backend, precision, InputSet(Path(ref_path).stem, arrays, str(ref_path)), threads=threads,
                deadline_s=deadline_s, prefix=ISOLATE_PREFIX,
                extra_args=["--inject", "{run_dir}/inject"] + [a for key in targets for a in ("--target", key)],
                placed_files={f"inject/{f.name}": f for f in sorted(inject.iterdir())},
                extra_attrs={"mode": "isolate", "isolated_from": Path(ref_path).name,
                             "reference_sha256": sha256_file(ref_path),
                             "provenance": {"targets": targets, "reference_path": str(ref_path)}},
            )
            with OutdirLock(out_dir):
                return collect_run(device, spec, out_dir, force=force)


def isolatable(ref_path: Path, keys: list[str], refused: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(kept, left out): `keys` without the layers whose op type in the reference the engine cannot run alone
    (`Engine.not_isolatable`); left out as 'key (OP_TYPE)' for the one line that says so."""
    if not refused:
        return keys, []
    with DumpFile(ref_path) as ref:
        types = dict(zip(ref.layers["key"], ref.layers["op_type"]))
    dropped = [f"{key} ({types[key]})" for key in keys if types.get(key) in refused]
    return [key for key in keys if types.get(key) not in refused], dropped


def failing_layers(report_dir: Path, backend: str, precision: str) -> list[str]:
    """Layers the analyzer's report (`results.json`) flagged in runs of this backend and precision."""
    path = Path(report_dir) / "results.json"
    try:
        results = load_json(path.read_text(), f"{path}: the analyzer's results", InputError)
    except OSError as err:
        raise InputError(f"{path}: cannot read the analyzer's results ({err}); run `analyze ... -o {report_dir}` first") from None
    keys: list[str] = []
    for run in results.get("runs", []):
        prov = run.get("provenance", run)
        if prov.get("backend_requested", backend) != backend or prov.get("precision_requested", precision) != precision:
            continue
        for finding in run.get("findings", []):
            if finding.get("kind") in ("failure_source", "nan_origin", "inf_origin", "saturation", "zero_collapse_origin", "first_divergence"):
                if finding.get("layer") and finding["layer"] not in keys:
                    keys.append(finding["layer"])
    if not keys:
        raise NothingToCompareError(f"{path}: no failing layer found for {backend}/{precision}; name layers with --layer")
    return keys
