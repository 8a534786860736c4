"""What a `.tflite` file says about its main graph: operators in execution order, edges, weights.

Read from the model's flatbuffer with the schema module the `ai-edge-litert` wheel ships
(`ai_edge_litert.schema_py_generated`, the generated code of LiteRT's public `schema.fbs`), never from
a private interpreter method: the operator list of subgraph 0 *is* the execution order the
interpreter follows, and every operator names its input and output tensors.

Weights are never activations. A tensor is a weight when its buffer holds data, and so is every
output of an operator whose inputs are all weights (`DEQUANTIZE`/`DENSIFY` of fp16 or sparse
weights): XNNPACK never computes those (they read as zeros under it) and a GPU folds them, so they
are left out of every dump and only real activations are compared.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from layerdiff.errors import ModelFormatError

TFLITE_IDENTIFIER = b"TFL3"
# TensorType enum of schema.fbs -> numpy dtype name (types layerdiff cannot hold are mapped to None)
TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16",
                9: "int8", 10: "float64", 12: "uint64", 15: "uint32", 16: "uint16"}


NotTflite = ModelFormatError  # not a LiteRT flatbuffer, or one this schema cannot read (layerdiff/errors.py)


@dataclass
class Op:
    """One operator of the main graph, in execution order."""

    index: int
    op_type: str  # builtin name (`CONV_2D`) or the custom code
    inputs: list[int]  # tensor indices, optional inputs (-1) dropped
    outputs: list[int]


@dataclass
class Graph:
    """The main subgraph: its tensors, its operators and which tensors are activations."""

    tensor_names: list[str]
    tensor_shapes: list[list[int]]
    tensor_dtypes: list[str | None]
    ops: list[Op]
    inputs: list[int]
    outputs: list[int]
    weights: set[int] = field(default_factory=set)  # constant tensors and everything computed only from them
    subgraphs: int = 1

    def computing_ops(self) -> list[Op]:
        """Operators that compute activations (weight decoding left out), in execution order."""
        return [op for op in self.ops if not all(o in self.weights for o in op.outputs)]

    def activations(self) -> list[int]:
        """Every activation tensor an operator writes, in execution order (model outputs included)."""
        return [o for op in self.computing_ops() for o in op.outputs if o not in self.weights]

    def name(self, index: int) -> str:
        return self.tensor_names[index]

    def edge_names(self, op: Op) -> list[str]:
        """The op's inputs that are activations or model inputs (weights are not graph edges)."""
        return [self.tensor_names[i] for i in op.inputs if i not in self.weights]


def _schema():
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


@lru_cache(maxsize=1)
def _op_names() -> dict[int, str]:
    ops = _schema().BuiltinOperator
    return {value: name for name, value in vars(ops).items() if not name.startswith("_") and isinstance(value, int)}


def read_model(data: bytes, source: str = "model"):
    """The flatbuffer's root `Model` table, or NotTflite with a one-line reason."""
    if len(data) < 8 or data[4:8] != TFLITE_IDENTIFIER:
        raise NotTflite(f"{source}: not a .tflite flatbuffer (no TFL3 identifier)")
    try:
        model = _schema().Model.GetRootAs(data, 0)
        if model.SubgraphsLength() < 1:
            raise NotTflite(f"{source}: the model has no subgraph")
        return model
    except NotTflite:
        raise
    except Exception as err:  # noqa: BLE001 - a corrupt flatbuffer raises struct/index errors
        raise NotTflite(f"{source}: unreadable .tflite flatbuffer ({type(err).__name__}: {err})") from None


def load_graph(data: bytes, source: str = "model") -> Graph:
    """The main subgraph (index 0) of a .tflite file's bytes as a Graph."""
    model = read_model(data, source)
    try:
        return _graph(model)
    except Exception as err:  # noqa: BLE001 - offsets pointing outside the file
        raise NotTflite(f"{source}: unreadable .tflite flatbuffer ({type(err).__name__}: {err})") from None


def _graph(model) -> Graph:
    sub = model.Subgraphs(0)
    names, shapes, dtypes, constants = [], [], [], set()
    for t in range(sub.TensorsLength()):
        tensor = sub.Tensors(t)
        names.append((tensor.Name() or b"").decode("utf-8", "replace") or f"tensor_{t}")
        shapes.append([int(d) for d in tensor.ShapeAsNumpy()] if tensor.ShapeLength() else [])
        dtypes.append(TENSOR_TYPES.get(tensor.Type()))
        if _has_data(model, tensor.Buffer()):
            constants.add(t)
    ops = [_op(model, sub.Operators(k), k) for k in range(sub.OperatorsLength())]
    graph = Graph(names, shapes, dtypes, ops, _ints(sub.InputsAsNumpy()), _ints(sub.OutputsAsNumpy()),
                  subgraphs=model.SubgraphsLength())
    graph.weights = _weights(ops, constants)
    return graph


def _has_data(model, buffer_index: int) -> bool:
    if buffer_index <= 0 or buffer_index >= model.BuffersLength():
        return False  # buffer 0 is the empty sentinel every activation points at
    buffer = model.Buffers(buffer_index)
    return buffer.DataLength() > 0 or buffer.Size() > 0  # Size/Offset: data stored after the flatbuffer


def _op(model, operator, index: int) -> Op:
    code = model.OperatorCodes(operator.OpcodeIndex())
    builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())  # schema v3a keeps small codes in the old field
    if builtin == _schema().BuiltinOperator.CUSTOM:
        op_type = (code.CustomCode() or b"CUSTOM").decode("utf-8", "replace")
    else:
        op_type = _op_names().get(builtin, f"BUILTIN_{builtin}")
    inputs = [i for i in _ints(operator.InputsAsNumpy()) if i >= 0]
    return Op(index, op_type, inputs, [o for o in _ints(operator.OutputsAsNumpy()) if o >= 0])


def _ints(array) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)] if not isinstance(array, int) else []


def _weights(ops: list[Op], constants: set[int]) -> set[int]:
    """Constants, and outputs of operators fed by constants only (weight decoding, folded by engines)."""
    weights = set(constants)
    for op in ops:
        if op.inputs and all(i in weights for i in op.inputs):
            weights.update(op.outputs)
    return weights


def input_specs(path: Path) -> dict[str, tuple[tuple[int, ...] | None, str]]:
    """Each model input's declared shape (NHWC as the file has it; -1 = dynamic) and numpy dtype."""
    data = Path(path).read_bytes()
    graph = load_graph(data, str(path))
    sub = read_model(data, str(path)).Subgraphs(0)
    specs = {}
    for i in graph.inputs:
        tensor = sub.Tensors(i)
        signature = [int(d) for d in tensor.ShapeSignatureAsNumpy()] if tensor.ShapeSignatureLength() else []
        shape = tuple(signature or graph.tensor_shapes[i])
        specs[graph.name(i)] = (shape or None, graph.tensor_dtypes[i] or "float32")
    return specs


def with_outputs(data: bytes, extra: list[int]) -> bytes:
    """The model with `extra` tensors appended to the main graph's outputs (and to its signature).

    The GPU accelerator only hands back a model's outputs; making every activation an output is
    how its intermediate values are read. Tensors the accelerator fuses away are still never
    written (see gpu.py), and extra outputs do not change which ops it accepts.
    """
    import flatbuffers

    schema = _schema()
    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    sub = model.subgraphs[0]
    known = set(int(o) for o in sub.outputs)
    added = [t for t in extra if t not in known]
    sub.outputs = [int(o) for o in sub.outputs] + added
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == 0:
            for t in added:
                entry = schema.TensorMapT()
                entry.name, entry.tensorIndex = sub.tensors[t].name, t
                signature.outputs = list(signature.outputs or []) + [entry]
    builder = flatbuffers.Builder(len(data) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=TFLITE_IDENTIFIER)
    return bytes(builder.Output())
