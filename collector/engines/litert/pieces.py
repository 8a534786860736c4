"""LiteRT's part of `collect bisect` (its BisectRecipe, `recipe()`): which operators the GPU accelerator is given, as culprit_finder moves
the GPU delegate's node range, done with the `ai-edge-litert` wheel's public API.

The wheel's GPU options have no delegated node range and no per-op placement, so the range is made
by cutting: a trial splits the model's operators, in execution order, into consecutive pieces, each
piece its own `.tflite` (collector/engines/litert/cut.py: the operators as the file has them, with the
weight decoding they read). A piece of moved operators is compiled for the failing configuration
(the GPU accelerator with CPU fallback, as layerdiff's GPU runs); a piece of kept operators runs the
reference configuration (the CPU interpreter, or the accelerator with fp32 enforced). The pieces run
one after the other, each fed the tensors earlier pieces (or the model inputs) computed, and only the
model's outputs are compared with the reference run. Nothing else is read: the tensors handed between
pieces are the graph's own edges, as the accelerator hands them to its CPU fallback when it splits
a graph itself.

Runs happen in the `collect` process on the `local` device (the wheel is the engine).
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from layerdiff.collector.engines.bisectrecipe import BisectLayer, BisectRecipe
from layerdiff.collector.engines.litert.graph import Graph, load_graph
from layerdiff.collector.engines.litert.cut import cut_graph
from layerdiff.errors import DeviceError, InputError


def operator_layers(model) -> list[BisectLayer]:
    """Every computing operator by the name of the tensor it writes, in execution order."""
    graph = load_graph(Path(model.files[0]).read_bytes(), str(model.files[0]))
    return [BisectLayer(name, "", (), (name,))
            for name in (graph.name(op.outputs[0]) for op in graph.computing_ops() if op.outputs)]


def recipe() -> BisectRecipe:
    return BisectRecipe(
        "delegated-range", "the model is cut into consecutive pieces of operators (.tflite files of their own); moved "
        "pieces run the failing configuration (the GPU accelerator), kept pieces the reference, fed each other's graph "
        "edges", operator_layers, in_process=PieceRunner)


@dataclass
class PieceRunner:
    """Runs trials: per input, the model as pieces, moved ones on (backend, precision), kept ones on the reference."""

    model: object  # the model's files (`.files`)
    failing: tuple[str, str]
    reference: tuple[str, str]
    inputs: list  # input sets (`.label`, `.arrays`)
    threads: int = 1
    runs: int = 0
    trials: int = 0
    references: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data = Path(self.model.files[0]).read_bytes()
        self.graph: Graph = load_graph(self.data, str(self.model.files[0]))
        self.ops = [op for op in self.graph.computing_ops() if op.outputs]
        self.names = [self.graph.name(op.outputs[0]) for op in self.ops]
        self.output_names = [self.graph.name(t) for t in self.graph.outputs]
        _select_vulkan_driver(self.failing, self.reference)
        for item in self.inputs:
            self.references[item.label] = self._run_pieces(item, [(self.reference, 0, len(self.ops) - 1)])

    def run(self, kept: tuple[str, ...]) -> tuple[dict[str, float], dict[str, str]]:
        """One plain run per input with `kept` operators on the reference configuration, the rest moved: the worst
        output error per input label, and why a run failed per input label."""
        self.trials += 1
        errors: dict[str, float] = {}
        failures: dict[str, str] = {}
        pieces = self._pieces(set(kept))
        for item in self.inputs:
            self.runs += 1
            try:
                outputs = self._run_pieces(item, pieces)
            except (RuntimeError, ValueError) as err:  # a piece the accelerator refuses is a set that does not work
                errors[item.label] = math.inf
                failures[item.label] = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                continue
            errors[item.label] = worst_error(outputs, self.references[item.label])
        return errors, failures

    def _pieces(self, kept: set[str]) -> list[tuple[tuple[str, str], int, int]]:
        """Consecutive operators with the same configuration, as (configuration, first index, last index)."""
        pieces: list[tuple[tuple[str, str], int, int]] = []
        for k, name in enumerate(self.names):
            config = self.reference if name in kept else self.failing
            if pieces and pieces[-1][0] == config:
                pieces[-1] = (config, pieces[-1][1], k)
            else:
                pieces.append((config, k, k))
        return pieces

    def _run_pieces(self, item, pieces) -> dict[str, np.ndarray]:
        values = {name: np.asarray(array) for name, array in item.arrays.items()}
        missing = [self.graph.name(t) for t in self.graph.inputs if self.graph.name(t) not in values]
        if missing:
            raise InputError(f"input {item.label}: no array for model input(s) {', '.join(missing)}")
        for config, first, last in pieces:
            later = {t for op in self.ops[last + 1:] for t in op.inputs} | set(self.graph.outputs)
            produced = [t for op in self.ops[first:last + 1] for t in op.outputs if t not in self.graph.weights]
            wanted = [self.graph.name(t) for t in produced if t in later]
            if not wanted:
                continue
            piece = cut_graph(self.data, self.graph, self.names[first], self.names[last], {}, wanted,
                              Path(self.model.files[0]))
            values.update(run_piece(piece.model, config, {n: values[n] for n in piece.inputs}, self.threads))
        return {name: values[name] for name in self.output_names}


def run_piece(model: bytes, config: tuple[str, str], feeds: dict[str, np.ndarray], threads: int) -> dict[str, np.ndarray]:
    """One piece on one configuration; its outputs by tensor name."""
    backend, precision = config
    if backend == "gpu":
        return _run_gpu(model, precision, feeds, threads)
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if precision == "high" else OpResolverType.BUILTIN
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interpreter = Interpreter(model_content=model, num_threads=threads, experimental_op_resolver_type=resolver)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], np.asarray(feeds[detail["name"]], dtype=detail["dtype"]))
    interpreter.invoke()
    return {d["name"]: np.array(interpreter.get_tensor(d["index"]), copy=True) for d in interpreter.get_output_details()}


def _run_gpu(model: bytes, precision: str, feeds: dict[str, np.ndarray], threads: int) -> dict[str, np.ndarray]:
    from layerdiff.collector.engines.harness_cli import HarnessExit
    from layerdiff.collector.engines.litert.gpu import compile_model

    with _quiet_native_stderr():  # the accelerator logs every compile: one trial would fill the terminal
        try:
            compiled = compile_model(model, precision, threads, [])
        except HarnessExit as err:
            raise RuntimeError(str(err)) from None
    signature = compiled.get_signature_by_index(0)
    in_details = compiled.get_input_tensor_details(signature["key"])
    out_details = compiled.get_output_tensor_details(signature["key"])
    inputs, outputs = compiled.create_input_buffers(0), compiled.create_output_buffers(0)
    for buffer, name in zip(inputs, signature["inputs"]):
        buffer.write(np.asarray(feeds[name], dtype=in_details[name]["dtype"]).reshape(-1))
    with _quiet_native_stderr():
        compiled.run_by_index(0, inputs, outputs)
    values = {}
    for buffer, name in zip(outputs, signature["outputs"]):
        detail = out_details[name]
        count = int(np.prod(detail["shape"], dtype=np.int64))
        values[name] = np.asarray(buffer.read(count, np.dtype(detail["dtype"]))).reshape(detail["shape"]).copy()
    return values


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def worst_error(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """Worst relative L2 over the outputs; a non-finite value where the reference is finite is an infinite error."""
    worst = 0.0
    for name, ref in reference.items():
        out = outputs[name].astype(np.float64).reshape(-1)
        ref = ref.astype(np.float64).reshape(-1)
        if out.size != ref.size or bool(np.any(~np.isfinite(out) & np.isfinite(ref))):
            return math.inf
        finite = np.isfinite(ref)
        norm = float(np.linalg.norm(ref[finite]))
        diff = float(np.linalg.norm(out[finite] - ref[finite]))
        worst = max(worst, diff / norm if norm else diff)
    return worst


def _select_vulkan_driver(*configs: tuple[str, str]) -> None:
    """The Vulkan driver layerdiff's GPU runs use (SwiftShader unless VK_ICD_FILENAMES is set), chosen the same way."""
    if not any(backend == "gpu" for backend, _ in configs):
        return
    from layerdiff.collector.engines.litert.gpu import availability, vulkan_icd

    ready = availability()
    if not ready.get("ok"):
        raise DeviceError(f"litert gpu: {ready.get('reason')}")
    icd, _ = vulkan_icd()
    if icd and not os.environ.get("VK_ICD_FILENAMES"):
        os.environ["VK_ICD_FILENAMES"] = icd
