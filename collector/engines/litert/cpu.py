"""LiteRT's CPU interpreter with every activation kept: with or without XNNPACK.

`experimental_preserve_all_tensors=True` keeps every intermediate tensor readable after `invoke()`
(the public Interpreter API), so one run gives the whole dump. Which kernels run is chosen by the
op resolver: `BUILTIN_WITHOUT_DEFAULT_DELEGATES` gives TFLite's own builtin kernels (no XNNPACK),
`BUILTIN` applies XNNPACK, the default delegate every app gets. Precision selects it (README):
high = builtin kernels, normal and low = XNNPACK (fp32 here: the Python API exposes no fp16 flag).
A model whose custom ops only XNNPACK implements (mediapipe's `Convolution2DTransposeBias`) runs on
XNNPACK at high too, said on stderr and recorded in the dump's options (`kernels`, `kernels_why`).
"""
from __future__ import annotations

import sys
import warnings

import numpy as np

from layerdiff.collector.engines import unwritten
from layerdiff.collector.engines.harness_cli import EXIT_MODEL, EXIT_RUN, HarnessExit, now_ms
from layerdiff.collector.engines.litert.graph import Graph

XNNPACK_PRECISIONS = ("normal", "low")


def uses_xnnpack(precision: str) -> bool:
    """Whether a CPU run at this precision applies XNNPACK (the documented precision mapping)."""
    return precision in XNNPACK_PRECISIONS


def open_interpreter(model_path: str, precision: str, threads: int, inputs: dict[str, np.ndarray]):
    """(interpreter with inputs set, kernels used, why) on builtin kernels (high) or XNNPACK (normal, low).

    Builtin kernels that cannot resolve a custom op give way to XNNPACK, which implements
    MediaPipe's custom ops; the reason is returned so the dump records it (never silent)."""
    xnnpack = uses_xnnpack(precision)
    interpreter = make_interpreter(model_path, xnnpack, threads)
    try:
        feed(interpreter, inputs)
        return interpreter, "xnnpack" if xnnpack else "builtin", ""
    except HarnessExit as err:
        if xnnpack or "unresolved custom op" not in str(err):
            raise
        why = f"builtin kernels cannot run it ({str(err).partition('(')[2].rstrip(')')}); XNNPACK implements it"
    print(f"layerdiff-harness: litert: running on XNNPACK: {why}", file=sys.stderr)
    interpreter = make_interpreter(model_path, True, threads)
    feed(interpreter, inputs)
    return interpreter, "xnnpack", why


def make_interpreter(model_path: str, xnnpack: bool, threads: int):
    """An interpreter that keeps every tensor, with or without XNNPACK."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.BUILTIN if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "preserve_all_tensors is for debugging": it is what we do
            return Interpreter(model_path=model_path, num_threads=threads, experimental_preserve_all_tensors=True,
                               experimental_op_resolver_type=resolver)
    except (ValueError, RuntimeError) as err:
        raise HarnessExit(EXIT_MODEL, f"{model_path}: LiteRT cannot load this model ({first_line(err)})") from None


def first_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else type(err).__name__


def feed(interpreter, inputs: dict[str, np.ndarray]) -> None:
    """Set every model input (resized when the file gives another shape, cast to the declared type)."""
    details = {d["name"]: d for d in interpreter.get_input_details()}
    unknown = [n for n in inputs if n not in details]
    if unknown:
        raise HarnessExit(EXIT_RUN, f"model has no input {unknown[0]!r}; its inputs are {', '.join(details)}")
    missing = [n for n in details if n not in inputs]
    if missing:
        raise HarnessExit(EXIT_RUN, f"no --input for model input(s) {', '.join(missing)}")
    resized = False
    for name, array in inputs.items():
        if list(array.shape) != [int(d) for d in details[name]["shape"]]:
            try:
                interpreter.resize_tensor_input(details[name]["index"], list(array.shape), strict=True)
            except (ValueError, RuntimeError) as err:
                raise HarnessExit(EXIT_RUN, f"input {name}: shape {list(array.shape)} does not fit the model "
                                            f"({list(details[name]['shape'])}): {first_line(err)}") from None
            resized = True
    try:
        interpreter.allocate_tensors()
    except RuntimeError as err:
        raise HarnessExit(EXIT_RUN, f"LiteRT cannot allocate the model's tensors ({first_line(err)})") from None
    if resized:
        details = {d["name"]: d for d in interpreter.get_input_details()}
    for name, array in inputs.items():
        interpreter.set_tensor(details[name]["index"], np.asarray(array, dtype=details[name]["dtype"]))


def read_inputs(interpreter) -> list[tuple[str, np.ndarray]]:
    """Each model input read back from the interpreter's own input tensor after `set_tensor`: the
    values LiteRT computes on (the dump's `input_fed` records)."""
    return [(d["name"], np.array(interpreter.get_tensor(d["index"]), copy=True))
            for d in interpreter.get_input_details()]


def invoke(interpreter) -> float:
    begin = now_ms()
    try:
        interpreter.invoke()
    except (RuntimeError, ValueError) as err:
        raise HarnessExit(EXIT_RUN, f"LiteRT failed to run the model ({first_line(err)})") from None
    return now_ms() - begin


# Operators whose output depends on their input's shape alone: TFLite computes it when the model is prepared and
# never again in a run (a persistent tensor), as it does for every operator fed only by such tensors and weights.
SHAPE_OPS = frozenset({"SHAPE", "RANK", "SIZE"})


def prepared_tensors(graph: Graph) -> set[int]:
    """Activations TFLite may compute once, when the model is prepared, and not in a run: outputs of the
    shape operators and of every operator fed only by them and weights. A sentinel written into one would
    stay there and reach every consumer, so they are never filled (their values are the prepared ones)."""
    prepared: set[int] = set()
    for op in graph.computing_ops():
        inputs = [i for i in op.inputs if i >= 0 and i not in graph.weights]
        if op.op_type in SHAPE_OPS or (inputs and all(i in prepared for i in inputs)):
            prepared.update(op.outputs)
    return prepared


def fill_activations(interpreter, graph: Graph, index: int, only: set[int] | None = None) -> None:
    """Every activation buffer (or those in `only`) filled with sentinel `index` before a run (unwritten.py): a
    buffer the run leaves holding it was never written. Weights, the tensors derived from weights alone and
    the ones computed when the model is prepared (`prepared_tensors`) are left as they are."""
    skip = prepared_tensors(graph)
    for op in graph.computing_ops():
        for t in op.outputs:
            if t in graph.weights or t in skip or (only is not None and t not in only):
                continue
            _fill_one(interpreter, t, index)


def _fill_one(interpreter, t: int, index: int) -> None:
    """One tensor's buffer filled; the view into it is released before the function returns (LiteRT refuses
    to run while Python holds a view into its buffers). A scalar has no writable view: it is set instead. A
    tensor without a buffer yet (a dynamic shape: the run allocates it when its operator runs) is left alone."""
    try:
        view = interpreter.tensor(t)()
    except ValueError:
        return
    if isinstance(view, np.ndarray) and view.ndim and view.size:
        view[...] = unwritten.fill(view.dtype, view.shape, index)
        return
    value = np.asarray(view)
    del view
    try:
        interpreter.set_tensor(t, unwritten.fill(value.dtype, value.shape, index))
    except ValueError:
        pass  # a tensor LiteRT does not let us set is left unfilled (and read as the run left it)


def never_written(interpreter, graph: Graph) -> set[int]:
    """The activations of a run filled with sentinel 0 that still hold it and still hold sentinel 1 after a second
    run filled with it: never written. The second run happens only when the first left a candidate. Each
    tensor is looked at through a view released at once (no copy of the activations is kept)."""
    skip = prepared_tensors(graph)  # never filled
    left = {t for t in graph.activations() if t not in skip and _holds_fill(interpreter, t, 0)}
    if not left:
        return set()
    fill_activations(interpreter, graph, 1, only=left)
    invoke(interpreter)
    return {t for t in left if _holds_fill(interpreter, t, 1)}


def _holds_fill(interpreter, t: int, index: int) -> bool:
    try:
        view = interpreter.tensor(t)()
    except ValueError:
        return False  # no buffer: nothing was filled
    array = np.asarray(view)
    return bool(array.size) and bool(np.all(unwritten.is_fill(array, index)))


def read_activations(interpreter, graph: Graph):
    """(op, k, tensor index, array) for every activation, in execution order; weights never."""
    for op in graph.computing_ops():
        for k, t in enumerate(op.outputs):
            if t in graph.weights:
                continue
            yield op, k, t, interpreter.get_tensor(t)


def plain_interpreter(model_path: str, xnnpack: bool, threads: int, inputs: dict[str, np.ndarray]):
    """The model as an app loads it: no tensor preserved, the same kernels as the observed run, inputs set."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.BUILTIN if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    try:
        interpreter = Interpreter(model_path=model_path, num_threads=threads, experimental_op_resolver_type=resolver)
    except (ValueError, RuntimeError) as err:
        raise HarnessExit(EXIT_MODEL, f"{model_path}: LiteRT cannot load this model ({first_line(err)})") from None
    feed(interpreter, inputs)
    return interpreter


def run_plain(interpreter, outputs: dict[int, str]) -> dict[str, np.ndarray]:
    """One plain run: invoke, then read only the model's outputs (tensor index -> dump name)."""
    invoke(interpreter)
    return {name: np.array(interpreter.get_tensor(t), copy=True) for t, name in outputs.items()}
