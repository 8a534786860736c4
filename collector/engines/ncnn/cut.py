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
from layerdiff.collector.engines.ncnn.modelfile import MAGIC, ParamLayer, read_param

TAG_FP16 = 0x01306B47
TAG_INT8 = 0x000D4B38
TAG_FP32_RAW = 0x0002C056

# Layer types that read nothing from the .bin: ncnn 1.0.20261020's src/layer/*.cpp without `mb.load`.
NO_WEIGHTS = frozenset("""
AbsVal ArgMax BNLL BinaryOp Cast Clip Concat CopyTo Crop CumulativeSum DeepCopy DetectionOutput Dropout ELU Einsum
Eltwise Erf Exp ExpandDims Flatten Fold GELU GLU GridSample HardSigmoid HardSwish Input Interp Log LRN MVN Mish Noop
Packing Permute PixelShuffle Pooling Pooling1D Pooling3D Power PriorBox Proposal PSROIPooling Reduction ReLU Reorg
Reshape ROIAlign ROIPooling SELU Shrink ShuffleChannel Sigmoid Slice Softmax Softplus Split Squeeze StatisticsPooling
Swish TanH Threshold Tile UnaryOp Unfold Yolov3DetectionOutput YoloDetectionOutput
""".split())

# Layers whose weights are raw fp32 (ModelBin type 1) arrays: (count key, affine key or None, arrays when affine).
AFFINE_RAW = {"GroupNorm": ("1", "3", 2), "InstanceNorm": ("0", "2", 2), "LayerNorm": ("0", "2", 2),
              "RMSNorm": ("0", "2", 1), "Normalize": ("3", None, 1), "PReLU": ("0", None, 1), "Bias": ("0", None, 1),
              "BatchNorm": ("0", None, 4), "Padding": ("6", None, 1)}
AFFINE_DEFAULT = {"GroupNorm": 1, "InstanceNorm": 1, "RMSNorm": 1, "LayerNorm": 1}

CONV_TYPES = ("Convolution", "ConvolutionDepthWise", "Deconvolution", "DeconvolutionDepthWise",
              "Convolution1D", "ConvolutionDepthWise1D", "Deconvolution1D", "DeconvolutionDepthWise1D",
              "Convolution3D", "ConvolutionDepthWise3D", "Deconvolution3D", "DeconvolutionDepthWise3D")


@dataclass(frozen=True)
class CutModel:
    """The cut model's files' contents, and the blobs it reads and writes."""

    param_text: str
    weights: bytes
    inputs: list[str]
    outputs: list[str]
    layers: list[str]


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
    if kind in CONV_TYPES or kind in ("InnerProduct", "Embed"):
        keys = {"InnerProduct": ("1", "2", "8"), "Embed": ("2", "3", "18")}.get(kind, ("5", "6", "8"))
        bias, weight_size = _int(layer, keys[0]), _int(layer, keys[1])
        if _int(layer, keys[2]):
            raise InputError(f"layer {layer.name!r} ({kind}) is int8-quantized; cutting int8 layers is not supported")
        if kind in CONV_TYPES and _int(layer, "19"):  # dynamic_weight: the weights are an input blob
            return []
        return [(weight_size, 0)] + ([(_int(layer, "0"), 1)] if bias else [])
    if kind in AFFINE_RAW:
        count_key, affine_key, arrays = AFFINE_RAW[kind]
        if affine_key is not None and not _int(layer, affine_key, AFFINE_DEFAULT.get(kind, 0)):
            return []
        count = _int(layer, count_key)
        return [(count, 1)] * arrays if count else []
    if kind == "Scale":
        size = _int(layer, "0")
        return [] if size == -233 else [(size, 1)] * (2 if _int(layer, "1") else 1)
    if kind in RECURRENT:
        return _recurrent_reads(layer)
    if kind == "Gemm":
        return _gemm_reads(layer)
    if kind == "MultiHeadAttention":
        if _int(layer, "18"):
            raise InputError(f"layer {layer.name!r} ({kind}) is quantized; cutting quantized layers is not supported")
        embed = _int(layer, "0")
        qdim = _int(layer, "2") // max(embed, 1)
        kdim, vdim = _int(layer, "3", embed), _int(layer, "4", embed)
        return [(embed * qdim, 0), (embed, 1), (embed * kdim, 0), (embed, 1), (embed * vdim, 0), (embed, 1),
                (qdim * embed, 0), (qdim, 1)]
    if kind == "MemoryData":
        w, h, d, c = (max(_int(layer, k), 1) for k in ("0", "1", "11", "2"))
        return [(w * h * d * c, _int(layer, "21", 1))]
    raise InputError(f"layer {layer.name!r}: how ncnn lays out a {kind} layer's weights is not known to layerdiff; "
                     "only layers of known types can be cut out (name a layer of another type, or a smaller range)")


RECURRENT = ("LSTM", "GRU", "RNN")


def _recurrent_reads(layer: ParamLayer) -> list[tuple[int, int]]:
    """LSTM / GRU / RNN: input weights, biases, hidden weights (and LSTM's projection), per direction."""
    if _int(layer, "8"):
        raise InputError(f"layer {layer.name!r} ({layer.type}) is int8-quantized; cutting int8 layers is not supported")
    out, size, dirs = _int(layer, "0"), _int(layer, "1"), 2 if _int(layer, "2") == 2 else 1
    if layer.type == "LSTM":
        hidden = _int(layer, "3", out)
        per = size // dirs // max(hidden, 1) // 4
        reads = [(per * hidden * 4 * dirs, 0), (hidden * 4 * dirs, 0), (out * hidden * 4 * dirs, 0)]
        return reads + ([(hidden * out * dirs, 0)] if out != hidden else [])
    gates = 3 if layer.type == "GRU" else 1
    per = size // dirs // max(out, 1) // gates
    bias_rows = 4 if layer.type == "GRU" else 1
    return [(per * out * gates * dirs, 0), (out * bias_rows * dirs, 0), (out * out * gates * dirs, 0)]


GEMM_C_SIZE = {0: lambda m, n: 1, 1: lambda m, n: m, 2: lambda m, n: m, 3: lambda m, n: n * m, 4: lambda m, n: n}


def _gemm_reads(layer: ParamLayer) -> list[tuple[int, int]]:
    """Gemm's constant A, B and C (ncnn src/layer/gemm.cpp), each a tagged (type 0) read."""
    if _int(layer, "18"):
        raise InputError(f"layer {layer.name!r} (Gemm) is quantized; cutting quantized layers is not supported")
    m, n, k = _int(layer, "7"), _int(layer, "8"), _int(layer, "9")
    reads = [(m * k, 0)] if _int(layer, "4") else []
    reads += [(n * k, 0)] if _int(layer, "5") else []
    broadcast = _int(layer, "10")
    if _int(layer, "6") and broadcast in GEMM_C_SIZE:
        reads.append((GEMM_C_SIZE[broadcast](m, n), 0))
    return reads


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
    layers = read_param(param, "binary .param.bin models cannot be cut")
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
