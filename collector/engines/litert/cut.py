"""Operators cut out of a `.tflite` model as a `.tflite` of their own, written with LiteRT's own schema.

The flatbuffer is read and written with the object API of the schema module the `ai-edge-litert`
wheel ships (`schema_py_generated`, LiteRT's public `schema.fbs`): the cut model keeps the chosen
operators exactly as the file has them (options, opcodes, quantization, tensor types), the weights
they read (their buffers copied byte for byte) and the operators that decode those weights
(`DEQUANTIZE`/`DENSIFY` of fp16 or sparse constants), so a GPU accelerator meets the same graph
shape around the op (decoding on the CPU, the op on the GPU) as in the full model. Every activation
the piece reads from outside becomes a model input with its recorded shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerdiff.collector.engines.litert.graph import TFLITE_IDENTIFIER, Graph, load_graph
from layerdiff.errors import InputError

# Operators that call other subgraphs: a cut keeps the main subgraph only.
CALLS_SUBGRAPHS = frozenset({"WHILE", "IF", "CALL", "CALL_ONCE", "STABLEHLO_WHILE", "STABLEHLO_CASE",
                             "STABLEHLO_REDUCE", "STABLEHLO_SCATTER", "STABLEHLO_SORT", "STABLEHLO_REDUCE_WINDOW"})


@dataclass(frozen=True)
class LitertCut:
    """The cut model's bytes, the activations it reads and writes, and its operators' output names."""

    model: bytes
    inputs: list[str]
    outputs: list[str]
    layers: list[str]


def cut(model: Path, first: str, last: str, shapes: dict[str, tuple[int, ...]],
        outputs: list[str] | None = None) -> LitertCut:
    """The computing operators from the one writing tensor `first` to the one writing `last` (file
    order, which is LiteRT's execution order) as a `.tflite`; `shapes` gives recorded tensor shapes.
    The piece's outputs are the last operator's, or the tensors `outputs` names."""
    data = Path(model).read_bytes()
    return cut_graph(data, load_graph(data, str(model)), first, last, shapes, outputs, Path(model))


def cut_graph(data: bytes, graph: Graph, first: str, last: str, shapes: dict, outputs: list[str] | None,
              model: Path) -> LitertCut:
    """`cut` of a model already read (a bisection cuts one model many times)."""
    begin, end = _op_index(graph, first, model), _op_index(graph, last, model)
    if end < begin:
        raise InputError(f"--layer {first}..{last}: {last!r} runs before {first!r} in {model.name}; name them in execution order")
    island = [op for op in graph.computing_ops() if begin <= op.index <= end]
    refused = sorted({op.op_type for op in island if op.op_type in CALLS_SUBGRAPHS})
    if refused:
        raise InputError(f"{model}: {', '.join(refused)} calls other subgraphs; a cut keeps the main graph only, "
                         "name layers outside it")
    produced = {t for op in island for t in op.outputs}
    inputs = _ordered(t for op in island for t in op.inputs if t not in graph.weights and t not in produced)
    if outputs is None:
        outputs = [t for t in graph.ops[end].outputs if t not in graph.weights]
    else:
        index = {graph.name(t): t for t in produced}
        outputs = [index[name] for name in outputs]
    kept_ops = sorted({op.index for op in island} | _weight_decoders(graph, island))
    cut_bytes = _write(data, kept_ops, inputs, outputs, {t: shapes.get(graph.name(t)) for t in inputs})
    return LitertCut(cut_bytes, [graph.name(t) for t in inputs], [graph.name(t) for t in outputs],
                     [graph.name(op.outputs[0]) for op in island if op.outputs])


def _op_index(graph: Graph, name: str, model: Path) -> int:
    for op in graph.computing_ops():
        if any(graph.name(t) == name for t in op.outputs):
            return op.index
    raise InputError(f"{model}: no operator writes a tensor {name!r}; `analyze inspect` on a run lists the layers")


def _ordered(items) -> list[int]:
    seen: list[int] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def _weight_decoders(graph: Graph, island) -> set[int]:
    """The operators that compute the weights the island reads (and the weights those read)."""
    writer = {t: op for op in graph.ops for t in op.outputs}
    wanted = [t for op in island for t in op.inputs if t in graph.weights]
    found: set[int] = set()
    while wanted:
        op = writer.get(wanted.pop())
        if op is not None and op.index not in found:
            found.add(op.index)
            wanted.extend(op.inputs)
    return found


def _write(data: bytes, kept_ops: list[int], inputs: list[int], outputs: list[int], shapes: dict) -> bytes:
    """The model with only `kept_ops` in its main subgraph, tensors and buffers renumbered."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    sub = model.subgraphs[0]
    ops = [sub.operators[k] for k in kept_ops]
    used = _ordered([*inputs, *(int(t) for op in ops for t in _tensor_lists(op) if int(t) >= 0), *outputs])
    renumber = {old: new for new, old in enumerate(used)}
    buffers, buffer_of = [schema.BufferT()], {0: 0}
    tensors = []
    for old in used:
        tensor = sub.tensors[old]
        if old in inputs:
            tensor.buffer = 0
            recorded = shapes.get(old)
            if recorded:
                tensor.shape, tensor.shapeSignature = [int(d) for d in recorded], None
        elif tensor.buffer not in buffer_of:
            source = model.buffers[tensor.buffer]
            if getattr(source, "offset", 0) > 1:
                raise InputError("the model keeps its weights after the flatbuffer (a >2 GB layout); cutting it is not supported")
            buffer_of[tensor.buffer] = len(buffers)
            buffers.append(source)
        tensor.buffer = buffer_of.get(tensor.buffer, 0)
        tensors.append(tensor)
    for op in ops:
        op.inputs = [renumber[int(t)] if int(t) >= 0 else -1 for t in op.inputs]
        op.outputs = [renumber[int(t)] for t in op.outputs]
        if op.intermediates is not None and len(op.intermediates):
            op.intermediates = [renumber[int(t)] for t in op.intermediates]
    sub.tensors, sub.operators = tensors, ops
    sub.inputs, sub.outputs = [renumber[t] for t in inputs], [renumber[t] for t in outputs]
    model.subgraphs, model.buffers = [sub], buffers
    model.metadata, model.metadataBuffer = None, None  # they point at buffers of the full model
    model.signatureDefs = [_signature(schema, sub)]
    builder = flatbuffers.Builder(len(data) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=TFLITE_IDENTIFIER)
    return bytes(builder.Output())


def _tensor_lists(op) -> list:
    lists = [op.inputs, op.outputs, op.intermediates]
    return [t for values in lists if values is not None for t in values]


def _signature(schema, sub):
    """One signature naming inputs and outputs by their tensor names (what the runner feeds and reads)."""
    def entries(indices):
        out = []
        for index in indices:
            entry = schema.TensorMapT()
            entry.name, entry.tensorIndex = sub.tensors[index].name, index
            out.append(entry)
        return out

    signature = schema.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = b"serving_default", 0
    signature.inputs, signature.outputs = entries(sub.inputs), entries(sub.outputs)
    return signature
