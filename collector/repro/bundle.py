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
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.repro.ncnn_cut import cut
from layerdiff.collector.repro.runner import measure
from layerdiff.errors import InputError, NothingToCompareError, StorageError, UsageError
from layerdiff.collector.engines.ncnn.options import ncnn_precision_flags

RANGE = ".."
RUNNER = Path(__file__).with_name("runner.py")
CPP_TEMPLATE = Path(__file__).with_name("ncnn_repro.cpp.in")
MODEL_STEM = "repro"
CMAKE_LISTS = """cmake_minimum_required(VERSION 3.10)
project(ncnn_repro CXX)
# -Dncnn_DIR=<ncnn install or release>/lib/cmake/ncnn (Android release: <abi>/lib/cmake/ncnn)
find_package(ncnn REQUIRED)
add_executable(repro repro.cpp)
target_link_libraries(repro ncnn)
"""
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
    """Cut `layer` (a key; ncnn also FIRST..LAST in file order) out of `model` and write the bundle to `out_dir`."""
    if model.engine in REFUSED:
        raise UsageError(f"{model.name}: {REFUSED[model.engine]}")
    if model.engine not in ENGINE_TITLES:
        raise UsageError(f"{model.name}: `collect repro` writes bundles for {', '.join(ENGINE_TITLES.values())} models "
                         f"only, not {model.engine}; `collect isolate` re-runs its layers")
    if model.engine in ONE_OP and RANGE in layer:
        raise UsageError(f"--layer {layer}: {ONE_OP[model.engine]} bundle holds one op; name the ops one by one")
    with DumpFile(ref_path) as ref, DumpFile(run_path) as run:
        for dump in (ref, run):
            recorded = dump.attrs.get("model_sha256")
            if recorded and recorded != model.sha256:
                raise InputError(f"{dump.path} was made with another model than {model.name}; bundle against its own runs")
        if model.engine == "ggml":
            from layerdiff.collector.repro.ggml_node import read_node

            node = read_node(model, ref, run, layer)
            return _write(Piece("ggml", {}, {"graph": "model/graph.json"}, [], [node.name], [node.name]), ref, run,
                          node.name, Path(out_dir), lambda piece, r, f, name, folder: _fill_ggml(node, r, f, folder))
        sides = layer.split(RANGE, 1) if RANGE in layer else (layer, layer)
        column = "op" if model.engine == "ncnn" else "name"  # ncnn cuts layers; the others, ops by the tensor they write
        first, last = (_row(ref, side)[column] for side in sides)
        piece = PIECES[model.engine](model, str(first), str(last), _blob_shapes(ref))
        name = piece.layers[0] if len(piece.layers) == 1 else f"{piece.layers[0]}{RANGE}{piece.layers[-1]}"
        return _write(piece, ref, run, name, Path(out_dir))


def _ncnn_piece(model: ModelFiles, first: str, last: str, shapes: dict) -> Piece:
    param = next(f for f in model.files if f.suffix == ".param")
    weights = next((f for f in model.files if f.suffix == ".bin"), param.with_suffix(".bin"))
    cut_model = cut(param, weights, str(first), str(last), shapes)
    files = {f"model/{MODEL_STEM}.param": cut_model.param_text.encode(), f"model/{MODEL_STEM}.bin": cut_model.weights}
    return Piece("ncnn", files, {"param": f"model/{MODEL_STEM}.param", "bin": f"model/{MODEL_STEM}.bin"},
                 cut_model.inputs, cut_model.outputs, cut_model.layers)


def _mnn_piece(model: ModelFiles, tensor: str, _last: str, shapes: dict) -> Piece:
    from layerdiff.collector.repro.mnn_cut import cut as cut_mnn

    with tempfile.TemporaryDirectory(prefix="layerdiff-repro-") as scratch:
        cut_model = cut_mnn(model.files[0], str(tensor), shapes, Path(scratch))
    path = f"model/{MODEL_STEM}.mnn"
    return Piece("mnn", {path: cut_model.model}, {"mnn": path}, cut_model.inputs, cut_model.outputs, cut_model.layers)


def _litert_piece(model: ModelFiles, first: str, last: str, shapes: dict) -> Piece:
    from layerdiff.collector.repro.litert_cut import cut as cut_litert

    cut_model = cut_litert(model.files[0], first, last, shapes)
    path = f"model/{MODEL_STEM}.tflite"
    return Piece("litert", {path: cut_model.model}, {"tflite": path}, cut_model.inputs, cut_model.outputs, cut_model.layers)


def _onnx_piece(model: ModelFiles, first: str, last: str, shapes: dict) -> Piece:
    from layerdiff.collector.repro.onnx_cut import cut as cut_onnx

    cut_model = cut_onnx(model.files[0], first, last, shapes)
    path = f"model/{MODEL_STEM}.onnx"
    return Piece("onnxruntime", {path: cut_model.model}, {"onnx": path}, cut_model.inputs, cut_model.outputs,
                 cut_model.layers)


PIECES = {"ncnn": _ncnn_piece, "mnn": _mnn_piece, "litert": _litert_piece, "onnxruntime": _onnx_piece}
REFUSED = {
    "paddle": "the paddle engine runs Paddle's CPU executor in one configuration (fp32, no optimisation), so no Paddle "
              "run fails for a bundle to reproduce, and `collect repro` does not cut Paddle programs; against "
              "Paddle-Lite, Paddle is the reference (`collect isolate` re-runs Paddle-Lite's layers)",
    "paddle-lite": "a Paddle-Lite `.nb` is written only by Paddle-Lite's `opt` from a Paddle program, and no Python "
                   "package writes or edits one, so no op can be cut out of it; `collect isolate` re-runs its layers",
}


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


def config_of(dump: DumpFile, engine: str = "ncnn") -> dict:
    """The backend, precision, threads and ncnn Option flags the run used (as recorded, else as layerdiff sets them).

    MNN takes backend, precision and thread count as its session config; it has no option flags. LiteRT and ONNX
    Runtime keep the recorded options their runner reads (kernels, accelerator settings; providers, optimisation)."""
    attrs, prov = dump.attrs, dump.provenance
    backend, precision = str(attrs.get("backend_requested", "cpu")), str(attrs.get("precision_requested", "high"))
    if engine in RUNNER_OPTIONS:
        recorded = (prov.get("raw_header") or {}).get("options") or {}
        options = {k: recorded[k] for k in RUNNER_OPTIONS[engine] if k in recorded}
        return {"backend": backend, "precision": precision, "threads": int(attrs.get("threads", 1) or 1),
                "options": options, "options_recorded": bool(options), "source": dump.path.name}
    if engine in ("mnn", "ggml"):  # a session config (MNN); ggml's choices are the node's types (model/graph.json)
        return {"backend": backend, "precision": precision, "threads": int(attrs.get("threads", 1) or 1),
                "options": {}, "options_recorded": False, "source": dump.path.name}
    recorded = (prov.get("raw_header") or {}).get("options") or {}
    options = {k: bool(v) for k, v in recorded.items() if k.startswith("use_")}
    if not options:
        fp16 = backend == "vulkan" or str(attrs.get("abi", "")).startswith("arm64")
        options = {"use_vulkan_compute": backend == "vulkan", **ncnn_precision_flags(precision, fp16=fp16)}
    return {"backend": backend, "precision": precision, "threads": int(attrs.get("threads", 1) or 1),
            "options": options, "options_recorded": bool(recorded), "source": dump.path.name}


RUNNER_OPTIONS = {"litert": ("kernels", "accelerator", "vulkan_icd", "enforce_f32", "precision_why"),
                  "onnxruntime": ("providers", "graph_optimization_level")}


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


def _write(piece: Piece, ref: DumpFile, run: DumpFile, layer: str, out_dir: Path, fill=None) -> Bundle:
    """The bundle is built beside `out_dir` and renamed into place: an interrupted write leaves no half bundle."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir()) and not (out_dir / "repro.json").is_file()):
        raise StorageError(f"{out_dir}: exists and is not a repro bundle; name a new directory with -o")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    recorded = (fill or _fill)(piece, ref, run, layer, partial)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(partial, out_dir)
    archive = out_dir.with_name(out_dir.name + ".zip")
    tmp_archive = Path(shutil.make_archive(str(partial), "zip", root_dir=out_dir.parent, base_dir=out_dir.name))
    os.replace(tmp_archive, archive)
    return Bundle(out_dir, archive, layer, recorded)


def _fill(piece: Piece, ref: DumpFile, run: DumpFile, layer: str, out_dir: Path) -> dict:
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
    spec = {"format": "layerdiff-repro", "format_version": 1, "engine": piece.engine, "layer": layer,
            "layers": piece.layers, "model": piece.model, "inputs": inputs, "outputs": outputs,
            "configs": {"run": config_of(run, piece.engine), "reference": config_of(ref, piece.engine)},
            "fingerprint": {"run": fingerprint(run), "reference": fingerprint(ref)}}
    (out_dir / "repro.json").write_text(json.dumps(spec, indent=2))
    (out_dir / "tensors.json").write_text(json.dumps(table, indent=2))
    (out_dir / "fingerprint.json").write_text(json.dumps(spec["fingerprint"], indent=2))
    shutil.copyfile(RUNNER, out_dir / "run_repro.py")
    if piece.engine == "ncnn":
        (out_dir / "repro.cpp").write_text(cpp_source(spec))
        (out_dir / "CMakeLists.txt").write_text(CMAKE_LISTS)
    (out_dir / "README.md").write_text(readme(spec))
    return outputs[0]["recorded_error"]


def _fill_ggml(node, ref: DumpFile, run: DumpFile, out_dir: Path) -> dict:
    """A ggml bundle: the node's sources, reference and failing outputs, graph.json, repro.cpp and its CMake."""
    from layerdiff.collector.repro.ggml_node import CMAKE_LISTS as GGML_CMAKE, cpp_source as ggml_cpp, graph_document

    tensors = out_dir / "tensors"
    (out_dir / "model").mkdir(parents=True, exist_ok=True)
    tensors.mkdir(exist_ok=True)
    table: dict[str, dict] = {}
    inputs, bins = [], {}
    for k, source in enumerate(node.sources):
        npy = _write_tensor(tensors, f"input{k}_{_safe(source.name)}", source.values, table, "input", source.name)
        bins[source.name] = npy[:-4] + ".bin"
        inputs.append({"blob": source.name, "shape": list(source.values.shape), "npy": npy, "origin": source.origin})
    stem = f"output0_{_safe(node.name)}"
    recorded = measure_error(node.failing, node.reference)
    outputs = [{"blob": node.name, "shape": list(node.reference.shape), "npy_name": f"{stem}.npy",
                "reference_npy": _write_tensor(tensors, f"reference_{stem}", node.reference, table, "reference output", node.name),
                "run_npy": _write_tensor(tensors, f"run_{stem}", node.failing, table, "failing run output", node.name),
                "recorded_error": recorded}]
    configs = {"run": config_of(run, "ggml"), "reference": config_of(ref, "ggml")}
    graph = graph_document(node, bins, configs)
    spec = {"format": "layerdiff-repro", "format_version": 1, "engine": "ggml", "layer": node.name,
            "layers": [node.name], "model": {"graph": "model/graph.json"}, "inputs": inputs, "outputs": outputs,
            "configs": configs, "fingerprint": {"run": fingerprint(run), "reference": fingerprint(ref)}}
    (out_dir / "model" / "graph.json").write_text(json.dumps(graph, indent=2))
    (out_dir / "repro.json").write_text(json.dumps(spec, indent=2))
    (out_dir / "tensors.json").write_text(json.dumps(table, indent=2))
    (out_dir / "fingerprint.json").write_text(json.dumps(spec["fingerprint"], indent=2))
    (out_dir / "repro.cpp").write_text(ggml_cpp(graph, outputs[0]["reference_npy"][:-4] + ".bin", recorded))
    (out_dir / "CMakeLists.txt").write_text(GGML_CMAKE)
    (out_dir / "README.md").write_text(readme(spec))
    return recorded


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


ENGINE_TITLES = {"ncnn": "ncnn", "mnn": "MNN", "litert": "LiteRT", "onnxruntime": "ONNX Runtime", "ggml": "ggml"}
ENGINE_WHEELS = {"ncnn": "ncnn", "mnn": "MNN", "litert": "ai-edge-litert", "onnxruntime": "onnxruntime"}
ONE_OP = {"mnn": "an MNN", "ggml": "a ggml"}


def readme(spec: dict) -> str:
    """The one-minute text for the maintainer, paste-able into an upstream issue."""
    engine = spec["engine"]
    run, ref = spec["configs"]["run"], spec["configs"]["reference"]
    device = spec["fingerprint"]["run"]
    err = spec["outputs"][0]["recorded_error"]
    inputs = ", ".join(f"`{item['blob']}` {item['shape']}" for item in spec["inputs"])
    if engine == "ggml":
        return ggml_readme(spec)
    if engine == "ncnn":
        flags = ", ".join(f"{k}={int(v)}" for k, v in sorted(run["options"].items()))
        options = f"num_threads={run['threads']}, lightmode=1, {flags}"
    elif engine == "mnn":
        options = f"session config backend={run['backend'].upper()}, precision={run['precision']}, numThread={run['threads']}"
    else:
        options = ", ".join([f"backend={run['backend']}", f"threads={run['threads']}",
                             *(f"{k}={v}" for k, v in sorted(run["options"].items()))])
    model_files = ", ".join(f"`{path}`" for path in spec["model"].values())
    return f"""# {ENGINE_TITLES[engine]}: `{spec['layer']}` diverges on {run['backend']}/{run['precision']}

**What**: layer{'s' if len(spec['layers']) > 1 else ''} {', '.join(f'`{n}`' for n in spec['layers'])} fed with the
reference's own input tensor(s) ({inputs}) give a wrong output on **{run['backend']}** with precision
**{run['precision']}**; the same model on {ref['backend']}/{ref['precision']} is the reference.

**Measured in the failing run** (output `{spec['outputs'][0]['blob']}` against the reference): rel L2 {_fmt(err['rel_l2'])},
max abs {_fmt(err['max_abs'])}, NaN {err['nan']}, +Inf {err['pos_inf']}, -Inf {err['neg_inf']}
(of {int(np.prod(spec['outputs'][0]['shape']))} values).

**Target platform**: {device.get('device_model', '?')} ({device.get('device_manufacturer', '')} {device.get('soc', '')}),
ABI {device.get('abi', '?')}, Android {device.get('android_release') or 'n/a'}, GPU {device.get('gpu') or 'n/a'},
driver {device.get('driver')}; {ENGINE_TITLES[engine]} {device.get('engine_version', '?')}; effective precision
{device.get('precision_effective', '?')}. Full fingerprint: `fingerprint.json`.

**Options of the failing run**: {options}

## Run it

```
pip install {ENGINE_WHEELS[engine]}=={device.get('engine_version', '')} numpy
python run_repro.py          # both configurations: prints rel L2, max abs, NaN/Inf against the reference
```
{CPP_README if engine == "ncnn" else ""}
## Files

- {model_files}: the layer(s) alone, an input per tensor they read
- `tensors/input*.npy|.bin`: the reference's inputs; `tensors/reference_output*`: the reference's output;
  `tensors/run_output*`: the failing run's output. `.bin` files are raw little-endian (float32 for float tensors),
  shapes and dtypes in `tensors.json`
- `repro.json`: the two configurations; `fingerprint.json`: device, GPU, driver, engine version
"""


def ggml_readme(spec: dict) -> str:
    """The ggml bundle's README: the node, the types each configuration built it with, how to build and run it."""
    run, ref = spec["configs"]["run"], spec["configs"]["reference"]
    device = spec["fingerprint"]["run"]
    err = spec["outputs"][0]["recorded_error"]
    graph_types = ", ".join(f"`{item['blob']}` {item['shape']} ({item['origin']})" for item in spec["inputs"])
    return f"""# ggml: node `{spec['layer']}` diverges on {run['backend']}/{run['precision']}

**What**: the node `{spec['layer']}` fed with the reference's own source tensors ({graph_types}) gives a wrong
output as built on **{run['backend']}** with precision **{run['precision']}**; the same graph on
{ref['backend']}/{ref['precision']} is the reference. The op, its parameters and each source's type per
configuration are in `model/graph.json` (and written into `repro.cpp`).

**Measured in the failing run** (output `{spec['outputs'][0]['blob']}` against the reference): rel L2 {_fmt(err['rel_l2'])},
max abs {_fmt(err['max_abs'])}, NaN {err['nan']}, +Inf {err['pos_inf']}, -Inf {err['neg_inf']}
(of {int(np.prod(spec['outputs'][0]['shape']))} values).

**Target platform**: {device.get('device_model', '?')} ({device.get('device_manufacturer', '')} {device.get('soc', '')}),
ABI {device.get('abi', '?')}, Android {device.get('android_release') or 'n/a'}, GPU {device.get('gpu') or 'n/a'},
driver {device.get('driver')}; {device.get('engine_version', '?')}; effective precision
{device.get('precision_effective', '?')}. Full fingerprint: `fingerprint.json`.

## Run it

`repro.cpp` needs only ggml: build it against a ggml source tree (llama.cpp's `ggml/` folder or the ggml
repository, at the version above or the one to test):

```
cmake -S . -B build -DGGML_DIR=<llama.cpp>/ggml && cmake --build build --target repro -j
./build/repro                # from inside this folder: both configurations against the reference output
./build/repro run --json
```

It prints, per configuration, rel L2, max abs, NaN/Inf counts and whether the output is bit-identical to the
reference; for the failing configuration `REPRODUCES` when the failure is there again. It computes on ggml's
CPU backend.

## Files

- `model/graph.json`: the node (op, parameters, sources with ggml `ne` and type per configuration)
- `tensors/input*.npy|.bin`: the reference's source tensors; `tensors/reference_output*`: the reference's output;
  `tensors/run_output*`: the failing run's output. `.bin` files are raw little-endian float32, shapes in `tensors.json`
- `repro.json`: the two configurations; `fingerprint.json`: device, GPU, driver, engine version
"""


CPP_README = """
## C++ (phones)

`repro.cpp` does the same against ncnn's C++ API, with the options written in:

```
cmake -S . -B build -Dncnn_DIR=<ncnn>/lib/cmake/ncnn && cmake --build build
./build/repro run && ./build/repro reference
```

For a phone add `-DCMAKE_TOOLCHAIN_FILE=$ANDROID_NDK/build/cmake/android.toolchain.cmake -DANDROID_ABI=arm64-v8a
-DANDROID_PLATFORM=android-24` with ncnn's Android release as `ncnn_DIR`, `adb push` this folder and the binary,
and run it from inside the folder.
"""


def cpp_source(spec: dict) -> str:
    """`repro.cpp`: the runner against ncnn's C++ API, the bundle's names, shapes and options written in."""
    def options(config: dict) -> str:
        lines = [f"        opt.num_threads = {config['threads']};", "        opt.lightmode = true;"]
        lines += [f"        opt.{flag} = {'true' if value else 'false'};" for flag, value in sorted(config["options"].items())
                  if flag in CPP_OPTION_FIELDS]
        return "\n".join(lines)

    def c_string(text: str) -> str:
        return json.dumps(text)

    feeds = "\n".join(f"    feed(ex, {c_string(item['blob'])}, {c_string(item['npy'][:-4] + '.bin')}, "
                      f"{{{', '.join(str(d) for d in _ncnn_dims(item['shape']))}}});" for item in spec["inputs"])
    checks = "\n".join(f"    check(ex, {c_string(item['blob'])}, {c_string(item['reference_npy'][:-4] + '.bin')});"
                       for item in spec["outputs"])
    text = CPP_TEMPLATE.read_text()
    return (text.replace("@RUN_OPTIONS@", options(spec["configs"]["run"]))
            .replace("@REFERENCE_OPTIONS@", options(spec["configs"]["reference"]))
            .replace("@FEEDS@", feeds).replace("@CHECKS@", checks)
            .replace("@LAYER@", spec["layer"].replace("*/", "* /")))


# ncnn::Option fields the C++ file may set (src/option.h of ncnn 1.0.20261020); others stay ncnn's defaults.
CPP_OPTION_FIELDS = frozenset("""use_winograd_convolution use_sgemm_convolution use_int8_inference use_vulkan_compute
use_bf16_storage use_fp16_packed use_fp16_storage use_fp16_arithmetic use_int8_packed use_int8_storage
use_int8_arithmetic use_packing_layout use_subgroup_ops use_tensor_storage use_winograd23_convolution
use_winograd43_convolution use_winograd63_convolution use_bf16_packed use_fp16_uniform""".split())


def _ncnn_dims(shape: list[int]) -> list[int]:
    """w, h, [d,] c as ncnn::Mat's constructor takes them, from the recorded NCHW shape."""
    dims = shape[1:] if len(shape) in (2, 4, 5) and shape[0] == 1 else shape
    return list(reversed(dims))


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
