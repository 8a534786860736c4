"""Which operators LiteRT's GPU accelerator ran on the GPU and which it left to the CPU, op by op.

The accelerator logs only the operator types it rejects and two counts ("108 operations will run on
the GPU, and the remaining 183 operations will run on the CPU"). Its rule is TFLite's delegate
partitioning, so the per-op list is derived from it and then held against those counts:

1. every operator of a rejected type is a CPU operator;
2. the others are cut into independent subsets the way TFLite's `PartitionGraphIntoIndependentNodeSubsets`
   does: walking the operators in execution order, each subset takes every not yet placed operator
   whose inputs are ready and whose kind (accepted/rejected) is the subset's, the first ready
   operator choosing the kind;
3. only the largest accepted subset is delegated (the GPU delegate's `max_delegated_partitions` is 1);
   accepted operators in smaller subsets run on the CPU too.

On mediapipe 0.10.14's pose_detection.tflite (DENSIFY and DEQUANTIZE rejected) this gives the logged
108/183 exactly: the 182 weight-decoding operators and the first PAD (cut off from the rest by the
weights it precedes) on the CPU. When the derived counts do not equal the logged ones, no per-op list
is claimed: the dump says why instead.
"""
from __future__ import annotations

from layerdiff.collector.engines.litert.graph import Graph, Op


def partition(graph: Graph, rejected: set[str]) -> list[tuple[bool, list[Op]]]:
    """(accepted, operators) subsets in the order TFLite's partitioner builds them."""
    produced = {o for op in graph.ops for o in op.outputs}
    ready = {t for t in range(len(graph.tensor_names)) if t not in produced}  # model inputs and constants
    placed: set[int] = set()
    subsets: list[tuple[bool, list[Op]]] = []
    while len(placed) < len(graph.ops):
        kind: bool | None = None
        members: list[Op] = []
        for op in graph.ops:  # execution order is topological: one pass reaches every ready operator
            if op.index in placed or not all(i in ready for i in op.inputs):
                continue
            accepted = op.op_type not in rejected
            kind = accepted if kind is None else kind
            if accepted == kind:
                members.append(op)
                placed.add(op.index)
                ready.update(op.outputs)
        if not members:  # an operator whose input nothing produces: no subset can take it
            break
        subsets.append((bool(kind), members))
    return subsets


def per_op(graph: Graph, rejected: set[str], gpu_ops: int | None, cpu_ops: int | None) -> dict:
    """`{"derived": True, "rule", "cpu": [op index...]}` when the rule reproduces the logged counts, else why not."""
    if gpu_ops is None or cpu_ops is None:
        return {"derived": False, "why": "the accelerator logged no GPU/CPU operator counts to check a per-op list against"}
    accepted = [members for kind, members in partition(graph, rejected) if kind]
    delegated = {op.index for op in max(accepted, key=len, default=[])}
    cpu = [op.index for op in graph.ops if op.index not in delegated]
    if (len(delegated), len(cpu)) != (gpu_ops, cpu_ops):
        return {"derived": False,
                "why": f"TFLite's partition rule gives {len(delegated)} GPU / {len(cpu)} CPU operators, the accelerator "
                       f"logged {gpu_ops} / {cpu_ops}: which operators fell back is known only by type"}
    return {"derived": True, "cpu": cpu,
            "rule": "rejected types on the CPU; the rest cut into TFLite's independent subsets, the largest accepted "
                    "one on the GPU (max_delegated_partitions 1); reproduces the accelerator's logged counts"}
