"""`collect repro`: one failing layer packed as a bundle an engine maintainer runs without layerdiff.

The bundle holds the layer (or a run of layers) cut out as a model in the engine's own format (ncnn
`.param`/`.bin`, MNN `.mnn`, LiteRT `.tflite`, ONNX `.onnx`), the reference's tensors it reads and
writes, the failing run's output and its measured error, a runner that needs only the engine's wheel
and numpy (for ncnn also a C++ file against ncnn's headers), the device and driver fingerprint, and a
README to paste into an upstream issue. It is written as a directory and a `.zip`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.engines import ENGINES
from layerdiff.collector.engines.reprorecipe import ReproRecipe
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.repro.runner import measure
from layerdiff.errors import InputError, NothingToCompareError, StorageError, UsageError

RANGE = ".."
RUNNER = Path(__file__).with_name("runner.py")
ENGINE_RUNNER = "engine_runner.py"  # the engine's half of the runner, beside run_repro.py in the bundle
BULKY_OPTIONS = ("placement", "run_to_run", "per_op")  # per-op records: in the run's HDF5, not in a pasted fingerprint
FINGERPRINT_FIELDS = ("device_model", "device_serial", "soc", "board", "abi", "android_release", "gpu", "engine",
                      "engine_version", "backend_requested", "backend_actual", "precision_requested",
                      "precision_effective", "threads", "harness", "model_name", "model_sha256")


@dataclass(frozen=True)
class Bundle:
    """What `write_bundle` wrote: the directory, its zip, and the layer(s) it holds."""

    directory: Path
    archive: Path
    layer: str
    recorded_error: dict


@dataclass(frozen=True)
class Piece:
    """The cut model as the bundle stores it: its files, how repro.json names them, the tensors it reads and writes."""

    engine: str
    files: dict[str, bytes]
    model: dict[str, str]
    inputs: list[str]
    outputs: list[str]
    layers: list[str]


def write_bundle(model: ModelFiles, run_path: Path, ref_path: Path, layer: str, out_dir: Path) -> Bundle:
    """Cut `layer` (a key, or FIRST..LAST in file order where the engine cuts runs of layers) out of `model` and write
    the bundle to `out_dir`."""
    hook = ENGINES[model.engine].repro_program
    program = hook() if hook is not None else None
    recipe = None if program is not None else recipe_for(model)
    if RANGE in layer and (program or recipe).one_op:
        raise UsageError(f"--layer {layer}: {(program or recipe).one_op}")
    with DumpFile(ref_path) as ref, DumpFile(run_path) as run:
        for dump in (ref, run):
            recorded = dump.attrs.get("model_sha256")
            if recorded and recorded != model.sha256:
                raise InputError(f"{dump.path} was made with another model than {model.name}; bundle against its own runs")
        if program is not None:
            from layerdiff.collector.repro.program import write_program_bundle

            return write_program_bundle(model, program, ref, run, layer, Path(out_dir))
        sides = layer.split(RANGE, 1) if RANGE in layer else (layer, layer)
        first, last = (_row(ref, side)[recipe.cuts_by] for side in sides)
        with tempfile.TemporaryDirectory(prefix="layerdiff-repro-") as scratch:
            cut = recipe.cut(list(model.files), str(first), str(last), _blob_shapes(ref), Path(scratch))
        piece = Piece(model.engine, cut.files, cut.model, cut.inputs, cut.outputs, cut.layers)
        name = piece.layers[0] if len(piece.layers) == 1 else f"{piece.layers[0]}{RANGE}{piece.layers[-1]}"
        return _write(piece, recipe, ref, run, name, Path(out_dir))


def recipe_for(model: ModelFiles) -> ReproRecipe:
    """The engine folder's repro recipe for `model`, or one line saying why its engine writes no bundle."""
    engine = ENGINES[model.engine]
    if engine.repro is None and engine.repro_program is None:
        if engine.repro_refusal:
            raise UsageError(f"{model.name}: {engine.repro_refusal}")
        able = ", ".join(name for name, other in ENGINES.items() if other.repro is not None or other.repro_program is not None)
        raise UsageError(f"{model.name}: `collect repro` writes bundles for {able} models only, not {model.engine}; "
                         "`collect isolate` re-runs its layers")
    return engine.repro()


def _row(ref: DumpFile, key: str):
    """The reference's row of the layer a key names (`block2/amplify`, `block2/amplify:0`)."""
    layers = ref.layers
    rows = layers[(layers["key"] == key) | (layers["key"] == f"{key}:0") | (layers["op"] == key)]
    if rows.empty:
        raise InputError(f"{ref.path}: no layer {key!r} in the reference; `analyze inspect {ref.path}` lists them")
    return rows.iloc[0]


def _blob_shapes(ref: DumpFile) -> dict[str, tuple[int, ...]]:
    shapes = {str(row.name): tuple(json.loads(row.shape) if isinstance(row.shape, str) else row.shape)
              for row in ref.layers.itertuples() if row.shape is not None}
    for name, array in ref.inputs():
        shapes.setdefault(name, tuple(array.shape))
    return shapes


def _blob_tensor(dump: DumpFile, blob: str) -> np.ndarray | None:
    layers = dump.layers
    rows = layers[layers["name"] == blob]
    if not rows.empty:
        return _stored(dump.tensor(int(rows.iloc[0]["order"])))
    return next((_stored(a) for name, a in dump.inputs() if name == blob), None)


def _stored(array) -> np.ndarray:
    """Float tensors as float32 (the bundle's float format), integer and boolean ones as they are."""
    array = np.asarray(array)
    return array if array.dtype.kind in "iub" else array.astype(np.float32)


SAFE_NAME_CHARS = 48  # LiteRT tensor names join every fused op's name: keep file names short, unique by a hash


def _safe(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "tensor"
    if len(safe) <= SAFE_NAME_CHARS:
        return safe
    return f"{safe[:SAFE_NAME_CHARS - 9]}_{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def measure_error(out: np.ndarray, ref: np.ndarray) -> dict:
    """The failing run's error at the layer, measured as the bundle's runner measures it (one definition)."""
    error = measure(out, ref)
    error.pop("bit_identical")
    return error


def config_of(dump: DumpFile, recipe: ReproRecipe) -> dict:
    """The backend, precision and threads the run used, and the options the engine's runner sets (as recorded, or
    as the engine's recipe derives them from the backend and precision)."""
    attrs, prov = dump.attrs, dump.provenance
    backend, precision = str(attrs.get("backend_requested", "cpu")), str(attrs.get("precision_requested", "high"))
    recorded = (prov.get("raw_header") or {}).get("options") or {}
    options, from_record = recipe.options(recorded, attrs, backend, precision)
    return {"backend": backend, "precision": precision, "threads": int(attrs.get("threads", 1) or 1),
            "options": options, "options_recorded": from_record, "source": dump.path.name}


def fingerprint(dump: DumpFile) -> dict:
    """Device, SoC, GPU, driver (if recorded), engine version, backend, precision and options of a run."""
    attrs, prov = dump.attrs, dump.provenance
    out = {field: attrs[field] for field in FINGERPRINT_FIELDS if field in attrs}
    device = prov.get("device") or {}
    out.update({f"device_{k}": v for k, v in device.items() if k in ("manufacturer", "sdk", "abis") and v})
    options = (prov.get("raw_header") or {}).get("options") or {}
    out["options"] = {k: v for k, v in options.items() if k not in BULKY_OPTIONS}
    adapter = (options.get("placement") or {}).get("adapter") if isinstance(options.get("placement"), dict) else None
    if adapter and not out.get("gpu"):
        out["gpu"] = adapter  # LiteRT's GPU accelerator names the adapter it selected
    drivers = {k: v for src in (prov, device, options, prov.get("raw_header") or {}) for k, v in src.items()
               if ("driver" in k.lower() or k == "vulkan_icd") and v}
    out["driver"] = drivers or "not recorded"
    return out


def _write_tensor(folder: Path, stem: str, array: np.ndarray, table: dict, role: str, blob: str) -> str:
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    np.save(folder / f"{stem}.npy", array)
    (folder / f"{stem}.bin").write_bytes(array.tobytes())
    table[f"tensors/{stem}.bin"] = {"role": role, "blob": blob, "shape": list(array.shape), "dtype": array.dtype.name,
                                    "byte_order": "little", "npy": f"tensors/{stem}.npy"}
    return f"tensors/{stem}.npy"


def _write(piece: Piece, recipe: ReproRecipe, ref: DumpFile, run: DumpFile, layer: str, out_dir: Path) -> Bundle:
    """The bundle of a cut model (the engine's recipe)."""
    return _write_partial(layer, out_dir, lambda partial: _fill(piece, recipe, ref, run, layer, partial))


def _write_partial(layer: str, out_dir: Path, fill) -> Bundle:
    """The bundle is built beside `out_dir` by `fill(partial)` and renamed into place: an interrupted write leaves no
    half bundle."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir()) and not (out_dir / "repro.json").is_file()):
        raise StorageError(f"{out_dir}: exists and is not a repro bundle; name a new directory with -o")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    recorded = fill(partial)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(partial, out_dir)
    archive = out_dir.with_name(out_dir.name + ".zip")
    tmp_archive = Path(shutil.make_archive(str(partial), "zip", root_dir=out_dir.parent, base_dir=out_dir.name))
    os.replace(tmp_archive, archive)
    return Bundle(out_dir, archive, layer, recorded)


def _fill(piece: Piece, recipe: ReproRecipe, ref: DumpFile, run: DumpFile, layer: str, out_dir: Path) -> dict:
    """Every file of the bundle into `out_dir`; returns the error recorded in the failing run."""
    tensors = out_dir / "tensors"
    (out_dir / "model").mkdir(parents=True, exist_ok=True)
    tensors.mkdir(exist_ok=True)
    for relative, data in piece.files.items():
        (out_dir / relative).write_bytes(data)
    table: dict[str, dict] = {}
    inputs = []
    for k, blob in enumerate(piece.inputs):
        array = _blob_tensor(ref, blob)
        if array is None:
            raise InputError(f"{ref.path}: the reference has no tensor {blob!r} that {layer!r} reads")
        inputs.append({"blob": blob, "shape": list(array.shape),
                       "npy": _write_tensor(tensors, f"input{k}_{_safe(blob)}", array, table, "input", blob)})
    outputs = []
    for k, blob in enumerate(piece.outputs):
        expected = _blob_tensor(ref, blob)
        if expected is None:
            raise InputError(f"{ref.path}: the reference has no output {blob!r} of {layer!r}")
        failed = _blob_tensor(run, blob)
        if failed is None:
            raise NothingToCompareError(f"{run.path}: the run has no tensor {blob!r}; it may have stopped before {layer!r}")
        stem = f"output{k}_{_safe(blob)}"
        outputs.append({"blob": blob, "shape": list(expected.shape), "npy_name": f"{stem}.npy",
                        "reference_npy": _write_tensor(tensors, f"reference_{stem}", expected, table, "reference output", blob),
                        "run_npy": _write_tensor(tensors, f"run_{stem}", failed, table, "failing run output", blob),
                        "recorded_error": measure_error(failed, expected)})
    engine = ENGINES[piece.engine]
    spec = {"format": "layerdiff-repro", "format_version": 1, "engine": piece.engine, "module": engine.library,
            "wheel": engine.distribution, "layer": layer, "layers": piece.layers, "model": piece.model,
            "inputs": inputs, "outputs": outputs,
            "configs": {"run": config_of(run, recipe), "reference": config_of(ref, recipe)},
            "fingerprint": {"run": fingerprint(run), "reference": fingerprint(ref)}}
    (out_dir / "repro.json").write_text(json.dumps(spec, indent=2))
    (out_dir / "tensors.json").write_text(json.dumps(table, indent=2))
    (out_dir / "fingerprint.json").write_text(json.dumps(spec["fingerprint"], indent=2))
    shutil.copyfile(RUNNER, out_dir / "run_repro.py")
    shutil.copyfile(recipe.runner, out_dir / ENGINE_RUNNER)
    for relative, text in recipe.extra_files(spec).items():
        (out_dir / relative).write_text(text)
    (out_dir / "README.md").write_text(readme(spec, recipe))
    return outputs[0]["recorded_error"]


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def readme(spec: dict, recipe: ReproRecipe) -> str:
    """The one-minute text for the maintainer, paste-able into an upstream issue."""
    title = recipe.title
    run, ref = spec["configs"]["run"], spec["configs"]["reference"]
    device = spec["fingerprint"]["run"]
    err = spec["outputs"][0]["recorded_error"]
    inputs = ", ".join(f"`{item['blob']}` {item['shape']}" for item in spec["inputs"])
    options = recipe.options_text(run)
    model_files = ", ".join(f"`{path}`" for path in spec["model"].values())
    return f"""# {title}: `{spec['layer']}` diverges on {run['backend']}/{run['precision']}

**What**: layer{'s' if len(spec['layers']) > 1 else ''} {', '.join(f'`{n}`' for n in spec['layers'])} fed with the
reference's own input tensor(s) ({inputs}) give a wrong output on **{run['backend']}** with precision
**{run['precision']}**; the same model on {ref['backend']}/{ref['precision']} is the reference.

**Measured in the failing run** (output `{spec['outputs'][0]['blob']}` against the reference): rel L2 {_fmt(err['rel_l2'])},
max abs {_fmt(err['max_abs'])}, NaN {err['nan']}, +Inf {err['pos_inf']}, -Inf {err['neg_inf']}
(of {int(np.prod(spec['outputs'][0]['shape']))} values).

**Target platform**: {device.get('device_model', '?')} ({device.get('device_manufacturer', '')} {device.get('soc', '')}),
ABI {device.get('abi', '?')}, Android {device.get('android_release') or 'n/a'}, GPU {device.get('gpu') or 'n/a'},
driver {device.get('driver')}; {title} {device.get('engine_version', '?')}; effective precision
{device.get('precision_effective', '?')}. Full fingerprint: `fingerprint.json`.

**Options of the failing run**: {options}

## Run it

```
{recipe.install or f"pip install {spec['wheel']}=={device.get('engine_version', '')} numpy"}
python run_repro.py          # both configurations: prints rel L2, max abs, NaN/Inf against the reference
```
{recipe.extra_readme}
## Files

- {model_files}: the layer(s) alone, an input per tensor they read
- `run_repro.py` with `engine_runner.py` (how the engine's wheel runs the cut model)
- `tensors/input*.npy|.bin`: the reference's inputs; `tensors/reference_output*`: the reference's output;
  `tensors/run_output*`: the failing run's output. `.bin` files are raw little-endian (float32 for float tensors),
  shapes and dtypes in `tensors.json`
- `repro.json`: the two configurations; `fingerprint.json`: device, GPU, driver, engine version
"""


def report_failure(report_dir: Path, backend: str | None = None, precision: str | None = None) -> tuple[Path, Path, str]:
    """(run file, reference file, layer) of the first failure source the analyzer's report names."""
    path = Path(report_dir) / "results.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read the analyzer's results ({err}); run `analyze ... -o {report_dir}` first") from None
    runs = results.get("runs") if isinstance(results, dict) else None
    if not isinstance(runs, list) or not all(isinstance(run, dict) for run in runs):
        raise InputError(f"{path}: not the analyzer's results (no list of runs); run `analyze ... -o {report_dir}` again")
    files = {run.get("run"): run.get("file") for run in runs}
    for run in runs:
        prov = run.get("provenance") if isinstance(run.get("provenance"), dict) else {}
        if backend and prov.get("backend_requested") != backend or precision and prov.get("precision_requested") != precision:
            continue
        findings = run.get("findings") if isinstance(run.get("findings"), list) else []
        source = next((f for f in findings if isinstance(f, dict) and f.get("kind") == "failure_source" and f.get("layer")), None)
        if source is None:
            continue
        reference = results.get("reference") if isinstance(results.get("reference"), dict) else {}
        ref_file = files.get(run.get("reference")) or reference.get("file")
        if not isinstance(run.get("file"), str) or not isinstance(ref_file, str):
            raise InputError(f"{path}: run {run.get('run')!r} names no run file or reference file; pass --run and --ref")
        return Path(run["file"]), Path(ref_file), str(source["layer"])
    raise NothingToCompareError(f"{path}: the report names no failure source"
                                f"{f' for {backend}/{precision}' if backend or precision else ''}; name one with --layer")
