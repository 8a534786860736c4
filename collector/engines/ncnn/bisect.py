"""ncnn's part of `collect bisect`: a kept layer carries the feature mask (param key 31) in a rewritten `.param`."""
from __future__ import annotations

from layerdiff.collector.engines.bisectrecipe import BisectLayer, BisectRecipe
from layerdiff.collector.engines.ncnn.modelfile import read_param
from layerdiff.collector.engines.ncnn.options import CLOSED_UPSTREAM, HIGH_PRECISION_MASK, describe
from layerdiff.errors import InputError


def layers(model) -> list[BisectLayer]:
    """The layers of a text `.param`, in file (= execution) order."""
    param = next((f for f in model.files if f.suffix == ".param"), model.files[0])
    found = [BisectLayer(layer.name, layer.type, layer.bottoms, layer.tops)
             for layer in read_param(param, "bisect reads the layers from it")]
    if not found:
        raise InputError(f"{param}: no layers found; bisect needs a text ncnn .param")
    return found


def kept_mask(backend: str) -> dict:
    """The mask a kept layer carries on `backend`, for bisect.json."""
    value = int(HIGH_PRECISION_MASK.get(backend, HIGH_PRECISION_MASK["cpu"]))
    return {"kept_mask": {"key": 31, "value": value, "bits": describe(value)}}


RECIPE = BisectRecipe(
    "feature-mask",
    "a kept layer carries ncnn's feature mask (param key 31): fp16/bf16 off and, on Vulkan, off the GPU",
    layers, frozenset({"Input", "Split"}), moved_when_closed=frozenset({"Split"}),  # a kept CPU layer's Split: fp32
    kept_needs_producers=lambda backend: CLOSED_UPSTREAM.get(backend, False), kept_record=kept_mask)
