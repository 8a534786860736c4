"""A ggml node as a repro bundle whose runner is a C++ program of its own (`repro.cpp` against ggml's headers).

A ggml graph exists only in code, so there is no model file to cut: the bundle describes the node (op, parameters,
each source's ggml `ne` and type per configuration) in `model/graph.json` and writes a program that rebuilds it.
The rest of the bundle (tensors, repro.json, fingerprint, zip) is written as for every engine (bundle.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.repro.bundle import (Bundle, Piece, _fmt, _safe, _write_tensor, _write_partial, fingerprint,
                                              measure_error)
from layerdiff.collector.repro.ggml_node import CMAKE_LISTS as GGML_CMAKE, cpp_source as ggml_cpp, graph_document, read_node


def write_program_bundle(model: ModelFiles, ref: DumpFile, run: DumpFile, layer: str, out_dir: Path) -> Bundle:
    """The node `layer` of `model` as a bundle in `out_dir` (one node; its program computes on ggml's CPU backend)."""
    node = read_node(model, ref, run, layer)
    return _write_partial(node.name, out_dir, lambda partial: _fill(node, ref, run, partial))


def _config(dump: DumpFile) -> dict:
    """Backend, precision and threads of a run; ggml's choices are the node's types (model/graph.json)."""
    attrs = dump.attrs
    return {"backend": str(attrs.get("backend_requested", "cpu")), "precision": str(attrs.get("precision_requested", "high")),
            "threads": int(attrs.get("threads", 1) or 1), "options": {}, "options_recorded": False,
            "source": dump.path.name}


def _fill(node, ref: DumpFile, run: DumpFile, out_dir: Path) -> dict:
    """A ggml bundle: the node's sources, reference and failing outputs, graph.json, repro.cpp and its CMake."""
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
    configs = {"run": _config(run), "reference": _config(ref)}
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
    (out_dir / "README.md").write_text(ggml_readme(spec))
    return recorded



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


