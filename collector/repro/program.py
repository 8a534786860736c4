"""A node as a repro bundle whose runner is a C++ program of its own, for an engine whose graphs exist only in code.

There is no model file to cut: the engine's folder (its ProgramRecipe, collector/engines/reprorecipe.py) reads the
node, describes it (op, parameters, each source's shape and type per configuration) in `model/graph.json` and writes
the program that rebuilds it. The rest of the bundle (tensors, repro.json, fingerprint, zip) is written here as for
every engine (bundle.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.collector.inputs.modelfiles import ModelFiles
from layerdiff.collector.engines.reprorecipe import ProgramRecipe
from layerdiff.collector.repro.bundle import Bundle, _safe, _write_tensor, _write_partial, fingerprint, measure_error


def write_program_bundle(model: ModelFiles, recipe: ProgramRecipe, ref: DumpFile, run: DumpFile, layer: str,
                         out_dir: Path) -> Bundle:
    """The node `layer` of `model` as a bundle in `out_dir` (one node)."""
    node = recipe.read_node(model, ref, run, layer)
    return _write_partial(node.name, out_dir, lambda partial: _fill(model.engine, recipe, node, ref, run, partial))


def _config(dump: DumpFile) -> dict:
    """Backend, precision and threads of a run; the engine's choices are the node's types (model/graph.json)."""
    attrs = dump.attrs
    return {"backend": str(attrs.get("backend_requested", "cpu")), "precision": str(attrs.get("precision_requested", "high")),
            "threads": int(attrs.get("threads", 1) or 1), "options": {}, "options_recorded": False,
            "source": dump.path.name}


def _fill(engine: str, recipe: ProgramRecipe, node, ref: DumpFile, run: DumpFile, out_dir: Path) -> dict:
    """The node's sources, reference and failing outputs, graph.json, and the program's files."""
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
    graph = recipe.describe(node, bins, configs)
    spec = {"format": "layerdiff-repro", "format_version": 1, "engine": engine, "layer": node.name,
            "layers": [node.name], "model": {"graph": "model/graph.json"}, "inputs": inputs, "outputs": outputs,
            "configs": configs, "fingerprint": {"run": fingerprint(run), "reference": fingerprint(ref)}}
    (out_dir / "model" / "graph.json").write_text(json.dumps(graph, indent=2))
    (out_dir / "repro.json").write_text(json.dumps(spec, indent=2))
    (out_dir / "tensors.json").write_text(json.dumps(table, indent=2))
    (out_dir / "fingerprint.json").write_text(json.dumps(spec["fingerprint"], indent=2))
    for name, text in recipe.program(graph, outputs[0]["reference_npy"][:-4] + ".bin", recorded).items():
        (out_dir / name).write_text(text)
    (out_dir / "README.md").write_text(recipe.readme(spec))
    return recorded
