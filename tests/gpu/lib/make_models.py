"""The real models for run.sh, made the way the tests make them (tests/corpus.py, tests/litert_models.py).

ncnn: PP-OCRv4 det, PP-OCR cls (rapidocr-onnxruntime 1.4.4) and Silero VAD (silero-vad 6.2.3), converted with
pnnx (fp16=0) as tests/corpus.py does; the inputs are the tests' own (det: the 256x256 four-line page of
test_reduced_precision_detector_is_judged_by_its_output). ONNX goldens (ONNX Runtime cpu/high) for the two
small ones. LiteRT: three MediaPipe .tflite models (mediapipe 0.10.14) with tests/litert_models.image_input.
Usage: make_models.py OUTDIR
"""
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.corpus import INPUT_MAKERS, MODELS, convert_with_pnnx, det_page, wheel_file  # noqa: E402
from tests.litert_models import MEMBERS, image_input, tflite_model  # noqa: E402
from layerdiff.collector.engines.litert.graph import input_specs  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
GOLDEN = {"ocr_cls", "vad_lstm"}  # ocr_det's ONNX is 4.7 MB more: left out
with tempfile.TemporaryDirectory() as tmp:
    work = Path(tmp)
    for model in MODELS:
        if model.stem == "ocr_rec":  # 10.8 MB of weights: does not fit the 64 MiB that travels, with LiteRT
            continue
        onnx = work / f"{model.stem}.onnx"
        onnx.write_bytes(wheel_file(model).read_bytes())
        arrays = {"x": det_page(256, lines=4)} if model.stem == "ocr_det" else INPUT_MAKERS[model.make_inputs]()
        param = convert_with_pnnx(onnx, model.pnnx_shapes, work)
        shutil.copy(param, out / f"{model.stem}.param")
        shutil.copy(param.with_suffix(".bin"), out / f"{model.stem}.bin")
        np.savez_compressed(out / f"{model.stem}_ncnn_in.npz", **dict(zip(model.ncnn_names, arrays.values())))
        if model.stem in GOLDEN:
            shutil.copy(onnx, out / f"{model.stem}.onnx")
            np.savez_compressed(out / f"{model.stem}_in.npz", **arrays)
for stem in MEMBERS:
    target = out / f"{stem}.tflite"
    shutil.copy(tflite_model(stem), target)
    (name, (shape, _dtype)), = input_specs(target).items()
    np.savez_compressed(out / f"{stem}_in.npz", **{name: image_input(tuple(shape))})
for path in sorted(out.iterdir()):
    print(f"{path.stat().st_size:>10}  {path.name}")
