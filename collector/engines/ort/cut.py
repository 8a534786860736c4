"""Nodes cut out of an `.onnx` model as an `.onnx` of their own.

The piece keeps the nodes exactly as the file has them (op type, domain, attributes), the
initializers they read and the `Constant` nodes that feed them; every tensor it reads from the rest
of the graph becomes a graph input with the shape the reference run recorded and the element type the
model gives it. The model's opset imports, IR version and local functions are kept, so ONNX Runtime
picks the same kernels as for the full graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerdiff.errors import InputError

CONSTANT_OPS = ("Constant",)


@dataclass(frozen=True)
class OnnxCut:
    """The cut model's bytes, the tensors it reads and writes, and its nodes (by first output)."""

    model: bytes
    inputs: list[str]
    outputs: list[str]
    layers: list[str]


def cut(model_path: Path, first: str, last: str, shapes: dict[str, tuple[int, ...]]) -> OnnxCut:
    """The nodes from the one writing tensor `first` to the one writing `last` (graph order)."""
    import onnx  # imported here: only a bundle of an ONNX model needs it

    try:
        model = onnx.load(str(model_path))
    except Exception as err:  # noqa: BLE001 - protobuf decode errors have many types
        raise InputError(f"{model_path}: not a readable ONNX model ({type(err).__name__})") from None
    graph = model.graph
    nodes = list(graph.node)
    begin, end = _node_index(nodes, first, model_path), _node_index(nodes, last, model_path)
    if end < begin:
        raise InputError(f"--layer {first}..{last}: {last!r} comes before {first!r} in {model_path.name}; name them in graph order")
    island = [node for node in nodes[begin:end + 1] if node.op_type not in CONSTANT_OPS]
    nested = [node.name or node.output[0] for node in island
              if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)]
    if nested:
        raise InputError(f"{model_path}: node {nested[0]!r} holds a subgraph (control flow); a cut of it is not supported, "
                         "name the nodes around it")
    initializers = {init.name: init for init in graph.initializer}
    constants = {out: node for node in nodes if node.op_type in CONSTANT_OPS for out in node.output}
    produced = {out for node in island for out in node.output}
    read = _ordered(name for node in island for name in node.input if name)
    inputs = [n for n in read if n not in produced and n not in initializers and n not in constants]
    outputs = [out for out in nodes[end].output if out]
    types = _element_types(onnx, model)
    cut_graph = onnx.helper.make_graph(
        [constants[n] for n in read if n in constants] + island, f"{graph.name or 'graph'}_cut",
        [onnx.helper.make_tensor_value_info(n, types.get(n, onnx.TensorProto.FLOAT), shapes.get(n)) for n in inputs],
        [onnx.helper.make_tensor_value_info(n, types.get(n, onnx.TensorProto.FLOAT), None) for n in outputs],
        [initializers[n] for n in read if n in initializers])
    cut_model = onnx.helper.make_model(cut_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                                       producer_name="layerdiff collect repro")
    cut_model.functions.extend(model.functions)
    return OnnxCut(cut_model.SerializeToString(), inputs, outputs, [node.output[0] for node in island if node.output])


def _node_index(nodes, tensor: str, model_path: Path) -> int:
    for k, node in enumerate(nodes):
        if tensor in node.output:
            return k
    raise InputError(f"{model_path}: no node writes a tensor {tensor!r}; `analyze inspect` on a run lists the layers")


def _ordered(items) -> list[str]:
    seen: list[str] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def _element_types(onnx, model) -> dict[str, int]:
    """Each tensor's element type, from the graph's declarations and ONNX's shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - inference gives up on some custom ops: declared types still hold
        inferred = model.graph
    out = {}
    for info in (*inferred.input, *inferred.value_info, *inferred.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            out[info.name] = info.type.tensor_type.elem_type
    for init in model.graph.initializer:
        out[init.name] = init.data_type
    return out
