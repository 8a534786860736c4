"""MNN on the host (pymnn), speaking the harness command line: the `local` device's MNN engine.

Per-op outputs come from `runSessionWithCallBackInfo`, copied to an NCHW host tensor inside the
callback (MNN reuses buffers). Graph edges are recovered from buffer addresses: an op's input is the
most recent output written at the same address (corrected by the graph: mnn_edges.py). Sessions and
what MNN reports about them are in mnn_session.py, isolation in mnn_isolate.py. The PyPI wheel has
only the CPU backend; asking for OpenCL/Vulkan gives a run recorded with `backend_actual = cpu`
(what MNN really did), never a CPU run labelled as GPU.
"""
from __future__ import annotations

import ctypes
import sys

import numpy as np

from layerdiff.vocabulary import host_abi
from layerdiff.collector.engines.mnn.edges import graph_edges, load_graph, op_inputs
from layerdiff.collector.engines.mnn.isolate import isolate
from layerdiff.collector.engines.mnn.model import MnnOps, read_mnn_ops
from layerdiff.collector.engines.mnn.module import control_flow_ops, module_options, run_module
from layerdiff.collector.engines.mnn.tensorformat import dimension_format
from layerdiff.analyzer.formats.layouts import plain_layout
from layerdiff.collector.engines.mnn.session import (
    FEATURES,
    create_session,
    effective_precision,
    engine_options,
    engine_version,
    mnn_module,
    session_backend,
)
from layerdiff.collector.engines.mnn.modelfile import mnn_dtype
from layerdiff.collector.engines.harness_cli import (
    HARNESS_VERSION,
    reuse,
    EXIT_ARGS,
    EXIT_RUN,
    DumpSink,
    HarnessArgs,
    HarnessExit,
    base_header,
    load_inject,
    split_key,
    harness_main,
    load_inputs,
    now_ms,
    repeat_dirs,
)

from layerdiff.collector.engines import plainrun

# What observing does differently here (plainrun.py; shown when the plain run disagrees).
OBSERVING = ("the session runs through runSessionWithCallBackInfo, every op's output copied to the host inside the "
             "after-callback; the plain run is runSession without callbacks, as an app runs it")

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def probe() -> dict:
    mnn_module()
    backends = {"cpu": {"ok": True, "fp16": bool(FEATURES.get("fp16"))}}
    for name in ("opencl", "vulkan"):
        backends[name] = {"ok": False, "reason": "the MNN wheel from PyPI has no GPU backend: the run would fall back "
                                                 "to the CPU and repeat --backend cpu (phones run it with the C++ harness)"}
    abi = host_abi()
    return {"harness": "layerdiff-local-mnn", "version": HARNESS_VERSION, "abi": abi,
            "engines": {"mnn": {"version": engine_version(), "backends": backends}}}


def _address(tensor) -> int:
    """The tensor's host buffer address (0 when it has none: e.g. an input no op reads)."""
    try:
        return _capsule_pointer(tensor.getHost(), None) or 0
    except ValueError:  # pymnn refuses to wrap a null host pointer
        return 0


def written_layout(tensor, array: np.ndarray, own_order: bool = False) -> str:
    """The layout of the bytes dumped, with MNN's own format of the tensor beside it when it can be read:
    `NCW (MNN NC4HW4)`. Outputs are dumped in the graph's NCHW order (`_host_copy` has MNN convert from its
    own format, as the C++ harness does); an input read back in its own order (`own_order`) of a tensor MNN
    holds channels-last (a TFLite graph's) is named `NHWC`, as LiteRT and the user's array name it."""
    held = dimension_format(tensor)
    channels_last = own_order and array.ndim == 4 and _channels_last(tensor)
    order = "NHWC" if channels_last else plain_layout(array.ndim)
    return f"{order} (MNN {held})" if held else order


def _channels_last(tensor) -> bool:
    """MNN holds the tensor as NHWC (Tensorflow dimension type): TFLite-origin inputs and outputs."""
    import MNN

    return tensor.getDimensionType() == MNN.Tensor_DimensionType_Tensorflow


def _host_dimension_type(MNN, tensor):
    """The host tensor's dimension type for copies in and out: the session tensor's own order of its
    shape. `getShape()` of a channels-last tensor is NHWC, so a CAFFE host of that shape would have
    MNN transpose the values between NCHW and NHWC under the same dimensions (a scrambled image);
    NC4HW4 tensors report NCHW shapes and are copied through a CAFFE (NCHW) host."""
    if tensor.getDimensionType() == MNN.Tensor_DimensionType_Tensorflow:
        return MNN.Tensor_DimensionType_Tensorflow
    return MNN.Tensor_DimensionType_Caffe


def caffe_shape(shape: tuple[int, ...], channels_last: bool) -> tuple[int, ...]:
    """The shape of MNN's NCHW (CAFFE) copy of a tensor: a tensor MNN holds channels-last (NHWC) of
    rank 4 or more is copied with its last axis moved to axis 1, as MNN's own `Tensor(t, CAFFE)` does
    (the C++ harness' copy); labelling the NCHW bytes with the NHWC dims would scramble them."""
    if not channels_last or len(shape) < 4:
        return shape
    return (shape[0], shape[-1], *shape[1:-1])


def _host_copy(MNN, tensor, own_order: bool = False) -> np.ndarray:
    """An op output as an NCHW numpy array of its own element type (int ops such as Shape stay int), as
    the C++ harness copies it; with `own_order` (a fed input read back) in the order of its own shape."""
    channels_last = tensor.getDimensionType() == MNN.Tensor_DimensionType_Tensorflow
    # below rank 4 a channels-last tensor's own shape is the graph's order ([1, 2016, 18] of a TFLite
    # detector head); a CAFFE copy would move its last axis to axis 1 under the same dims (as the C++ harness,
    # which copies every channels-last tensor in its own order, does not)
    own = own_order or (channels_last and len(tensor.getShape()) < 4)
    shape = tuple(tensor.getShape()) if own else caffe_shape(tuple(tensor.getShape()), channels_last)
    kind = _host_dimension_type(MNN, tensor) if own else MNN.Tensor_DimensionType_Caffe
    halide, _ = _host_type(MNN, tensor, np.empty(0))
    host = MNN.Tensor(shape, halide, kind)
    tensor.copyToHostTensor(host)
    return np.array(host.getNumpyData(), copy=True).reshape(shape)


def feed(MNN, interpreter, session, inputs: dict[str, np.ndarray]) -> dict[int, str]:
    """Copy inputs into the session; returns input buffer addresses → input names (edge seeds)."""
    known = interpreter.getSessionInputAll(session)
    seeds = {}
    resized = False
    for name, array in inputs.items():
        if name not in known:
            raise HarnessExit(EXIT_RUN, f"model has no input {name!r}; its inputs are {', '.join(sorted(known))}")
        tensor = known[name]
        expected = tuple(tensor.getShape())
        if tuple(array.shape) != expected:
            # same rank: MNN resizes (dynamic dims, and dims its converter froze to 1, e.g. [seq, 576] -> [1, 576])
            if array.ndim != len(expected) or array.ndim == 0:
                raise HarnessExit(EXIT_RUN, f"input {name!r} has shape {list(array.shape)}, model expects {list(expected)}")
            interpreter.resizeTensor(tensor, tuple(array.shape))
            resized = True
    if resized:
        interpreter.resizeSession(session)
    for name, array in inputs.items():
        tensor = interpreter.getSessionInput(session, name)
        halide, values = _host_type(MNN, tensor, array)
        host = MNN.Tensor(tuple(array.shape), halide, values, _host_dimension_type(MNN, tensor))
        tensor.copyFrom(host)
        seeds[_address(tensor)] = name
    return seeds


def record_fed(MNN, interpreter, session, names, sink: DumpSink) -> None:
    """Read each input back from the session's own input tensor after feeding, the way outputs are
    read, and record it in the dump (`input_fed`): the bytes MNN computes on, in its shape's order."""
    for name in names:
        tensor = interpreter.getSessionInput(session, name)
        array = _host_copy(MNN, tensor, own_order=True)
        sink.fed(name, array, written_layout(tensor, array, own_order=True))


def _host_type(MNN, tensor, array: np.ndarray):
    """The Halide type and values for the host tensor: the session input's own element type."""
    dtype = mnn_dtype(MNN, tensor)
    halide = {"int32": MNN.Halide_Type_Int, "int64": MNN.Halide_Type_Int64, "uint8": MNN.Halide_Type_Uint8,
              "float64": MNN.Halide_Type_Double}.get(dtype, MNN.Halide_Type_Float)
    return halide, np.asarray(array, dtype=dtype, order="C")


def run_once(MNN, interpreter, session, inputs, sink: DumpSink, memory: str, edges: dict[str, list[str]],
             ops: MnnOps, replace: dict[tuple[str, int], np.ndarray] | None = None) -> float:
    """One session run with every op output dumped; outputs in `replace` are overwritten first (what-if)."""
    producers = feed(MNN, interpreter, session, inputs)
    record_fed(MNN, interpreter, session, inputs, sink)
    keys = DumpKeys(ops)
    replace = replace or {}
    known = set(inputs)
    pending: dict[str, list[str]] = {}
    failure: list[str] = []
    clock = {"start": 0.0, "total": 0.0}

    def before(tensors, info) -> bool:
        op = info.getName()
        by_address = [producers.get(_address(t), f"<{op} input {i}>") for i, t in enumerate(tensors)]
        pending[op] = op_inputs(keys.graph_op(op), edges, known, by_address)
        clock["start"] = now_ms()
        return True

    def after(tensors, info) -> bool:
        elapsed = now_ms() - clock["start"]
        clock["total"] += elapsed
        op = info.getName()
        try:
            for index, tensor in enumerate(tensors):
                shape = tuple(tensor.getShape())
                if shape and int(np.prod(shape)) <= 0:
                    continue
                address = _address(tensor)
                dump_op, name = keys.key(op, index)
                if (dump_op, index) in replace:
                    _overwrite(MNN, tensor, replace.pop((dump_op, index)), name)
                array = _host_copy(MNN, tensor)
                sink.add(op=dump_op, op_type=info.getType(), array=array, output_index=index, name=name,
                         inputs=pending.get(op, []), layout=written_layout(tensor, array), memory=memory,
                         time_ms=elapsed)
                producers[address] = name
                known.add(name)
        except HarnessExit as exc:
            failure.append(str(exc))
            return False
        return True

    interpreter.runSessionWithCallBackInfo(session, before, after)
    if failure:
        raise HarnessExit(EXIT_RUN, failure[0])
    if replace:
        op, index = next(iter(replace))
        raise HarnessExit(EXIT_ARGS, f"--replace {op}:{index}: no op of the model wrote that output")
    dump_outputs(MNN, interpreter.getSessionOutputAll(session), keys, producers, sink, memory)
    return clock["total"]


def _overwrite(MNN, tensor, value: np.ndarray, name: str) -> None:
    """Write a reference value into an op's output inside the after-callback, so later ops read it."""
    channels_last = tensor.getDimensionType() == MNN.Tensor_DimensionType_Tensorflow
    own = channels_last and len(tensor.getShape()) < 4  # dumped in its own order (_host_copy)
    shape = tuple(tensor.getShape()) if own else caffe_shape(tuple(tensor.getShape()), channels_last)
    if int(np.prod(shape)) != value.size:
        raise HarnessExit(EXIT_ARGS, f"--replace {name}: the injected tensor has shape {list(value.shape)}, "
                                     f"the op writes {list(shape)}")
    value = np.ascontiguousarray(value.reshape(shape), dtype=np.float32)
    kind = MNN.Tensor_DimensionType_Tensorflow if own else MNN.Tensor_DimensionType_Caffe  # values under their own dims
    tensor.copyFrom(MNN.Tensor(shape, MNN.Halide_Type_Float, value, kind))


def replacements(args: HarnessArgs) -> dict[tuple[str, int], np.ndarray]:
    """`--replace KEY` values from the `--inject` dump, found by the tensor name the dump gives that output."""
    if not args.replace:
        return {}
    injected = load_inject(args.inject)
    out = {}
    for key in args.replace:
        op, index = split_key(key)
        name = op if index == 0 else f"{op}:{index}"
        if name not in injected:
            raise HarnessExit(EXIT_ARGS, f"--replace {key!r}: the inject dump has no tensor {name!r}")
        out[(op, index)] = injected[name]
    return out


def dump_outputs(MNN, outputs: dict, keys: DumpKeys, producers: dict[int, str], sink: DumpSink, memory: str) -> None:
    """The model's outputs under their own names, when no model op was keyed by them: MNN often writes
    an output through a runtime raster (a layout conversion) that alignment sets aside as engine-made.
    Read after the run, they are the values the model returns; the producer is the last op that wrote
    the output's buffer."""
    for name, tensor in outputs.items():
        if name in keys.used:
            continue
        shape = tuple(tensor.getShape())
        if shape and int(np.prod(shape)) <= 0:
            raise HarnessExit(EXIT_RUN, f"MNN computed no value for model output {name!r} (shape {list(shape)}); "
                                        "the session ran no op that writes it")
        address = _address(tensor)
        keys.used.add(name)
        array = _host_copy(MNN, tensor)
        sink.add(op=name, op_type="Output", array=array, output_index=0, name=name,
                 inputs=[producers[address]] if address in producers else [], layout=written_layout(tensor, array),
                 memory=memory, time_ms=0.0)


class DumpKeys:
    """How each op output is keyed in the dump (HARNESS_CLI.md): by the tensor the op writes.

    Ops MNN adds at run time (rasters) keep their own names. A name already used gets `#k` appended.
    """

    def __init__(self, ops: MnnOps) -> None:
        self.ops = ops
        self.used: set[str] = set()

    def graph_op(self, op: str) -> str:
        keyed = self.ops.key(op, 0)
        return keyed[0] if keyed else op

    def key(self, op: str, index: int) -> tuple[str, str]:
        dump_op, name = self.ops.key(op, index) or (op, op if index == 0 else f"{op}:{index}")
        if name in self.used:
            k = 1
            while f"{name}#{k}" in self.used:
                k += 1
            name = f"{name}#{k}"
            dump_op = name if index == 0 else dump_op
        self.used.add(name)
        return dump_op, name


def run(args: HarnessArgs) -> None:
    MNN = mnn_module()
    if args.inject is not None and not args.replace:
        if not args.targets:
            raise HarnessExit(EXIT_ARGS, "--inject needs at least one --target KEY")
        return isolate(MNN, args)
    inputs = load_inputs(args.inputs)
    if not inputs:
        raise HarnessExit(EXIT_RUN, "no --input given; pass --input NAME=FILE.npy")
    interpreter, session = reuse(("mnn", str(args.models[0]), args.backend, args.precision, args.threads),
                                 lambda: create_session(MNN, args))  # once per process for every --each input
    backend_code, backend_actual = session_backend(interpreter, session)
    header = base_header(args, engine_version(), inputs)
    header.update({
        "backends_actual": [backend_actual],
        "precision_effective": effective_precision(backend_code, args.precision),
        "options": engine_options(backend_code, args),
        "outputs": [str(name) for name in interpreter.getSessionOutputAll(session)],
    })
    if backend_actual != args.backend:
        print(f"layerdiff-harness: MNN fell back from {args.backend} to {backend_actual}", file=sys.stderr)
    memory = "host" if backend_actual == "cpu" else "device"
    graph = load_graph(str(args.models[0]))
    if control_flow_ops(graph):
        return _run_modules(args, graph, inputs, header, memory)
    edges = graph_edges(graph)
    ops = read_mnn_ops(args.models[0])
    replace = replacements(args)
    if replace:
        header.update({"mode": "replace", "replaced": args.replace})
    outputs = list(interpreter.getSessionOutputAll(session))
    for k, out in enumerate(repeat_dirs(args)):
        sink = DumpSink(args, out, {**header, "repeat": k}, total_ops=0)
        sink.watch(outputs)
        infer_ms = run_once(MNN, interpreter, session, inputs, sink, memory, edges, ops, dict(replace))
        check = None if replace else plainrun.check(out, {**header, "repeat": k}, sink.observed,
                                                    lambda: run_plain(MNN, interpreter, session, inputs), OBSERVING, now_ms)
        sink.close(infer_ms, check)


def run_plain(MNN, interpreter, session, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One run as an app runs it: the inputs fed, runSession without callbacks, the outputs read."""
    feed(MNN, interpreter, session, inputs)
    status = interpreter.runSession(session)
    if status not in (0, None):
        raise HarnessExit(EXIT_RUN, f"MNN's plain run (runSession) failed with status {status}")
    return {name: _host_copy(MNN, tensor) for name, tensor in interpreter.getSessionOutputAll(session).items()}


def _run_modules(args: HarnessArgs, graph: dict, inputs: dict[str, np.ndarray], header: dict, memory: str) -> None:
    """A model with If/Loop: every main-graph tensor through MNN's Module API (module.py says what is not dumped)."""
    if args.replace:
        raise HarnessExit(EXIT_ARGS, "--replace needs MNN's session API, which cannot run models with control flow (If/Loop)")
    header["options"].update(module_options())
    header["control_flow"] = control_flow_ops(graph)
    for k, out in enumerate(repeat_dirs(args)):
        sink = DumpSink(args, out, {**header, "repeat": k}, total_ops=len(graph))
        sink.close(run_module(args, graph, inputs, sink, memory))


def main() -> int:
    return harness_main("mnn", run, probe, engine_version)


if __name__ == "__main__":
    sys.exit(main())
