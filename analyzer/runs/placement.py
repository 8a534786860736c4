"""Nodes a GPU run computed on the CPU by its engine's design, not by falling back.

Why: llama.cpp keeps a model's input layer (the token-embedding lookup, node `embd` / `inp_embd`) on the
CPU whatever backend runs the rest (its input layer's device is always the CPU; ggml's Vulkan backend
gives it pinned host memory, `Vulkan_Host`), so every ggml GPU run records `backend_actual` `vulkan+cpu`.
Labelled `vulkan->vulkan+cpu` and reported as a backend fallback, that reads as a GPU that gave up; it
is a fallback only when any other node ran on the CPU, and then it is still reported as one. A model
whose output layer shares the token-embedding table (tied embeddings: Gemma) computes its logits
(`result_output`, fed by `token_embd.weight`) where that table is, on the CPU too (Gemma 3 270M on
lavapipe: `embd` and `result_output` in `Vulkan_Host`, 815 of 817 nodes in `Vulkan0`).
"""
from __future__ import annotations

import re

GGML_INPUT_LAYER = frozenset({"embd", "inp_embd"})  # llama.cpp's names for its input layer's output
TIED_OUTPUT, TOKEN_TABLE = "result_output", "token_embd.weight"  # the logits, computed with the input layer's table
_GGML_BUFFER = re.compile(r"ggml/[^@\s]+@([^)\s]+)")  # `ggml/f32@Vulkan_Host`, also inside `rotated basis (...)`
GPU_BACKENDS = ("vulkan", "opencl")
_DECORATION = re.compile(r"(?:#\d+| \([a-z ]+\))+$")  # ggml's ` (view)`, layerdiff's `#1` for reused names


def node_buffer(layout: object) -> str | None:
    """The ggml backend buffer a node's output lived in (`Vulkan0`, `Vulkan_Host`, `CPU`); None for other engines."""
    found = _GGML_BUFFER.search(str(layout))
    return found.group(1) if found else None


def _host_buffer(layout: str) -> bool:
    """`ggml/f32@Vulkan_Host`, `ggml/f32@CPU`: a node whose output lived in CPU memory (ggml layouts only)."""
    buffer = (node_buffer(layout) or "").lower()
    return buffer == "cpu" or buffer.endswith("_host")


def cpu_by_design(attrs: dict, layers) -> list[str]:
    """The nodes a ggml GPU run computed on the CPU when every one of them is llama.cpp's input layer;
    [] for any other run (another engine, a CPU run, or a GPU run with other nodes on the CPU: a fallback)."""
    requested = str(attrs.get("backend_requested") or "")
    actual = set(str(attrs.get("backend_actual") or "").split("+"))
    if str(attrs.get("engine", "")) != "ggml" or requested not in GPU_BACKENDS or actual != {requested, "cpu"}:
        return []
    if layers is None or "layout" not in layers or "key" not in layers:
        return []
    inputs = layers["inputs"] if "inputs" in layers else [""] * len(layers["key"])
    on_cpu, names = [], set()
    for key, layout, feeds in zip(layers["key"], layers["layout"], inputs):
        if _host_buffer(str(layout)):
            on_cpu.append(str(key))
            name = _DECORATION.sub("", str(key).rsplit(":", 1)[0])
            names.add(name if name != TIED_OUTPUT or TOKEN_TABLE not in str(feeds) else "tied output")
    return on_cpu if on_cpu and names <= GGML_INPUT_LAYER | {"tied output"} else []
