"""Every node output of an ONNX model, computed once: the graph run as consecutive segments.

Why: ONNX Runtime keeps every graph output of a run alive to the run's end, so dumping all tensors
needs several runs with a few outputs each (`engine.run_once`). Each of those runs recomputed the
whole graph up to its outputs: n groups cost about n/2 inferences (PP-OCR det at 640x640: 21
groups, 15 s where one inference takes 0.5 s), and halving the memory doubled the time.

Here the graph's nodes (ONNX keeps them in topological order) are cut into consecutive segments,
each a model of its own whose inputs are the tensors it needs from earlier segments (kept as arrays
only until their last consumer has run) and whose outputs are its nodes' outputs. Each node runs
once, with the same kernel as in the whole graph (optimisations off), so the values are the ones
the whole graph computes; memory is one segment's outputs plus the tensors still to be consumed,
the live set any inference holds.

Graphs whose values cannot cross a segment boundary as tensors (control flow with sub-graphs that
read outer names, sequences, optionals) go through `engine.run_once` instead (`segmentable`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from layerdiff.collector.engines.harness_cli import EXIT_RUN, HarnessExit

# op types whose values are not tensors or that read names their inputs do not list
_NOT_SEGMENTABLE = ("If", "Loop", "Scan", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
                    "SequenceInsert", "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence",
                    "Optional", "OptionalGetElement", "OptionalHasElement")


def segmentable(model) -> bool:
    """True when every value flowing between nodes is a tensor named in the nodes' inputs and outputs."""
    return not any(node.op_type in _NOT_SEGMENTABLE or any(a.g.node or a.graphs for a in node.attribute)
                   for node in model.graph.node)


@dataclass
class Segment:
    """Consecutive nodes of the main graph and what crosses their boundary."""

    nodes: list = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # produced before the segment (or model inputs)
    outputs: list[str] = field(default_factory=list)  # every output of its nodes


class Plan:
    """Where each tensor is produced and last consumed (node index in graph order), and its size."""

    def __init__(self, model, feeds: dict[str, np.ndarray]) -> None:
        self.model = model
        self.nodes = list(model.graph.node)
        self.weights = {init.name: init for init in model.graph.initializer}
        # Constant nodes' values: ONNX Runtime makes them initializers (weights it may pre-pack), so a
        # segment gets them as initializers too; fed as inputs, a MatMul took another path (1 ulp off)
        self.constants = {out for node in self.nodes if node.op_type == "Constant" for out in node.output}
        self.last_use: dict[str, int] = {}
        for index, node in enumerate(self.nodes):
            for name in node.input:
                if name:
                    self.last_use[name] = index
        for out in model.graph.output:
            self.last_use[out.name] = len(self.nodes)  # the model's outputs are kept to the end
        self.sizes = static_sizes(model, feeds)
        self.unknown_size = 0  # bytes assumed for a tensor of unknown size: the largest such one seen yet

    def end_of_segment(self, start: int, budget: int) -> int:
        """The node index where the segment from `start` ends: outputs of about `budget` bytes, one node at least."""
        guess = self.unknown_size or budget // 8
        total, end = 0, start
        while end < len(self.nodes):
            total += sum(self.sizes.get(name, guess) for name in self.nodes[end].output if name)
            if total > budget and end > start:
                break
            end += 1
        return end

    def seen(self, name: str, nbytes: int) -> None:
        if name not in self.sizes:
            self.unknown_size = max(self.unknown_size, nbytes)

    def segment(self, start: int, end: int) -> Segment:
        """Nodes [start, end) with the names they read from before `start`."""
        nodes = self.nodes[start:end]
        produced: set[str] = set()
        seg = Segment(nodes=nodes)
        for node in nodes:
            for name in node.input:
                if name and name not in produced and name not in self.weights and name not in seg.inputs:
                    seg.inputs.append(name)
            for name in node.output:
                if name:
                    produced.add(name)
                    seg.outputs.append(name)
        return seg

    def still_needed(self, name: str, after: int) -> bool:
        """Is `name` read by a node at index >= after (or a model output)?"""
        return self.last_use.get(name, -1) >= after

    def segment_model(self, seg: Segment, live: dict[str, np.ndarray]):
        """The segment as a model of its own: its inputs typed and shaped from the arrays fed to it,
        earlier Constant nodes' values as initializers."""
        from onnx import helper, numpy_helper

        graph = helper.make_graph(
            list(seg.nodes), "layerdiff_segment",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(live[n].dtype), live[n].shape)
             for n in self.fed(seg)],
            [helper.make_empty_tensor_value_info(n) for n in seg.outputs],
            [self.weights[n] for n in _weight_names(seg, self.weights)]
            + [numpy_helper.from_array(live[n], n) for n in seg.inputs if n in self.constants])
        segment = helper.make_model(graph, opset_imports=list(self.model.opset_import))
        segment.ir_version = self.model.ir_version
        segment.functions.extend(self.model.functions)
        return segment

    def fed(self, seg: Segment) -> list[str]:
        """The segment's inputs fed at run time (earlier Constant nodes' values are its initializers)."""
        return [n for n in seg.inputs if n not in self.constants]


def _weight_names(seg: Segment, weights: dict) -> list[str]:
    seen: dict[str, None] = {}
    for node in seg.nodes:
        for name in node.input:
            if name in weights:
                seen.setdefault(name)
    return list(seen)


def static_sizes(model, feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """Bytes of every node output whose shape ONNX's shape inference knows for these inputs.

    Inferred on a copy of the graph in which the inputs have the fed shapes and large weights are
    typed inputs without data (shape inference reads only small constants' values), so the model
    is not copied whole. Unknown sizes (data-dependent shapes, or inference failing) are left out."""
    from onnx import TensorProto, helper, shape_inference

    graph = model.graph
    small = [w for w in graph.initializer if math.prod(w.dims) <= 4096]
    large = [helper.make_tensor_value_info(w.name, w.data_type, list(w.dims))
             for w in graph.initializer if math.prod(w.dims) > 4096]
    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
              for name, array in feeds.items()]
    probe = helper.make_model(helper.make_graph(list(graph.node), "layerdiff_shapes", inputs + large, [], small),
                              opset_imports=list(model.opset_import))
    probe.ir_version = model.ir_version
    probe.functions.extend(model.functions)
    try:
        inferred = shape_inference.infer_shapes(probe, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises InferenceError and others; sizes are only a plan
        return {}
    sizes = {}
    for info in inferred.graph.value_info:
        tensor = info.type.tensor_type
        dims = tensor.shape.dim
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in dims) and tensor.elem_type != TensorProto.STRING:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
            sizes[info.name] = math.prod(d.dim_value for d in dims) * itemsize
    return sizes


def run_segments(model, feeds: dict[str, np.ndarray], session_for: Callable, on_tensor: Callable,
                 budget: int) -> float:
    """Run the graph segment by segment; `on_tensor(node, k, name, array, ms)` sees every node
    output in graph order. Each segment's outputs come to about `budget` bytes (sizes from ONNX shape
    inference; one node at least). Returns the engines' run time in ms."""
    import time

    plan = Plan(model, feeds)
    live: dict[str, np.ndarray] = dict(feeds)
    total, start = 0.0, 0
    while start < len(plan.nodes):
        end = plan.end_of_segment(start, budget)
        seg = plan.segment(start, end)
        session = session_for(plan.segment_model(seg, live))
        begin = time.perf_counter()
        try:
            values = session.run_with_ort_values(seg.outputs, {n: _ort_value(live[n]) for n in plan.fed(seg)})
        except Exception as err:  # noqa: BLE001 - ORT raises its own runtime error types
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            span = [node.name or node.output[0] for node in (seg.nodes[0], seg.nodes[-1])]
            where = repr(span[0]) if len(seg.nodes) == 1 else f"{span[0]!r} .. {span[1]!r}"
            raise HarnessExit(EXIT_RUN, f"ONNX Runtime failed to run the model in nodes {where} ({first})") from None
        elapsed = (time.perf_counter() - begin) * 1e3
        total += elapsed
        del session
        position = 0
        for node in seg.nodes:
            for k, name in enumerate(node.output):
                if not name:
                    continue
                array = values[position].numpy()
                values[position] = None
                position += 1
                plan.seen(name, array.nbytes)
                on_tensor(node, k, name, array, elapsed / len(seg.outputs))
                if plan.still_needed(name, end):
                    live[name] = array
                del array
        for name in seg.inputs:  # released once no later node reads it
            if not plan.still_needed(name, end) and name not in feeds:
                live.pop(name, None)
        start = end
    return total


def _ort_value(array: np.ndarray):
    import onnxruntime

    return onnxruntime.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
