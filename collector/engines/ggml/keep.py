"""What `collect bisect` needs from the ggml engine: the harness's `--keep` argument, the outputs a plain run
reads, and the models it cannot move nodes of (device_scripts/ggml/README.md, "Keeping nodes")."""
from __future__ import annotations

import re

from layerdiff.collector.engines.ggml.models import CONV_ARCH, architecture


def keep_args(kept: tuple[str, ...]) -> list[str]:
    """`--keep REGEX` naming exactly these nodes (`(?!)` names none: the failing run)."""
    if not kept:
        return ["--keep", "(?!)"]
    return ["--keep", "^(?:" + "|".join(re.escape(name) for name in kept) + ")$"]


def outputs(model) -> list[str]:
    """The node a plain run of the model hands an app: the convolution graph's conv.out, a language model's logits."""
    return ["conv.out"] if architecture(model.files[0]) == CONV_ARCH else ["result_output"]


def refusal(model, backend: str) -> str:
    """One line when the harness cannot keep nodes of this model, else ""."""
    if architecture(model.files[0]) == CONV_ARCH:
        return ""
    return (f"{model.files[0].name}: ggml can keep nodes of layerdiff's convolution graph only; a language model's "
            "graph is built inside llama.cpp's llama_decode, whose public API offers no per-node choice of backend "
            "or type; collect bisect cannot run (collect isolate re-runs single nodes instead)")


def recipe():
    """ggml's BisectRecipe: the harness keeps the nodes `--keep` names; it lists the nodes it can keep itself."""
    from layerdiff.collector.engines.bisectrecipe import BisectRecipe

    return BisectRecipe(
        "node-keep",
        "the harness's --keep REGEX: on the CPU a kept node is built in the high precision's types (an f32 "
        "IM2COL; a MUL_MAT reading f32 columns and an f32 kernel); on a GPU backend ggml's scheduler pins it to "
        "the CPU backend (ggml_backend_sched_set_tensor_backend)",
        lambda model: [], keep_args=keep_args, outputs=outputs, refusal=refusal)
