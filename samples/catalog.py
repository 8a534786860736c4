"""Every sample model: its recipe, how its weights are stored, its inputs, and what it demonstrates.

Files (written by samples/generate.py): models/<stem>.param/.bin/.onnx/.mnn and, per input label,
inputs/<stem>.npy (the default input, label "") or inputs/<stem>_<label>.npy.
`reference(stem, label)` is the numpy forward of exactly what the model files hold (for fp16-stored
weights: the fp16-rounded weights), keyed `<layer>:0`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from layerdiff.samples import models, scenarios
from layerdiff.samples.forward import forward
from layerdiff.samples.ncnn_emit import stored_weights
from layerdiff.samples.netdef import Network


@dataclass(frozen=True)
class SampleInput:
    """A deterministic input: standard normal noise from `seed`, times `scale`, of `shape`."""

    shape: tuple[int, ...]
    seed: int
    scale: float = 1.0
    note: str = ""

    def make(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return (rng.standard_normal(self.shape) * self.scale).astype(np.float32)


@dataclass(frozen=True)
class SampleModel:
    """One sample model: `build(input_shape)` returns the network; `inputs` maps label -> input."""

    stem: str
    build: Callable[[Sequence[int]], Network]
    inputs: Mapping[str, SampleInput]
    weight_storage: str = "fp32"
    shows: str = ""

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.inputs[""].shape

    def network(self) -> Network:
        """The network as the model files declare it (input shape of the default input)."""
        return self.build(self.input_shape)


_SMALL = (1, 3, 32, 32)

CATALOG: dict[str, SampleModel] = {m.stem: m for m in (
    SampleModel("convnet", models.convnet, {"": SampleInput(_SMALL, 1)},
                shows="ncnn cpu/low (bf16 storage) and vulkan/low (fp16) drift from cpu/high"),
    SampleModel("overflow", models.overflow, {"": SampleInput(_SMALL, 2)},
                shows="fp16 overflow at block2/amplify: inf/NaN on ncnn vulkan/low"),
    SampleModel("deepnet", scenarios.deepnet, {"": SampleInput(_SMALL, 11)},
                shows="scenario 1: error curve over depth, cpu/high vs vulkan/low"),
    SampleModel("convnet_fp16w", models.convnet, {"": SampleInput(_SMALL, 1)}, weight_storage="fp16",
                shows="scenario 2: fp16 weight storage drift vs convnet (fp32 storage), both at high"),
    SampleModel("sepool", scenarios.sepool, {"": SampleInput((1, 3, 128, 128), 13)},
                shows="scenario 3: se/pool alone loses precision with fp16 accumulation (vulkan/low)"),
    SampleModel("underflow", scenarios.underflow, {
        "": SampleInput(_SMALL, 14, 1.0, "bright: activations far above fp16's subnormal range"),
        "dim": SampleInput(_SMALL, 14, 0.01, "dim: same image x0.01, gate/scale in fp16 subnormals"),
        "dark": SampleInput(_SMALL, 14, 0.002, "dark: same image x0.002, gate/scale below 6e-8"),
    }, shows="scenario 4: the dark input collapses to zeros on vulkan/low (fp16 underflow)"),
    SampleModel("sizenet", scenarios.sizenet, {"": SampleInput(_SMALL, 15)},
                shows="scenario 5 at 32x32: pool/sum stays below 65504, no overflow"),
    SampleModel("sizenet_large", scenarios.sizenet, {"": SampleInput((1, 3, 128, 128), 15)},
                shows="scenario 5 at 128x128: pool/sum passes 65504 -> inf, head/fc1 NaN (vulkan/low)"),
    SampleModel("gridwarp", scenarios.gridwarp, {"": SampleInput((1, 4, 32, 512), 16)},
                shows="seed 002 on MNN: GridSample alone fails at fp16 (arm64 cpu/low); high fixes it"),
)}

#: stem -> recipe building the network at its declared input shape
MODELS: dict[str, Callable[[], Network]] = {stem: m.network for stem, m in CATALOG.items()}


def input_filename(stem: str, label: str = "") -> str:
    """File name of an input under samples/inputs/."""
    return f"{stem}.npy" if not label else f"{stem}_{label}.npy"


def sample_input(stem: str, label: str = "") -> np.ndarray:
    """The deterministic input `label` ("" = default) of model `stem`."""
    model = _model(stem)
    if label not in model.inputs:
        raise KeyError(f"sample model {stem!r} has no input {label!r}; it has {sorted(model.inputs)}")
    return model.inputs[label].make()


def stored_network(stem: str) -> Network:
    """The network with the weights exactly as the model files store them."""
    model = _model(stem)
    return stored_weights(model.network(), model.weight_storage)


def reference(stem: str, label: str = "") -> dict[str, np.ndarray]:
    """Numpy forward of the stored model on its input `label`: every layer keyed `<layer>:0`."""
    return forward(stored_network(stem), sample_input(stem, label))


def _model(stem: str) -> SampleModel:
    if stem not in CATALOG:
        raise KeyError(f"unknown sample model {stem!r}; known: {', '.join(CATALOG)}")
    return CATALOG[stem]
