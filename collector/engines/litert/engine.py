"""LiteRT (TensorFlow Lite) on the host, speaking the harness command line: `.tflite` on the `local` device.

Backends:
- `cpu`: the interpreter with every tensor kept (cpu.py); `--precision high` runs TFLite's builtin
  kernels, `normal`/`low` run XNNPACK (the default delegate apps get). Comparing high with normal
  is comparing without and with XNNPACK.
- `gpu`: the wheel's GPU accelerator (WebGPU over Vulkan, gpu.py), every activation made a model
  output; tensors it fuses away are listed in the header as not observable, never dumped as values.

Keys: an operator's tensors are dumped under the name of its first output tensor (`op`), output
`k` of the operator as `output_index` = k, the tensor's own name as `name`; edges are the
operator's non-weight inputs. Execution order and edges come from the model's flatbuffer (graph.py).
"""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import numpy as np

from layerdiff.vocabulary import host_abi
from layerdiff.analyzer.formats.layouts import plain_layout
from layerdiff.collector.engines.harness_cli import (
    EXIT_ARGS,
    EXIT_BACKEND,
    EXIT_MODEL,
    HARNESS_VERSION,
    DumpSink,
    HarnessArgs,
    HarnessExit,
    base_header,
    harness_main,
    load_inputs,
    now_ms,
    repeat_dirs,
)
from layerdiff.collector.engines import plainrun, unwritten
from layerdiff.vocabulary import Observability
from layerdiff.collector.engines.litert import ENGINE, cpu
from layerdiff.collector.engines.litert.graph import Graph, NotTflite, load_graph

BACKENDS = ENGINE.backends
# What observing does differently per backend (plainrun.py; shown when the plain run disagrees).
OBSERVING_CPU = ("the interpreter keeps every intermediate tensor (experimental_preserve_all_tensors: no arena buffer "
                 "is reused); the plain run is an interpreter without it, same kernels (builtin or XNNPACK)")
OBSERVING_GPU = ("every activation is made a model output of the GPU-compiled model, which changes how the accelerator "
                 "partitions and fuses the graph (a fused tensor is never written); the plain run compiles the model "
                 "with its own outputs only")

# Why each dumped tensor holds a value this run wrote (unwritten.py; the dump's `observability`).
WRITTEN_CPU = ("every activation buffer is filled with a sentinel before the run and kept (experimental_preserve_all_"
               "tensors: no arena buffer is reused); a tensor whose buffer no longer holds it was written in this run, "
               "one that holds it and a second sentinel after a second run is listed as never written")
WRITTEN_GPU = ("every output buffer is filled with a sentinel before each of two calibration runs with two different "
               "sentinels; a tensor whose buffer no longer holds it was written by the accelerator, one that still "
               "holds both is listed as never written")


def engine_version() -> str:
    import ai_edge_litert

    return str(ai_edge_litert.__version__)


def probe() -> dict:
    from layerdiff.collector.engines.litert import gpu

    not_here = {"ok": False, "reason": "LiteRT's GPU accelerator on the host is WebGPU over Vulkan: use --backend gpu"}
    backends = {"cpu": {"ok": True}, "gpu": gpu.availability(), "opencl": not_here, "vulkan": not_here}
    abi = host_abi()
    return {"harness": "layerdiff-local-litert", "version": HARNESS_VERSION, "abi": abi,
            "engines": {"litert": {"version": engine_version(), "backends": backends}}}


def load(args: HarnessArgs) -> tuple[bytes, Graph]:
    path = args.models[0]
    data = path.read_bytes()
    try:
        return data, load_graph(data, str(path))
    except NotTflite as err:
        raise HarnessExit(EXIT_MODEL, str(err)) from None


def tensor_labels(graph: Graph) -> dict[int, str]:
    """A unique dump name per activation (the tensor's own name; `#<index>` added to repeats)."""
    labels, seen = {}, set()
    for t in graph.activations():
        name = graph.name(t)
        labels[t] = name if name not in seen else f"{name}#{t}"
        seen.add(labels[t])
    return labels


def op_key(graph: Graph, op, labels: dict[int, str]) -> str:
    """An operator's dump name: its first activation output's name."""
    return next(labels[o] for o in op.outputs if o in labels)


def dump_array(sink: DumpSink, graph: Graph, labels: dict[int, str], op, k: int, t: int, array: np.ndarray,
               **extra) -> None:
    """One activation into the dump, as the harness contract spells it."""
    array = np.asarray(array)
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)  # masks: compared as 0/1 values
    inputs = [labels.get(i, graph.name(i)) for i in op.inputs if i not in graph.weights]
    sink.add(op=op_key(graph, op, labels), op_type=op.op_type, array=array, output_index=k, name=labels[t],
             inputs=inputs, layout="NHWC" if array.ndim == 4 else "", memory=extra.pop("memory", "host"), **extra)


def record_fed(sink: DumpSink, fed: list[tuple[str, np.ndarray]]) -> None:
    """Inputs as LiteRT holds them (its graph's own order: NHWC for images) into the dump's `input_fed`."""
    for name, array in fed:
        sink.fed(name, array, "NHWC" if array.ndim == 4 else plain_layout(array.ndim))


def run_cpu(args: HarnessArgs, graph: Graph, inputs: dict[str, np.ndarray]) -> None:
    interpreter, kernels, why = cpu.open_interpreter(str(args.models[0]), args.precision, args.threads, inputs)
    labels = tensor_labels(graph)
    header = base_header(args, engine_version(), inputs)
    options = {"kernels": kernels, "preserve_all_tensors": True, **graph_summary(graph)}
    if why:
        options["kernels_why"] = why
    header.update({"backends_actual": ["cpu"], "precision_effective": "fp32", "options": options,
                   "outputs": [labels[t] for t in graph.outputs if t in labels]})
    ops = graph.computing_ops()
    outputs = {t: labels[t] for t in graph.outputs if t in labels}
    plain: list = []  # the plain interpreter, made after the first observed run (one model in memory until then)

    def run_plain() -> dict[str, np.ndarray]:
        if not plain:
            plain.append(cpu.plain_interpreter(str(args.models[0]), kernels == "xnnpack", args.threads, inputs))
        return cpu.run_plain(plain[0], outputs)

    for k, out in enumerate(repeat_dirs(args)):
        sink = DumpSink(args, out, {**header, "repeat": k}, total_ops=len(ops))
        record_fed(sink, cpu.read_inputs(interpreter))
        sink.watch(outputs.values())
        cpu.fill_activations(interpreter, graph, 0)
        elapsed = cpu.invoke(interpreter)
        never = cpu.never_written(interpreter, graph)
        for op, index, t, array in cpu.read_activations(interpreter, graph):
            if t not in never:
                dump_array(sink, graph, labels, op, index, t, array)
        hidden = [unwritten.hidden(f"{op_key(graph, op, labels)}:{k}", labels[t], op.op_type, Observability.NEVER_WRITTEN,
                                   "sentinel") for op in ops for k, t in enumerate(op.outputs) if t in never]
        check = plainrun.check(out, {**header, "repeat": k}, sink.observed, run_plain, OBSERVING_CPU, now_ms)
        sink.close(elapsed, check, unwritten.checked("sentinel", WRITTEN_CPU, hidden, indirect=False), hidden)


def run_gpu(args: HarnessArgs, data: bytes, graph: Graph, inputs: dict[str, np.ndarray]) -> None:
    """Every activation as an output of the GPU-compiled model; tensors never written are listed, not dumped."""
    from layerdiff.collector.engines.litert import gpu

    icd, icd_why = gpu.vulkan_icd()
    if icd and not os.environ.get("VK_ICD_FILENAMES"):
        os.environ["VK_ICD_FILENAMES"] = icd  # read when the accelerator creates its Vulkan instance
    runner, placement, never, _log, varying = gpu.prepare(data, graph, args.precision, args.threads, inputs)
    labels = tensor_labels(graph)
    features = gpu.device_fp16(icd)
    effective, why = gpu.effective_precision(features, args.precision == "high")
    hidden = [unwritten.hidden(f"{op_key(graph, op, labels)}:{k}", labels[t], op.op_type, Observability.NEVER_WRITTEN,
                               "sentinel", "the GPU accelerator fused it into the next op")
              for op in graph.computing_ops() for k, t in enumerate(op.outputs) if t in labels and t in never]
    header = base_header(args, engine_version(), inputs)
    header.update({"backends_actual": ["gpu", "cpu"] if placement.split() else ["gpu"], "precision_effective": effective,
                   "not_observable": hidden, "outputs": [labels[t] for t in graph.outputs if t in labels],
                   "observability": unwritten.checked("sentinel", WRITTEN_GPU, hidden, indirect=True),
                   "options": {"accelerator": f"WebGPU over Vulkan ({gpu.ACCELERATOR})", "vulkan_icd": icd or "",
                               "vulkan_icd_why": icd_why, "enforce_f32": args.precision == "high",
                               "precision_why": why, "device_fp16": features, "placement": placement.as_dict(graph),
                               "run_to_run": run_to_run_summary(graph, labels, varying, never), **graph_summary(graph)}})
    ops = graph.computing_ops()
    on_cpu = placement.cpu_op_indices(graph)  # per tensor: `memory` host where the CPU computed it (FORMATS.md)
    outputs = {t: labels[t] for t in graph.outputs if t in labels}
    plain: list = []  # compiled after the first observed run: compiling a second model first changed the
    # observed graph's outputs on SwiftShader (mediapipe's pose detector, split graph)

    def run_plain() -> dict[str, np.ndarray]:
        if not plain:
            plain.append(gpu.GpuRunner(gpu.compile_model(data, args.precision, args.threads, []), graph, inputs))
        values = plain[0].run(0, [])[0]
        return {outputs[t]: values[t] for t in outputs if t in values}

    for r, out in enumerate(repeat_dirs(args)):
        values, elapsed = runner.run(0, [])
        sink = DumpSink(args, out, {**header, "repeat": r}, total_ops=len(ops))
        record_fed(sink, runner.read_inputs())
        sink.watch(outputs.values())
        for op in ops:
            for k, t in enumerate(op.outputs):
                if t in labels and t not in never:
                    dump_array(sink, graph, labels, op, k, t, values[t], memory="host" if op.index in on_cpu else "device")
        check = plainrun.check(out, {**header, "repeat": r}, sink.observed, run_plain, OBSERVING_GPU, now_ms)
        sink.close(elapsed, check)


def run_to_run_summary(graph: Graph, labels: dict[int, str], varying: dict[int, dict], never: set[int]) -> dict:
    """Two runs of the same input, compared tensor by tensor: how many dumped tensors differ, the first ones
    in execution order (a backend that is not reproducible gives one draw of its values per run)."""
    dumped = [(op, k, t) for op in graph.computing_ops() for k, t in enumerate(op.outputs) if t in labels and t not in never]
    differing = [{"key": f"{op_key(graph, op, labels)}:{k}", "name": labels[t], "op_type": op.op_type, **varying[t]}
                 for op, k, t in dumped if t in varying]
    return {"runs_compared": 2, "tensors_compared": len(dumped), "tensors_differing": len(differing),
            "first_differing": differing[:10]}


def graph_summary(graph: Graph) -> dict:
    """What the dump leaves out and why, for the provenance."""
    weight_ops = len(graph.ops) - len(graph.computing_ops())
    summary = {"ops": len(graph.ops), "weight_ops_not_dumped": weight_ops}
    if graph.subgraphs > 1:
        summary["subgraphs_not_dumped"] = graph.subgraphs - 1  # WHILE/IF bodies: only the main graph is dumped
    return summary


def run(args: HarnessArgs) -> None:
    """Run, and on failure let LiteRT's objects go (their destructors log) before the one-line error."""
    try:
        _run(args)
        return
    except HarnessExit as err:
        code, message = err.code, str(err)
    gc.collect()
    raise HarnessExit(code, message)


def _run(args: HarnessArgs) -> None:
    if args.backend not in BACKENDS:
        raise HarnessExit(EXIT_BACKEND, f"the litert engine runs on cpu or gpu (WebGPU), not {args.backend}")
    if args.inject is not None:
        raise HarnessExit(EXIT_ARGS, "the litert engine does not isolate ops (--inject)")
    inputs = load_inputs(args.inputs)
    data, graph = load(args)
    if args.backend == "cpu":
        run_cpu(args, graph, inputs)
    else:
        run_gpu(args, data, graph, inputs)


def main() -> int:
    return harness_main("litert", run, probe, engine_version, BACKENDS)


if __name__ == "__main__":
    # The accelerators' destructors log to stderr at interpreter exit: leaving at once keeps the
    # harness's own one-line error the last stderr line (the collector reports the last line).
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
