"""MNN models with control flow (If / Loop), run through MNN's Module API with every top-level op dumped.

MNN's session API runs the ops of the main graph only: an If or Loop is a sub-graph the session never
executes, so a model whose outputs come through one (silero-vad) gets empty outputs. MNN's Module API
(`MNN.nn.load_module_from_file`) runs the sub-graphs. pymnn offers no per-op callback for modules
(Executor::setCallBack is C++ only), but a module returns any graph tensor named as one of its
outputs: every tensor of the main graph is asked for, so each top-level op's output is dumped, read
after the run in a topological order of the graph. What this cannot show is said in the header
(`options.api`, `options.not_dumped`): tensors inside the If/Loop bodies, and per-op times.
"""
from __future__ import annotations

import numpy as np

from layerdiff.analyzer.formats.layouts import plain_layout
from layerdiff.collector.engines.harness_cli import EXIT_MODEL, EXIT_RUN, DumpSink, HarnessExit, now_ms
from layerdiff.collector.engines.mnn.session import BACKEND_NAMES
from layerdiff.collector.engines.mnn.modelfile import quiet_stdout

CONTROL_FLOW = {"If", "While", "Loop"}
NOT_DUMPED = ("tensors inside If/Loop sub-graphs (MNN's Module API returns main-graph tensors only; pymnn has "
              "no per-op callback for modules) and per-op times (one forward computes them all)")


def control_flow_ops(graph: dict) -> list[str]:
    """Names of the main graph's If/While/Loop ops (MNN Express `load_as_dict`)."""
    return [name for name, var in graph.items() if var.op_type in CONTROL_FLOW]


def module_options() -> dict:
    return {"api": "module (control flow: MNN's session API does not run If/Loop sub-graphs)",
            "not_dumped": NOT_DUMPED}


def topological(graph: dict) -> list[str]:
    """The main graph's computed tensors (no inputs, no constants) in an order where producers come first."""
    computed = [n for n, v in graph.items() if v.op_type not in ("Input", "Const")]
    wanted = set(computed)
    order: list[str] = []
    placed: set[str] = set()

    def place(name: str, depth: int = 0) -> None:
        if name in placed or name not in wanted or depth > len(computed):
            return
        placed.add(name)
        for var in graph[name].inputs:
            place(var.name, depth + 1)
        order.append(name)

    for name in computed:
        place(name)
    return order


def run_module(args, graph: dict, inputs: dict[str, np.ndarray], sink: DumpSink, memory: str) -> float:
    """One forward of the whole model with every main-graph tensor returned and dumped; returns its ms."""
    import MNN.expr as F
    import MNN.nn as nn

    names = topological(graph)
    config = {"backend": BACKEND_NAMES[args.backend], "precision": args.precision, "numThread": args.threads}
    model_inputs = [n for n, v in graph.items() if v.op_type == "Input"]
    missing = [n for n in model_inputs if n not in inputs]
    if missing:
        raise HarnessExit(EXIT_RUN, f"model input {missing[0]!r} was not given: add --input {missing[0]}=FILE.npy")
    try:
        with quiet_stdout():
            runtime = nn.create_runtime_manager((config,))
            module = nn.load_module_from_file(str(args.models[0]), model_inputs, names, runtime_manager=runtime)
    except Exception:  # noqa: BLE001 - pymnn raises bare Exceptions
        raise HarnessExit(EXIT_MODEL, f"{args.models[0]}: MNN's Module API could not load this model") from None
    feeds = [_variable(F, inputs[n], _declared_format(F, graph[n])) for n in model_inputs]
    for name, var in zip(model_inputs, feeds):
        array, held = _read(F, var)
        if array is not None:
            order = "NHWC" if held == "NHWC" and array.ndim == 4 else plain_layout(array.ndim)
            sink.fed(name, array, f"{order} (MNN {held})" if held else order)
    start = now_ms()
    outputs = module.forward(feeds)
    values = [_read(F, v) for v in outputs]  # reading computes: the forward's time includes it
    elapsed = now_ms() - start
    for name, (array, held) in zip(names, values):
        if array is None:
            continue
        edges = [v.name for v in graph[name].inputs if v.name in graph and graph[v.name].op_type != "Const"]
        axes = "NHWC" if held == "NHWC" and array.ndim == 4 else plain_layout(array.ndim)  # NHWC is kept as is
        layout = f"{axes} (MNN {held})" if held else axes
        sink.add(op=name, op_type=graph[name].op_type, array=array, output_index=0, name=name, inputs=edges,
                 layout=layout, memory=memory)
    return elapsed


def _declared_format(F, var):
    """The format the model declares for an input: NHWC for TFLite-origin graphs, else NCHW (MNN
    converts NCHW to its packed NC4HW4 itself). A variable made as NCHW for an NHWC input would be
    read by the graph in the other order."""
    declared = str(getattr(var, "data_format", "")).rsplit(".", 1)[-1]
    return F.NHWC if declared == "NHWC" else F.NCHW


def _variable(F, array: np.ndarray, data_format=None):
    """An input variable of the model's element type (MNN computes integers as int32), in the format
    the model declares for it."""
    data_format = F.NCHW if data_format is None else data_format
    if array.dtype.kind in "iub":
        return F.const(np.ascontiguousarray(array, dtype=np.int32), list(array.shape), data_format, F.int)
    return F.const(np.ascontiguousarray(array, dtype=np.float32), list(array.shape), data_format, F.float)


def _read(F, var) -> tuple[np.ndarray | None, str]:
    """(values in the graph's order, MNN's format of the variable); None for a tensor with no elements."""
    try:
        held = str(var.data_format).rsplit(".", 1)[-1]
        plain = F.convert(var, F.NCHW) if held == "NC4HW4" else var  # NHWC is a TF graph's own order: kept
        shape = tuple(plain.shape)
        array = np.array(plain.read(), copy=True)
    except Exception:  # noqa: BLE001 - pymnn raises bare Exceptions for variables it cannot compute
        return None, ""
    if array.size == 0:
        return None, ""
    return (array.reshape(shape) if array.size == int(np.prod(shape)) else array), held
