"""Nodes a GPU run computed on the CPU by its engine's design, not by falling back.

Why: some engines keep a node on the CPU whatever backend runs the rest (llama.cpp's input layer, the
token-embedding lookup: its device is always the CPU, and a Vulkan run gives it pinned host memory,
`Vulkan_Host`), so every GPU run records `backend_actual` `vulkan+cpu`. Labelled `vulkan->vulkan+cpu` and
reported as a backend fallback, that reads as a GPU that gave up; it is a fallback only when any other node
ran on the CPU, and then it is still reported as one. Which nodes those are is a fact the engine declares
and the dump records (`engine_facts`, formats/enginefacts.py), with the output that shares the input
layer's table when a model ties them (Gemma 3 270M on lavapipe: `embd` and `result_output` in
`Vulkan_Host`, 815 of 817 nodes in `Vulkan0`). Where a node lived is read from its recorded layout's
buffer provenance, `<producer>/<type>@<buffer>` (analyzer/FORMATS.md, "Layouts").
"""
from __future__ import annotations

import re

from layerdiff.analyzer.formats.enginefacts import facts_of

_BUFFER = re.compile(r"[A-Za-z0-9_]+/[^@\s/]+@([^)\s]+)")  # `<producer>/f32@Vulkan_Host`, also inside `rotated basis (...)`
GPU_BACKENDS = ("vulkan", "opencl")
_DECORATION = re.compile(r"(?:#\d+| \([a-z ]+\))+$")  # an engine's ` (view)`, layerdiff's `#1` for reused names
TIED = "tied output"


def node_buffer(layout: object) -> str | None:
    """The backend buffer a node's output lived in (`Vulkan0`, `Vulkan_Host`, `CPU`), when its layout records one."""
    found = _BUFFER.search(str(layout))
    return found.group(1) if found else None


def _host_buffer(layout: str) -> bool:
    """`.../f32@Vulkan_Host`, `.../f32@CPU`: a node whose output lived in CPU memory."""
    buffer = (node_buffer(layout) or "").lower()
    return buffer == "cpu" or buffer.endswith("_host")


def tied_outputs(attrs: dict, nodes: list[str]) -> list[str]:
    """Of `nodes`, those that are the engine's declared tied output (computed with the input layer's table)."""
    tied = facts_of(attrs).cpu_by_design.tied_output
    return [n for n in nodes if tied and n.startswith(tied)]


def cpu_by_design(attrs: dict, layers) -> list[str]:
    """The nodes a GPU run computed on the CPU when every one of them is a node its engine declares it always
    computes there; [] for any other run (an engine declaring none, a CPU run, or a GPU run with other nodes
    on the CPU: a fallback)."""
    design = facts_of(attrs).cpu_by_design
    requested = str(attrs.get("backend_requested") or "")
    actual = set(str(attrs.get("backend_actual") or "").split("+"))
    if not design.nodes or requested not in GPU_BACKENDS or actual != {requested, "cpu"}:
        return []
    if layers is None or "layout" not in layers or "key" not in layers:
        return []
    inputs = layers["inputs"] if "inputs" in layers else [""] * len(layers["key"])
    on_cpu, names = [], set()
    for key, layout, feeds in zip(layers["key"], layers["layout"], inputs):
        if _host_buffer(str(layout)):
            on_cpu.append(str(key))
            name = _DECORATION.sub("", str(key).rsplit(":", 1)[0])
            tied = design.tied_output and name == design.tied_output and design.tied_table in str(feeds)
            names.add(TIED if tied else name)
    return on_cpu if on_cpu and names <= set(design.nodes) | {TIED} else []
