"""MNN on the host (pymnn), speaking the harness command line: the `local` device's MNN engine.

Per-op outputs come from `runSessionWithCallBackInfo`, copied to an NCHW host tensor inside the
callback (MNN reuses buffers). Graph edges are recovered from buffer addresses: an op's input is the
most recent output written at the same address. The PyPI wheel has only the CPU backend; asking for
OpenCL/Vulkan gives a run recorded with `backend_actual = cpu` (what MNN really did), never a CPU run
labelled as GPU.
"""
from __future__ import annotations

import ctypes
import platform
import re
import sys

import numpy as np

from collector.engines.mnn_model import MnnOps, read_mnn_ops
from collector.models import mnn_dtype, quiet_stdout
from collector.engines.harness_cli import (
    EXIT_ARGS,
    EXIT_MODEL,
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

BACKEND_NAMES = {"cpu": "CPU", "opencl": "OPENCL", "vulkan": "VULKAN"}
FORWARD_TYPES = {0: "cpu", 13: "cpu", 3: "opencl", 7: "vulkan", 1: "metal", 2: "cuda", 5: "nn", 6: "opengl"}
SESSION_INFO_BACKENDS = 2

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


FORWARD_CPU_EXTENSION = 13  # MNN_FORWARD_CPU_EXTENSION: the Arm82 backend, the CPU computing in fp16
_FEATURES: dict[str, int] = {}


def _mnn():
    with quiet_stdout() as printed:
        import MNN
    if printed and printed[0]:
        _FEATURES.update(cpu_features(printed[0]))
    return MNN


def cpu_features(banner: str) -> dict[str, int]:
    """MNN's own CPU report, "The device supports: i8sdot:1, fp16:1, ..." → {"i8sdot": 1, "fp16": 1, ...}."""
    match = re.search(r"device supports:(.*)", banner)
    if match is None:
        return {}
    return {name: int(value) for name, value in re.findall(r"(\w+):\s*(\d+)", match.group(1))}


def engine_version() -> str:
    return str(_mnn().version())


def probe() -> dict:
    _mnn()
    backends = {"cpu": {"ok": True, "fp16": bool(_FEATURES.get("fp16"))}}
    for name in ("opencl", "vulkan"):
        backends[name] = {"ok": False, "reason": "the MNN wheel from PyPI has no GPU backends (MNN falls back to CPU)"}
    abi = {"x86_64": "x86_64", "aarch64": "arm64-v8a"}.get(platform.machine(), platform.machine())
    return {"harness": "layerdiff-local-mnn", "version": "0.1.0", "abi": abi,
            "engines": {"mnn": {"version": engine_version(), "backends": backends}}}


def effective_precision(backend_code: int) -> str:
    """What MNN computed in, from the backend MNN says the session runs on (not from what was asked).

    On the CPU, MNN computes fp16 only in its Arm82 extension backend (forward type 13), which it
    picks at precision low when the core reports fp16:1; forward type 0 is its fp32 CPU backend,
    whatever precision was requested (x86, or an ARM core without fp16 such as the cortex-a53).
    MNN reports no precision for GPU backends (the PyPI wheel has none).
    """
    if backend_code == FORWARD_CPU_EXTENSION:
        return "fp16"
    if backend_code == 0:
        return "fp32"
    return "unknown (MNN reports no precision for this backend)"


def session_backend(interpreter, session) -> tuple[int, str]:
    """(MNN forward type code, our backend name) of a created session."""
    code = int(interpreter.getSessionInfo(session, SESSION_INFO_BACKENDS))
    return code, FORWARD_TYPES.get(code, f"type{code}")


def engine_options(code: int, args: HarnessArgs) -> dict:
    """What the dump header records about how MNN ran: its backend code and its CPU feature report."""
    return {"forward_type_code": code, "session_config": BACKEND_NAMES[args.backend],
            "precision_config": args.precision, "cpu_features": dict(_FEATURES)}


def _address(tensor) -> int:
    """The tensor's host buffer address (0 when it has none: e.g. an input no op reads)."""
    try:
        return _capsule_pointer(tensor.getHost(), None) or 0
    except ValueError:  # pymnn refuses to wrap a null host pointer
        return 0


def _host_copy(MNN, tensor) -> np.ndarray:
    """An op output as an NCHW numpy array of its own element type (int ops such as Shape stay int)."""
    shape = tuple(tensor.getShape())
    halide, _ = _host_type(MNN, tensor, np.empty(0))
    host = MNN.Tensor(shape, halide, MNN.Tensor_DimensionType_Caffe)
    tensor.copyToHostTensor(host)
    return np.array(host.getNumpyData(), copy=True).reshape(shape)


def create_session(MNN, args: HarnessArgs):
    model = args.models[0]
    try:
        with quiet_stdout():
            interpreter = MNN.Interpreter(str(model))
    except Exception:  # noqa: BLE001 - pymnn raises a bare Exception for unparsable files
        raise HarnessExit(EXIT_MODEL, f"{model}: MNN could not load this model (not a valid .mnn file?)") from None
    config = {"backend": BACKEND_NAMES[args.backend], "precision": args.precision, "numThread": args.threads}
    with quiet_stdout():
        session = interpreter.createSession(config)
    if session is None:
        raise HarnessExit(EXIT_MODEL, f"{model}: MNN could not create a session for this model")
    return interpreter, session


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
        host = MNN.Tensor(tuple(array.shape), halide, values, MNN.Tensor_DimensionType_Caffe)
        tensor.copyFrom(host)
        seeds[_address(tensor)] = name
    return seeds


def _host_type(MNN, tensor, array: np.ndarray):
    """The Halide type and values for the host tensor: the session input's own element type."""
    dtype = mnn_dtype(MNN, tensor)
    halide = {"int32": MNN.Halide_Type_Int, "int64": MNN.Halide_Type_Int64, "uint8": MNN.Halide_Type_Uint8,
              "float64": MNN.Halide_Type_Double}.get(dtype, MNN.Halide_Type_Float)
    return halide, np.asarray(array, dtype=dtype, order="C")


def graph_edges(model: str) -> dict[str, list[str]]:
    """The model's own edges: graph tensor → its non-constant input tensors (MNN Express graph)."""
    import MNN.expr as F

    try:
        graph = F.load_as_dict(model)
    except Exception:  # noqa: BLE001 - pymnn raises bare Exceptions; edges then come from addresses only
        return {}
    return {name: [v.name for v in var.inputs if v.name in graph and v.op_type != "Const"]
            for name, var in graph.items()}


def _dumped_name(tensor: str, known) -> str | None:
    """A graph tensor as the dump names it: ops are dumped by name, so `conv/relu` is op `conv`."""
    name = tensor
    while name:
        if name in known:
            return name
        name = name.rpartition("/")[0]
    return None


def op_inputs(op: str, edges: dict[str, list[str]], known: set[str], by_address: list[str]) -> list[str]:
    """An op's inputs from buffer addresses, corrected by the graph where addresses mislead.

    Addresses see what really ran, including MNN's runtime-only raster ops, so they are kept unless
    one names no producer or names a model op the graph says this op does not read (MNN computed
    in place or reused the memory); then the graph's own edges are used.
    """
    tensor = _graph_tensor(op, edges)
    if tensor is None:
        return by_address
    mapped = [name for t in edges[tensor] for name in _resolve(t, edges, known, depth=0)]
    if not mapped or not all(mapped):
        return by_address
    graph_inputs = set(mapped)
    misleading = [n for n in by_address
                  if n.startswith("<") or (n not in graph_inputs and _graph_tensor(n, edges) is not None)]
    return list(dict.fromkeys(mapped)) if misleading else by_address


def _graph_tensor(op: str, edges: dict[str, list[str]]) -> str | None:
    """The graph tensor an op writes (its name, or `<op>/<fused activation>`); None for runtime-only ops."""
    if op in edges:
        return op
    return next((t for t in edges if t.startswith(op + "/")), None)


def _resolve(tensor: str, edges: dict[str, list[str]], known: set[str], depth: int) -> list[str | None]:
    """Dumped names behind a graph tensor, looking through tensors MNN never dumps (layout converts)."""
    name = _dumped_name(tensor, known)
    if name is not None:
        return [name]
    if depth >= 4 or not edges.get(tensor):
        return [None]
    return [n for t in edges[tensor] for n in _resolve(t, edges, known, depth + 1)]


def run_once(MNN, interpreter, session, inputs, sink: DumpSink, memory: str, edges: dict[str, list[str]],
             ops: MnnOps, replace: dict[tuple[str, int], np.ndarray] | None = None) -> float:
    """One session run with every op output dumped; outputs in `replace` are overwritten first (what-if)."""
    producers = feed(MNN, interpreter, session, inputs)
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
                sink.add(op=dump_op, op_type=info.getType(), array=_host_copy(MNN, tensor), output_index=index,
                         name=name, inputs=pending.get(op, []), layout="NCHW", memory=memory, time_ms=elapsed)
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
    shape = tuple(tensor.getShape())
    if int(np.prod(shape)) != value.size:
        raise HarnessExit(EXIT_ARGS, f"--replace {name}: the injected tensor has shape {list(value.shape)}, "
                                     f"the op writes {list(shape)}")
    value = np.ascontiguousarray(value.reshape(shape), dtype=np.float32)
    tensor.copyFrom(MNN.Tensor(shape, MNN.Halide_Type_Float, value, MNN.Tensor_DimensionType_Caffe))


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
                                        "models with control flow (If/Loop) need MNN's Module API, which this engine does not use")
        address = _address(tensor)
        keys.used.add(name)
        sink.add(op=name, op_type="Output", array=_host_copy(MNN, tensor), output_index=0, name=name,
                 inputs=[producers[address]] if address in producers else [], layout="NCHW", memory=memory,
                 time_ms=0.0)


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


def isolate(MNN, args: HarnessArgs) -> None:
    """Each target op alone, as a sub-graph from its reference inputs to its output (MNN's path mode).

    The inject dump's header names every target's input tensors (`targets`), already traced back
    through MNN's runtime-only raster ops by the collector, since those are not graph tensors.
    """
    import MNN.expr as F
    import MNN.nn as nn

    injected = load_inject(args.inject)
    graph = F.load_as_dict(str(args.models[0]))
    config = {"backend": BACKEND_NAMES[args.backend], "precision": args.precision, "numThread": args.threads}
    runtime = nn.create_runtime_manager((config,))
    code, backend_actual = session_backend(*create_session(MNN, args))
    header = base_header(args, engine_version(), {})
    header.update({"backends_actual": [backend_actual], "precision_effective": effective_precision(code),
                   "options": engine_options(code, args), "mode": "isolate", "targets": args.targets})
    sink = DumpSink(args, args.out, header, total_ops=len(args.targets))
    total = 0.0
    for key in args.targets:
        op, index = split_key(key)
        output = graph_tensor(graph, op)
        names = cut_points(graph, output, injected, key)
        values = [injected_value(injected, n, key) for n in names]
        try:
            with quiet_stdout():
                module = nn.load_module_from_file(str(args.models[0]), names, [output], runtime_manager=runtime)
        except Exception:  # noqa: BLE001 - pymnn raises bare Exceptions for unknown tensor names
            raise HarnessExit(EXIT_ARGS, f"--target {key!r}: MNN cannot cut the graph at {names} -> {output!r}") from None
        feeds = [F.const(np.ascontiguousarray(v), list(v.shape), F.NCHW) for v in values]
        start = now_ms()
        outputs = module.forward(feeds)
        array = np.array(F.convert(outputs[0], F.NCHW).read(), dtype=np.float32, copy=True)
        elapsed = now_ms() - start
        total += elapsed
        sink.add(op=op, op_type="isolated", array=array, output_index=index, name=op, inputs=names,
                 layout="NCHW", memory="host", time_ms=elapsed)
    sink.close(total)


def graph_tensor(graph: dict, op: str) -> str:
    """The graph tensor an op writes: its own name, or `<op>/<activation>` when MNN fused one in."""
    if op in graph:
        return op
    fused = [name for name in graph if name.startswith(op + "/")]
    if len(fused) == 1:
        return fused[0]
    raise HarnessExit(EXIT_ARGS, f"--target {op!r}: no graph tensor of that op in the model (runtime-only ops such as rasters cannot be isolated)")


def cut_points(graph: dict, output: str, injected: dict[str, np.ndarray], key: str, depth: int = 0) -> list[str]:
    """Graph tensors to start the sub-graph at: the op's inputs, or for one the reference lacks (a
    layout conversion MNN inserted), the tensors behind it, so the conversion runs inside the cut."""
    names: list[str] = []
    for var in graph[output].inputs:
        if var.name not in graph or var.op_type == "Const":
            continue
        if _has_value(injected, var.name) or depth >= 3 or not graph[var.name].inputs:
            names.append(var.name)
        else:
            names.extend(cut_points(graph, var.name, injected, key, depth + 1))
    return list(dict.fromkeys(names))


def _has_value(injected: dict[str, np.ndarray], tensor: str) -> bool:
    return _dumped_name(tensor, injected) is not None


def injected_value(injected: dict[str, np.ndarray], tensor: str, key: str) -> np.ndarray:
    """A graph tensor's reference value: dumps name tensors by op, so `conv/relu` may be `conv`."""
    name = _dumped_name(tensor, injected)
    if name is not None:
        return injected[name]
    raise HarnessExit(EXIT_ARGS, f"--target {key!r}: the reference has no value for its input tensor {tensor!r} "
                                 "(produced by an op MNN replaced at run time); isolate the op that feeds it instead")


def run(args: HarnessArgs) -> None:
    MNN = _mnn()
    if args.inject is not None and not args.replace:
        if not args.targets:
            raise HarnessExit(EXIT_ARGS, "--inject needs at least one --target KEY")
        return isolate(MNN, args)
    inputs = load_inputs(args.inputs)
    if not inputs:
        raise HarnessExit(EXIT_RUN, "no --input given; pass --input NAME=FILE.npy")
    interpreter, session = create_session(MNN, args)
    backend_code, backend_actual = session_backend(interpreter, session)
    header = base_header(args, engine_version(), inputs)
    header.update({
        "backends_actual": [backend_actual],
        "precision_effective": effective_precision(backend_code),
        "options": engine_options(backend_code, args),
    })
    if backend_actual != args.backend:
        print(f"layerdiff-harness: MNN fell back from {args.backend} to {backend_actual}", file=sys.stderr)
    memory = "host" if backend_actual == "cpu" else "device"
    edges = graph_edges(str(args.models[0]))
    ops = read_mnn_ops(args.models[0])
    replace = replacements(args)
    if replace:
        header.update({"mode": "replace", "replaced": args.replace})
    for k, out in enumerate(repeat_dirs(args)):
        sink = DumpSink(args, out, {**header, "repeat": k}, total_ops=0)
        infer_ms = run_once(MNN, interpreter, session, inputs, sink, memory, edges, ops, dict(replace))
        sink.close(infer_ms)


def main() -> int:
    return harness_main("mnn", run, probe, engine_version)


if __name__ == "__main__":
    sys.exit(main())
