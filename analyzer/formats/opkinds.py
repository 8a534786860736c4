"""What kind of op a layer is, whatever the vocabulary (ONNX, ncnn, MNN, pnnx, exporter tensor names).

Structural alignment (`layerdiff.analyzer.align.structure`) pairs layers of runs whose names say nothing about each
other; the op kind, the arithmetic an elementwise op does and whether it applies learned weights
are what it can still compare.
"""
from __future__ import annotations

import re

# Op types (lower case, from ONNX, ncnn, MNN, pnnx and exporter names) -> one class per kind of op.
_CLASS_WORDS: dict[str, tuple[str, ...]] = {
    "conv": ("conv", "convolution", "convolution1d", "convolution3d", "convolutiondepthwise", "conv1d", "deconvolution", "deconvolutiondepthwise",
             "convtranspose", "innerproduct", "gemm", "matmul", "linear", "fc", "conv2d", "depthwise_conv2d",
             "convbn2d", "convrelu", "convdwrelu", "convdw", "fcrelu", "nn.conv2d", "nn.linear", "f.linear",
             "fully_connected", "batch_matmul"),
    "norm": ("batchnormalization", "batchnorm", "batch_norm", "bn", "scale", "layernorm", "layer_norm", "ln",
             "instancenormalization", "instancenorm", "groupnorm", "layernormalization", "normalize"),
    "act": ("relu", "relu6", "clip", "sigmoid", "hardsigmoid", "hard_sigmoid", "hswish", "hsigmoid",
            "hardswish", "hard_swish", "swish", "silu", "gelu", "tanh", "leakyrelu", "prelu", "elu", "mish",
            "selu", "softplus", "erf", "unaryop", "f.relu", "f.hardswish", "f.hardsigmoid", "f.gelu", "hs"),
    "eltwise": ("add", "sub", "mul", "div", "pow", "sqrt", "binaryop", "eltwise", "expression", "pnnx.expression",
                "elementwise_add", "elementwise_mul", "elementwise_div", "elementwise_sub", "tmp", "exp", "log",
                "abs", "neg", "reciprocal", "max", "min", "where"),
    "pool": ("pooling", "maxpool", "averagepool", "globalaveragepool", "globalmaxpool", "pool", "pool2d", "gap",
             "adaptive_avg_pool2d", "f.adaptive_avg_pool2d", "reduction", "reducemean", "reducesum",
             "reducemax", "reduce_mean", "mean"),
    "layout": ("reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose", "raster", "expanddims",
               "view", "shufflechannel", "tensor.view", "torch.permute", "torch.flatten", "transpose2"),
    "concat": ("concat", "torch.cat", "cat"),
    "slice": ("slice", "crop", "split", "gather", "torch.split", "chunk"),
    "resize": ("resize", "interp", "upsample", "f.interpolate", "nearest_interp", "bilinear_interp"),
    "softmax": ("softmax", "f.softmax", "logsoftmax"),
    "attention": ("multiheadattention", "attention", "nn.multiheadattention"),
    "copy": ("identity", "noop", "dropout"),
}
_RECURRENT = {"lstm", "gru", "rnn"}  # weighted too: one op here, several convs once an engine decomposes it
_ARITHMETIC = {"add", "sub", "mul", "div", "pow", "sqrt", "exp", "log", "abs", "neg", "max", "min", "reciprocal"}
_CLASS_OF = {word: cls for cls, words in _CLASS_WORDS.items() for word in words}
# Classes one converter's fused or decomposed op can stand for on the other side.
_FUSABLE = {frozenset(p) for p in (("conv", "norm"), ("conv", "act"), ("conv", "eltwise"), ("norm", "eltwise"),
                                   ("act", "eltwise"), ("norm", "act"), ("attention", "eltwise"),
                                   ("attention", "conv"), ("attention", "layout"), ("layout", "slice"),
                                   ("pool", "eltwise"), ("layout", "eltwise"), ("softmax", "eltwise"))}
_FUSED_ACT = re.compile(r"^(conv|conv1d|conv3d|convdw|convdw1d|deconv|deconvdw|fc|gemm|linear)(relu|relu6|sigmoid|swish|hswish|clip|"
                        r"leakyrelu|prelu|elu|mish|gelu|tanh)_\d+$")
_WEIGHTED_NAME = re.compile(r"^(conv|deconv|fc|gemm|linear|matmul|innerproduct)")
_NAME_WORD = re.compile(r"([a-z][a-z0-9_]*?)(?:_output|_\d|[.@:]|$)")

def weighted(op_type: str, op: str = "") -> bool:
    """Whether the layer applies learned weights (a conv, fc or matmul): such an op never vanishes in a
    conversion, it is only fused with the ops around it."""
    if str(op_type or "").strip():  # the type says it (Paddle names a conv's bias Add `conv2d_7.tmp_1`)
        kind = str(op_type).strip().lower()
        return _CLASS_OF.get(kind) == "conv" or kind in _RECURRENT
    return bool(_WEIGHTED_NAME.match(str(op).rsplit("/", 1)[-1].lower()))


def op_class(op_type: str, op: str = "") -> str:
    """The kind of op (`conv`, `act`, ...), from its type, else from the words of its name; '' if unknown.

    A conv whose name says it carries a fused activation (pnnx's `convrelu_3`, `fcrelu_0`) writes the
    activation's tensor, so it is an `act` for matching."""
    if _FUSED_ACT.match(str(op).rsplit("/", 1)[-1].lower()):
        return "act"
    for text in (op_type, op.rsplit("/", 1)[-1]):
        text = str(text or "").strip().lower()
        if not text:
            continue
        if text in _CLASS_OF:
            return _CLASS_OF[text]
        match = _NAME_WORD.match(text)
        if match and match.group(1) in _CLASS_OF:
            return _CLASS_OF[match.group(1)]
    return ""


def arithmetic(op_type: str, op: str = "") -> str:
    """Which elementwise arithmetic an op does (`add`, `mul`, ...), from its type or name; '' if unsaid.

    Within a chain of same-shape elementwise ops (a folded scale and bias: Mul then Add) the class
    alone cannot tell the two apart, while ONNX's `Mul` and pnnx's `mul_36` say it outright."""
    for text in (op_type, str(op).rsplit("/", 1)[-1]):
        text = str(text or "").strip().lower()
        word = text if text in _ARITHMETIC else (_NAME_WORD.match(text) or [None, ""])[1]
        word = word.removeprefix("elementwise_")
        if word in _ARITHMETIC:
            return word
    return ""


def type_agreement(a: str, b: str) -> float:
    """1 same class or a conv and the norm converters fold into it, 0.6 one unknown, 0.5 one op fused
    into or decomposed as the other, 0.2 otherwise."""
    if a and a == b or {a, b} == {"conv", "norm"}:
        return 1.0
    if not a or not b or "copy" in (a, b):
        return 0.6
    return 0.5 if frozenset((a, b)) in _FUSABLE else 0.2
