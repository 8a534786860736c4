"""MNN isolation (`--inject` with `--target`): each target op run alone on its reference inputs, by
cutting the model's graph with MNN's Module API (Express), not with a session.
"""
from __future__ import annotations

import numpy as np

from layerdiff.collector.engines.harness_cli import EXIT_ARGS, HarnessArgs, HarnessExit, DumpSink, base_header, load_inject, now_ms, split_key
from layerdiff.analyzer.formats.layouts import plain_layout
from layerdiff.collector.engines.mnn.edges import dumped_name
from layerdiff.collector.engines.mnn.session import (
    BACKEND_NAMES,
    create_session,
    effective_precision,
    engine_options,
    engine_version,
    session_backend,
)
from layerdiff.collector.engines.mnn.modelfile import quiet_stdout


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
    header.update({"backends_actual": [backend_actual], "precision_effective": effective_precision(code, args.precision),
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
                 layout=plain_layout(array.ndim), memory="host", time_ms=elapsed)
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
    return dumped_name(tensor, injected) is not None


def injected_value(injected: dict[str, np.ndarray], tensor: str, key: str) -> np.ndarray:
    """A graph tensor's reference value: dumps name tensors by op, so `conv/relu` may be `conv`."""
    name = dumped_name(tensor, injected)
    if name is not None:
        return injected[name]
    raise HarnessExit(EXIT_ARGS, f"--target {key!r}: the reference has no value for its input tensor {tensor!r} "
                                 "(produced by an op MNN replaced at run time); isolate the op that feeds it instead")
