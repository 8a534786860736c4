"""ONNX Runtime on the host, speaking the harness command line: the `local` device's golden engine.

`collect --device local --model m.onnx` runs the original ONNX model here and dumps every
intermediate tensor, so the reference a converted MNN/ncnn model is compared with goes through the
same run pipeline (provenance, input hashing, HDF5) as every other run. Every node output of the
main graph is dumped; graph optimisations are off, so each tensor is the value the ONNX graph
defines (not a fused kernel's). The graph runs as consecutive segments, each node once, each
segment's outputs about a budget's worth (`segments.py`), so a large model's activations never all
sit in memory at once; a graph with control flow runs as groups of outputs instead (`run_once`).

Keys: a node's tensors are dumped under the op name of its first output tensor (`op` = that tensor's
name, `output_index` = k, `name` = the k-th output tensor), which is how MNN's converter names ops
and how Polygraphy-style goldens name layers.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from layerdiff.analyzer.formats.layouts import plain_layout
from layerdiff.collector.engines import plainrun
from layerdiff.collector.engines.ort.segments import run_segments, segmentable
from layerdiff.vocabulary import host_abi
from layerdiff.collector.engines.harness_cli import (
    HARNESS_VERSION,
    EXIT_ARGS,
    EXIT_BACKEND,
    EXIT_MODEL,
    EXIT_RUN,
    DumpSink,
    HarnessArgs,
    HarnessExit,
    base_header,
    harness_main,
    load_inputs,
    now_ms,
    repeat_dirs,
)

# About this many bytes of outputs are fetched per session run (memory bound): a segment's outputs
# (segments.py), or a group's for graphs that cannot be cut (control flow). PP-OCR det at 640x640,
# segments: collect 4.3 s and a process tree of 242 MB against ONNX Runtime's own 133 MB (the grouped
# runs took 15 s and 288 MB: each recomputed the graph up to its outputs); tests/bench/bench_collect_memory.py.
GROUP_BYTES = 32 << 20
FIRST_GROUP = 1  # outputs in the first run, before tensor sizes are known


@dataclass
class NodeOutputs:
    """One ONNX node's dumped tensors, in graph (topological) order."""

    op: str
    op_type: str
    outputs: list[str]
    inputs: list[str]
    node: str = ""  # the node's own name, as Netron shows it (op is its first output, the key MNN shares)


def _ort():
    import onnxruntime

    return onnxruntime


def engine_version() -> str:
    return _ort().__version__


def probe() -> dict:
    reason = "the onnxruntime engine runs on the CPU only"
    backends = {"cpu": {"ok": True}, "opencl": {"ok": False, "reason": reason}, "vulkan": {"ok": False, "reason": reason}}
    abi = host_abi()
    return {"harness": "layerdiff-local-onnxruntime", "version": HARNESS_VERSION, "abi": abi,
            "engines": {"onnxruntime": {"version": engine_version(), "backends": backends}}}


def model_precision(model) -> str:
    from layerdiff.collector.engines.ort.modelfile import model_precision as declared

    return declared(model)


def load_model(args: HarnessArgs):
    import onnx

    path = args.models[0]
    try:
        return onnx.load(str(path))
    except Exception as err:  # noqa: BLE001 - protobuf raises DecodeError and friends
        raise HarnessExit(EXIT_MODEL, f"{path}: not a readable ONNX model ({err})") from None


def dumped_nodes(model) -> list[NodeOutputs]:
    """The main graph's nodes whose outputs are dumped (Constant nodes are weights, not layers)."""
    weights = {init.name for init in model.graph.initializer}
    constants = {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    nodes = []
    for node in model.graph.node:
        outputs = [o for o in node.output if o]
        if node.op_type == "Constant" or not outputs:
            continue
        inputs = [i for i in node.input if i and i not in weights and i not in constants]
        nodes.append(NodeOutputs(outputs[0], node.op_type, outputs, inputs, node.name))
    return nodes


def node_names(nodes: list[NodeOutputs]) -> dict[str, str]:
    """Layer key -> ONNX node name, where the two differ: findings name the node a user finds in Netron
    (`warp/grid_sample`) beside the tensor (`gs:0`) the key is made of."""
    return {f"{n.op}:{k}": n.node for n in nodes if n.node and n.node != n.op for k in range(len(n.outputs))}


def with_outputs(model, names: list[str]):
    """The model with `names` (only) as its graph outputs, types left to ONNX Runtime's inference."""
    from onnx import helper

    del model.graph.output[:]
    model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    return model


OPTIMIZATION_ENV = "LAYERDIFF_ORT_OPTIMIZATION"  # disable (default: the golden) / basic / extended / all
OPTIMIZATION_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
                       "all": "ORT_ENABLE_ALL"}
# What observing does differently here (plainrun.py; shown when the plain run disagrees).
OBSERVING = ("every node output is fetched as a graph output, the graph run as segments; ONNX Runtime keeps a node "
             "whose output is a graph output out of its graph optimisations (fusions such as Conv+BatchNorm, "
             "Conv+Add, Gelu), so with optimisations on the observed run computes unfused kernels the plain run fuses")


def optimization_level() -> str:
    """ONNX Runtime's graph optimisation level for both runs: off unless LAYERDIFF_ORT_OPTIMIZATION asks
    (the golden computes each node as the ONNX graph defines it; an app's session optimises by default)."""
    import os

    wanted = os.environ.get(OPTIMIZATION_ENV, "disable").strip().lower() or "disable"
    if wanted not in OPTIMIZATION_LEVELS:
        raise HarnessExit(EXIT_ARGS, f"{OPTIMIZATION_ENV}={wanted!r}; use one of {', '.join(OPTIMIZATION_LEVELS)}")
    return OPTIMIZATION_LEVELS[wanted]


def create_session(model_bytes: bytes, args: HarnessArgs):
    ort = _ort()
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, optimization_level())
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False  # an arena keeps its peak; without it each group's memory is returned
    try:
        return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ORT raises its own Fail/InvalidGraph types
        raise HarnessExit(EXIT_MODEL, f"{args.models[0]}: ONNX Runtime cannot load this model ({_first_line(err)})") from None


def feeds_for(session, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each input in the element type the model declares (a float32 file for an int64 input is cast)."""
    declared = {i.name: i for i in session.get_inputs()}
    feeds = {}
    for name, array in inputs.items():
        if name not in declared:
            raise HarnessExit(EXIT_RUN, f"model has no input {name!r}; its inputs are {', '.join(sorted(declared))}")
        feeds[name] = np.asarray(array, dtype=_np_type(declared[name].type, array.dtype), order="C")
    missing = [n for n in declared if n not in feeds]
    if missing:
        raise HarnessExit(EXIT_RUN, f"no --input for model input(s) {', '.join(missing)}")
    return feeds


def _np_type(ort_type: str, fallback: np.dtype) -> np.dtype:
    names = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int64)": "int64",
             "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
             "tensor(float16)": "float16"}
    return np.dtype(names.get(ort_type, fallback))


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def run_once(session_for, feeds: dict, nodes: list[NodeOutputs], sink: DumpSink, budget: int) -> float:
    """Fetch every node's outputs a group at a time and dump them in graph order.

    Each group runs in a session whose graph outputs are that group only: ONNX Runtime keeps every
    graph output of a run alive to its end, so one session with all tensors as outputs would hold
    the whole dump. The first group is small; each next one is sized from the bytes the last one
    returned, so a group holds about `budget` bytes (a small model takes two sessions, a big one many).
    """
    names = [o for node in nodes for o in node.outputs]
    owner = {o: (node, k) for node in nodes for k, o in enumerate(node.outputs)}
    total, start, count = 0.0, 0, FIRST_GROUP
    while start < len(names):
        group = names[start : start + count]
        session = session_for(group)
        begin = now_ms()
        try:
            values = session.run(group, feeds)
        except Exception as err:  # noqa: BLE001 - ORT raises its own runtime error types
            raise HarnessExit(EXIT_RUN, f"ONNX Runtime failed to run the model ({_first_line(err)})") from None
        elapsed = now_ms() - begin
        total += elapsed
        del session
        fetched = sum(int(np.asarray(v).nbytes) for v in values)
        for index, name in enumerate(group):
            node, k = owner[name]
            array = np.asarray(values[index])
            values[index] = None  # dumped: let it go
            _dump(sink, node, k, name, array, elapsed / len(group))
        start += len(group)
        count = max(1, int(len(group) * budget / max(fetched, 1)))
    return total


def run(args: HarnessArgs) -> None:
    if args.backend != "cpu":
        raise HarnessExit(EXIT_BACKEND, f"the onnxruntime engine runs on the CPU only; use --backend cpu, not {args.backend}")
    if args.inject is not None:
        raise HarnessExit(EXIT_ARGS, "the onnxruntime engine does not isolate ops (--inject); it is the golden")
    inputs = load_inputs(args.inputs)
    model = load_model(args)
    nodes = dumped_nodes(model)
    outputs = [o.name for o in model.graph.output]  # read before with_outputs rewrites the graph's outputs

    def session_for(group: list[str]):
        return create_session(with_outputs(model, group).SerializeToString(), args)

    session = session_for([o for n in nodes for o in n.outputs][:1])
    feeds = feeds_for(session, inputs)
    header = base_header(args, engine_version(), inputs)
    header.update({"backends_actual": ["cpu"], "precision_effective": model_precision(model), "node_names": node_names(nodes),
                   "options": {"providers": session.get_providers(), "graph_optimization_level": optimization_level()}})
    whole_graph = segmentable(model)
    header["options"]["dump"] = "segments" if whole_graph else "output groups"
    for k, out in enumerate(repeat_dirs(args)):
        sink = DumpSink(args, out, {**header, "repeat": k}, total_ops=len(nodes))
        record_fed(sink, feeds)
        sink.watch(outputs)
        if whole_graph:
            elapsed = run_segments(model, feeds, lambda segment: create_session(segment.SerializeToString(), args),
                                   _dumper(nodes, sink), GROUP_BYTES)
        else:
            elapsed = run_once(session_for, feeds, nodes, sink, GROUP_BYTES)
        check = plainrun.check(out, {**header, "repeat": k}, sink.observed, plain_runner(args, outputs, feeds),
                               OBSERVING, now_ms)
        sink.close(elapsed, check)


def plain_runner(args: HarnessArgs, outputs: list[str], feeds: dict):
    """One run of the model as an app runs it per call: the unmodified model, its own outputs fetched. Its session
    is made at the first call, after the observed run, and goes with the check (no second copy of the weights
    held while the observed run's segments run)."""
    sessions: list = []

    def run_plain() -> dict[str, np.ndarray]:
        if not sessions:
            sessions.append(create_session(args.models[0].read_bytes(), args))
        return run_session(sessions[0], outputs, feeds)

    return run_plain


def run_session(session, outputs: list[str], feeds: dict) -> dict[str, np.ndarray]:
    """The model's outputs from one plain run."""
    try:
        return dict(zip(outputs, session.run(outputs, feeds)))
    except Exception as err:  # noqa: BLE001 - ORT raises its own runtime error types
        raise HarnessExit(EXIT_RUN, f"ONNX Runtime failed to run the model plainly ({_first_line(err)})") from None


def record_fed(sink: DumpSink, feeds: dict[str, np.ndarray]) -> None:
    """The arrays handed to `InferenceSession.run` (ONNX Runtime reads them in place, in the graph's
    own order and the element type the model declares): the dump's `input_fed` records."""
    for name, array in feeds.items():
        sink.fed(name, array, plain_layout(array.ndim))


def _dumper(nodes: list[NodeOutputs], sink: DumpSink):
    """What run_segments calls with each node output: dump it unless its node is not a layer (Constant)."""
    dumped = {node.outputs[0]: node for node in nodes}

    def on_tensor(node_proto, k: int, name: str, array: np.ndarray, ms: float) -> None:
        node = dumped.get(next((o for o in node_proto.output if o), ""))
        if node is not None:
            _dump(sink, node, node.outputs.index(name), name, array, ms)

    return on_tensor


def _dump(sink: DumpSink, node: NodeOutputs, k: int, name: str, array: np.ndarray, ms: float) -> None:
    """One node output into the dump (both ways of running the graph)."""
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)  # masks: compared as 0/1 values
    sink.add(op=node.op, op_type=node.op_type, array=array, output_index=k, name=name,
             inputs=node.inputs, layout=plain_layout(array.ndim), memory="host", time_ms=ms)


def main() -> int:
    return harness_main("onnxruntime", run, probe, engine_version)


if __name__ == "__main__":
    sys.exit(main())
