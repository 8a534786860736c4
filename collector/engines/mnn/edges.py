"""The edges of an MNN run (which dumped tensor each op read): buffer addresses, corrected by the
model's own graph (MNN Express) where addresses mislead (in-place work, memory reuse).
"""
from __future__ import annotations

def load_graph(model: str) -> dict:
    """The model's main graph as MNN Express variables by tensor name ({} when MNN cannot read it)."""
    import MNN.expr as F

    try:
        return F.load_as_dict(model)
    except Exception:  # noqa: BLE001 - pymnn raises bare Exceptions; edges then come from addresses only
        return {}


def graph_edges(graph: dict) -> dict[str, list[str]]:
    """The model's own edges: graph tensor → its non-constant input tensors (from `load_graph`)."""
    return {name: [v.name for v in var.inputs if v.name in graph and v.op_type != "Const"]
            for name, var in graph.items()}


def dumped_name(tensor: str, known) -> str | None:
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
    name = dumped_name(tensor, known)
    if name is not None:
        return [name]
    if depth >= 4 or not edges.get(tensor):
        return [None]
    return [n for t in edges[tensor] for n in _resolve(t, edges, known, depth + 1)]
