"""One ncnn layer (or a run of layers) cut out of a model as a model of its own, in ncnn's own format.

The `.param` keeps the chosen layers' lines byte for byte; every blob they read from outside becomes an
`Input` layer with the shape the reference recorded. The `.bin` holds only those layers' weights, sliced
from the original: ncnn's `.bin` has no index, so each layer's share is computed from its params in
file order (ncnn's ModelBin: a weight read with type 0 starts with a 4-byte tag saying how it is
stored, one read with type 1 is raw fp32). A layer type whose weight size is not known here is refused,
naming it, rather than guessed: a wrong offset would feed the kernel someone else's weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerdiff.errors import InputError

MAGIC = "7767517"
TAG_FP16 = 0x01306B47
TAG_INT8 = 0x000D4B38
TAG_FP32_RAW = 0x0002C056

# Layer types that read nothing from the .bin (ncnn src/layer/*.cpp load_model is absent or a no-op).
NO_WEIGHTS = frozenset("""
AbsVal ArgMax BNLL BinaryOp Cast Clip Concat Crop CumulativeSum DeepCopy Dequantize Dropout ELU Einsum Eltwise Erf Exp
ExpandDims Flatten Fold GELU GLU GridSample Gemm GroupNorm HardSigmoid HardSwish Input InstanceNorm Interp LRN Log
LSTM_placeholder MVN Mish Noop Normalize Packing Padding Permute PixelShuffle Pooling Pooling1D Pooling3D Power Reduction
ReLU Reorg Reshape RMSNorm_placeholder SELU Shrink ShuffleChannel Sigmoid Slice Softmax Softplus Split Squeeze StatisticsPooling
Swish TanH Threshold Tile UnaryOp Unfold Yolov3DetectionOutput YoloDetectionOutput DetectionOutput PriorBox Proposal
ROIPooling ROIAlign PSROIPooling Spp CopyTo
""".split())

CONV_TYPES = ("Convolution", "ConvolutionDepthWise", "Deconvolution", "DeconvolutionDepthWise",
              "Convolution1D", "ConvolutionDepthWise1D", "Deconvolution1D", "DeconvolutionDepthWise1D",
              "Convolution3D", "ConvolutionDepthWise3D", "Deconvolution3D", "DeconvolutionDepthWise3D")


@dataclass(frozen=True)
class ParamLayer:
    """One layer line of a text .param."""

    type: str
    name: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    params: dict[str, str]
    line: str


@dataclass(frozen=True)
class CutModel:
    """The cut model's files' contents, and the blobs it reads and writes."""

    param_text: str
    weights: bytes
    inputs: list[str]
    outputs: list[str]
    layers: list[str]


def read_param(param: Path) -> list[ParamLayer]:
    """The layers of a text `.param` in file order; one clear line for anything else."""
    try:
        lines = param.read_text(errors="replace").splitlines()
    except OSError as err:
        raise InputError(f"{param}: cannot read the .param ({err.strerror or err})") from None
    if not lines or lines[0].strip() != MAGIC:
        raise InputError(f"{param}: not a text ncnn .param file (first line is not {MAGIC}); binary .param.bin "
                         "models cannot be cut")
    layers = []
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        if not fields:
            continue
        try:
            n_bottom, n_top = int(fields[2]), int(fields[3])
        except (IndexError, ValueError):
            raise InputError(f"{param}:{number}: not an ncnn layer line") from None
        ends = 4 + n_bottom + n_top
        if len(fields) < ends:
            raise InputError(f"{param}:{number}: layer {fields[1]!r} names fewer blobs than it declares")
        params = dict(kv.split("=", 1) for kv in fields[ends:] if "=" in kv)
        layers.append(ParamLayer(fields[0], fields[1], tuple(fields[4:4 + n_bottom]), tuple(fields[4 + n_bottom:ends]),
                                 params, line.strip()))
    return layers


def _int(layer: ParamLayer, key: str, default: int = 0) -> int:
    try:
        return int(float(layer.params.get(key, default)))
    except ValueError:
        raise InputError(f"layer {layer.name!r} ({layer.type}): param {key}={layer.params[key]!r} is not a number") from None


def _reads(layer: ParamLayer) -> list[tuple[int, int]]:
    """The (count, type) reads a layer's load_model makes, in order (ncnn ModelBin::load(count, type))."""
    kind = layer.type
    if kind in NO_WEIGHTS:
        return []
    if kind in CONV_TYPES or kind == "InnerProduct":
        if _int(layer, "8"):
            raise InputError(f"layer {layer.name!r} ({kind}) is int8-quantized; cutting int8 layers is not supported")
        num_output = _int(layer, "0")
        bias = _int(layer, "5" if kind != "InnerProduct" else "1")
        weight_size = _int(layer, "6" if kind != "InnerProduct" else "2")
        return [(weight_size, 0)] + ([(num_output, 1)] if bias else [])
    if kind == "BatchNorm":
        return [(_int(layer, "0"), 1)] * 4
    if kind == "Scale":
        size = _int(layer, "0")
        return ([(size, 1)] if size != -233 else []) + ([(size, 1)] if _int(layer, "1") else [])
    if kind == "PReLU":
        return [(_int(layer, "0"), 1)]
    if kind == "Bias":
        return [(_int(layer, "0"), 1)]
    if kind == "MemoryData":
        w, h, d, c = (max(_int(layer, k), 1) for k in ("0", "1", "11", "2"))
        return [(w * h * d * c, 1)]
    if kind == "LayerNorm":
        return [(_int(layer, "0"), 1)] * 2 if _int(layer, "2") else []
    raise InputError(f"layer {layer.name!r}: how ncnn lays out a {kind} layer's weights is not known to layerdiff; "
                     "only layers of known types can be cut out (name a layer of another type, or a smaller range)")


def _read_size(data: memoryview, offset: int, count: int, kind: int, where: str) -> int:
    """Bytes one ModelBin read takes at `offset` (ncnn src/modelbin.cpp)."""
    if kind == 1:
        return 4 * count
    if offset + 4 > len(data):
        raise InputError(f"{where}: the .bin ends before this layer's weights; does it belong to this .param?")
    flag = bytes(data[offset:offset + 4])
    tag = int.from_bytes(flag, "little")
    if tag == TAG_FP16:
        return 4 + _align4(2 * count)
    if tag == TAG_INT8:
        return 4 + _align4(count)
    if tag == TAG_FP32_RAW or tag == 0:
        return 4 + 4 * count
    if sum(flag):  # a quantization table of 256 floats, then one byte per value
        return 4 + 256 * 4 + _align4(count)
    return 4 + 4 * count


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4


def weight_spans(layers: list[ParamLayer], weights: bytes, source: Path) -> dict[str, tuple[int, int]]:
    """Each layer's (start, end) in the `.bin`; checks the walk ends exactly at the file's end."""
    data = memoryview(weights)
    spans: dict[str, tuple[int, int]] = {}
    offset = 0
    for layer in layers:
        start = offset
        for count, kind in _reads(layer):
            offset += _read_size(data, offset, count, kind, f"{source}: layer {layer.name!r}")
        spans[layer.name] = (start, offset)
    if offset != len(weights):
        raise InputError(f"{source}: the layers' weights take {offset} bytes but the file has {len(weights)}; "
                         "does this .bin belong to its .param?")
    return spans


def select_layers(layers: list[ParamLayer], first: str, last: str, source: Path) -> list[ParamLayer]:
    """`first`..`last` in file order (one layer when they are the same)."""
    names = [layer.name for layer in layers]
    for name in (first, last):
        if name not in names:
            raise InputError(f"{source}: no layer named {name!r}")
    i, j = names.index(first), names.index(last)
    if j < i:
        raise InputError(f"{source}: {last!r} comes before {first!r}; name the range FIRST..LAST in file order")
    return layers[i:j + 1]


def ncnn_input_params(shape: tuple[int, ...]) -> str:
    """The Input layer's shape params for a blob recorded as NCHW with ncnn's dropped batch put back."""
    dims = shape[1:] if len(shape) in (2, 4, 5) and shape[0] == 1 else shape
    keys = {1: ("0",), 2: ("1", "0"), 3: ("2", "1", "0"), 4: ("2", "11", "1", "0")}.get(len(dims))
    if keys is None:
        raise InputError(f"a blob of shape {list(shape)} cannot be an ncnn Input (ncnn has 1 to 4 dims)")
    return " ".join(f"{key}={size}" for key, size in zip(keys, dims))


def cut(param: Path, weights_path: Path, first: str, last: str,
        shapes: dict[str, tuple[int, ...]]) -> CutModel:
    """The layers `first`..`last` as a model; `shapes` gives each blob's recorded shape (for the Inputs)."""
    layers = read_param(param)
    try:
        weights = weights_path.read_bytes()
    except OSError as err:
        raise InputError(f"{weights_path}: cannot read the weights ({err.strerror or err})") from None
    spans = weight_spans(layers, weights, weights_path)
    chosen = select_layers(layers, first, last, param)
    made = {top for layer in chosen for top in layer.tops}
    inputs = list(dict.fromkeys(b for layer in chosen for b in layer.bottoms if b not in made))
    missing = [name for name in inputs if name not in shapes]
    if missing:
        raise InputError(f"the reference has no tensor {', '.join(map(repr, missing))} that {first!r} reads")
    taken = {layer.name for layer in chosen}
    lines = []
    for blob in inputs:
        name = blob if blob not in taken else f"{blob}_input"
        lines.append(f"Input {name} 0 1 {blob} {ncnn_input_params(shapes[blob])}")
    lines += [layer.line for layer in chosen]
    blobs = len(inputs) + sum(len(layer.tops) for layer in chosen)
    text = f"{MAGIC}\n{len(lines)} {blobs}\n" + "\n".join(lines) + "\n"
    data = b"".join(weights[slice(*spans[layer.name])] for layer in chosen)
    return CutModel(text, data, inputs, list(chosen[-1].tops), [layer.name for layer in chosen])
