"""Nodes a GPU run computed on the CPU by its engine's design, not by falling back.

Why: llama.cpp keeps a model's input layer (the token-embedding lookup, node `embd` / `inp_embd`) on the
CPU whatever backend runs the rest (its input layer's device is always the CPU; ggml's Vulkan backend
gives it pinned host memory, `Vulkan_Host`), so every ggml GPU run records `backend_actual` `vulkan+cpu`.
Labelled `vulkan->vulkan+cpu` and reported as a backend fallback, that reads as a GPU that gave up; it
is a fallback only when any other node ran on the CPU, and then it is still reported as one.
"""
from __future__ import annotations

import re

GGML_INPUT_LAYER = frozenset({"embd", "inp_embd"})  # llama.cpp's names for its input layer's output
GPU_BACKENDS = ("vulkan", "opencl")
_DECORATION = re.compile(r"(?:#\d+| \([a-z ]+\))+$")  # ggml's ` (view)`, layerdiff's `#1` for reused names


def _host_buffer(layout: str) -> bool:
    """`ggml/f32@Vulkan_Host`, `ggml/f32@CPU`: a node whose output lived in CPU memory (ggml layouts only)."""
    if not layout.startswith("ggml/") or "@" not in layout:
        return False
    buffer = layout.rsplit("@", 1)[1].lower()
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
    on_cpu = [str(key) for key, layout in zip(layers["key"], layers["layout"]) if _host_buffer(str(layout))]
    names = {_DECORATION.sub("", key.rsplit(":", 1)[0]) for key in on_cpu}
    return on_cpu if on_cpu and names <= GGML_INPUT_LAYER else []
