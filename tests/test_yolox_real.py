"""A real YOLOX-style detector judged by its decoded boxes: ddddocr's character detector (common_det.onnx,
ddddocr 1.6.1, tests/corpus-wheels.txt), one raw grid head [1, 3549, 6] at 416x416, fed a captcha-like
picture letterboxed as ddddocr feeds it.

Every verdict is held against ddddocr's own decoding written out here in numpy (its `demo_postprocess`,
score = objectness x class, threshold 0.1, class-agnostic NMS at 0.45; the wheel's code imports OpenCV,
so it is not imported), applied to the outputs each engine gives through its own API. Runs: ONNX Runtime
(the golden), MNN with fp16 weights at low precision (a lossy conversion: every layer's numbers change),
and MNN on the picture moved a few pixels right, labelled as the golden's input (boxes that really move).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.outputs.boxes import iou_matrix
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.samples.onnx_emit import convert_many
from tests.corpus import CHAR_DET_MODEL, captcha_picture, convert_corpus, letterbox_416

TASK = "yolox:output,conf=0.1"  # ddddocr's score threshold; its NMS threshold is YOLOX's 0.45 (the default)
SHIFT = 4  # pixels of the original picture the "moved" run's characters move right (5.2 at 416x416)


def ddddocr_boxes(head: np.ndarray, score_thr: float = 0.1, nms_thr: float = 0.45) -> tuple[np.ndarray, np.ndarray]:
    """ddddocr's DetectionEngine.get_bbox before scaling back: grid decoding at strides 8, 16, 32, score =
    objectness x class score, kept above score_thr, class-agnostic NMS with its +1 pixel areas."""
    pred = np.asarray(head, np.float64).reshape(-1, 6).copy()
    grids, strides = [], []
    for stride in (8, 16, 32):
        xv, yv = np.meshgrid(np.arange(416 // stride), np.arange(416 // stride))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((grids[-1].shape[0], 1), stride))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    pred[:, :2] = (pred[:, :2] + grid) * stride
    pred[:, 2:4] = np.exp(pred[:, 2:4]) * stride
    scores = pred[:, 4] * pred[:, 5]
    cx, cy, w, h = pred[:, :4].T
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    keep = scores > score_thr
    boxes, scores = boxes[keep], scores[keep]
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order, chosen = scores.argsort()[::-1], []
    while order.size:
        i, rest = order[0], order[1:]
        chosen.append(i)
        iw = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + 1)
        ih = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + 1)
        overlap = iw * ih / (areas[i] + areas[rest] - iw * ih)
        order = rest[overlap <= nms_thr]
    return boxes[chosen], scores[chosen]


def best_ious(ref: np.ndarray, run: np.ndarray) -> np.ndarray:
    """For each reference box, the IoU of the run box that overlaps it most (0 when the run has none)."""
    iou = iou_matrix(ref, run)
    return iou.max(axis=1) if iou.shape[1] else np.zeros(len(ref))


def ort_head(onnx: Path, image: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    return ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"]).run(None, {"images": image})[0]


def mnn_head(mnn: Path, image: np.ndarray, precision: str) -> np.ndarray:
    """The head from pymnn directly, the input fed in the dimension type MNN declares for it."""
    import MNN

    interpreter = MNN.Interpreter(str(mnn))
    session = interpreter.createSession({"backend": "CPU", "precision": precision, "numThread": 1})
    tensor = interpreter.getSessionInput(session, "images")
    tensor.copyFrom(MNN.Tensor(image.shape, MNN.Halide_Type_Float, np.ascontiguousarray(image),
                               tensor.getDimensionType()))
    interpreter.runSession(session)
    out = interpreter.getSessionOutput(session, "output")
    host = MNN.Tensor(out.getShape(), MNN.Halide_Type_Float, out.getDimensionType())
    out.copyToHostTensor(host)
    return np.array(host.getNumpyData(), copy=True).reshape(out.getShape())


def dumped_head(path: Path) -> np.ndarray:
    with DumpFile(path) as dump:
        layers = dump.layers
        return dump.tensor(int(layers.loc[layers["name"] == "output", "order"].iloc[-1]))


@pytest.fixture(scope="module")
def char_det(tmp_path_factory):
    """The detector on ONNX Runtime, on MNN with fp16 weights (low), and on MNN with the picture moved."""
    work = tmp_path_factory.mktemp("char_det")
    converted = convert_corpus(work, (CHAR_DET_MODEL,))[CHAR_DET_MODEL.stem]
    fp16 = work / "char_det_fp16.mnn"
    convert_many([(converted.onnx, fp16, True)])
    picture = captcha_picture()
    image = letterbox_416(picture)
    moved = letterbox_416(np.concatenate([np.repeat(picture[:, :1], SHIFT, axis=1), picture[:, :-SHIFT]], axis=1))

    def collect(model: Path, precision: str, array: np.ndarray, out: str) -> Path:
        spec = RunSpec(resolve_model(model), "cpu", precision, InputSet("captcha", {"images": array}, "test"))
        outcome = collect_run(LocalDevice(), spec, work / out)
        assert outcome.status == "done", f"{model.name} {precision}: {outcome.message}"
        return outcome.paths[0]

    runs = {"golden": collect(converted.onnx, "high", image, "golden"),
            "fp16": collect(fp16, "low", image, "fp16"),
            "moved": collect(converted.mnn, "high", moved, "moved")}
    with h5py.File(runs["golden"], "r") as g, h5py.File(runs["moved"], "r+") as f:
        f.attrs["input_sha256"] = g.attrs["input_sha256"]  # paired with the golden: its boxes moved
    heads = {"golden": ort_head(converted.onnx, image), "fp16": mnn_head(fp16, image, "low"),
             "moved": mnn_head(converted.mnn, moved, "high")}
    return runs, heads


def _decisions(runs: dict[str, Path], task: str) -> dict[str, tuple[dict, object]]:
    """Per compared run (by its key in `runs`): its summary row and its decoded-output finding."""
    analysis = analyze_paths([runs["golden"], runs["fp16"], runs["moved"]], ref=runs["golden"], task=task)
    try:
        rows = {r["file"]: r for r in analysis.summary.to_dict("records") if r["role"] == "compared"}
        said = [f for f in analysis.findings if f.kind == "output_decision"]
        out = {}
        for key in ("fp16", "moved"):
            row = rows[runs[key].name]
            label = "cpu/low" if key == "fp16" else "cpu/high"
            out[key] = (row, next(f for f in said if f"mnn {label}" in f.sentence))
        return out
    finally:
        analysis.close()


def test_the_dumps_hold_what_each_engine_computes_for_the_app(char_det):
    runs, heads = char_det
    for key, path in runs.items():
        dumped = dumped_head(path).reshape(heads[key].shape)
        assert np.array_equal(dumped, heads[key]) or np.abs(dumped - heads[key]).max() < 1e-5, key
    golden, _ = ddddocr_boxes(heads["golden"])
    assert len(golden) == 4, "the picture's four characters must each give a box"


def test_yolox_verdicts_agree_with_ddddocr_decoding(char_det):
    runs, heads = char_det
    boxes = {key: ddddocr_boxes(head) for key, head in heads.items()}
    golden = boxes["golden"][0]
    decided = _decisions(runs, TASK)

    # the lossy run: every layer's numbers change, no box moves (numpy), so the run is not failed on it
    fp16_rel = np.linalg.norm(heads["fp16"] - heads["golden"]) / np.linalg.norm(heads["golden"])
    ious = best_ious(golden, boxes["fp16"][0])
    assert fp16_rel > 1e-5 and len(boxes["fp16"][0]) == len(golden) and ious.min() > 0.99, (fp16_rel, ious)
    row, said = decided["fp16"]
    assert row["verdict"] != "fail" and said.numbers["status"] == "pass", row["verdict_reason"]
    assert f"all {len(golden)} box(es) kept" in said.sentence, said.sentence
    assert said.numbers["min_iou"] == pytest.approx(ious.min(), abs=0.002)

    # the moved picture: numpy sees every character's box move; so must the verdict, with the same IoUs
    ious = best_ious(golden, boxes["moved"][0])
    moved = int(((ious >= 0.5) & (ious < 0.9)).sum())
    lost = int((ious < 0.5).sum())
    assert moved >= 1 and len(boxes["moved"][0]) == len(golden), ious
    row, said = decided["moved"]
    assert row["verdict"] == "fail", row["verdict_reason"]
    assert said.numbers["boxes_reference"] == said.numbers["boxes_run"] == len(golden), said.sentence
    assert (said.numbers["moved"], said.numbers["lost"]) == (moved, lost), (said.sentence, ious)
    assert f"{moved} of {len(golden)} box(es) moved (IoU" in said.sentence, said.sentence
    assert said.numbers["min_iou"] == pytest.approx(ious.min(), abs=0.01), (said.sentence, ious)
    matched = iou_matrix(golden, boxes["moved"][0]).argmax(axis=1)
    changed = int((np.abs(boxes["moved"][1][matched] - boxes["golden"][1]) > 0.05).sum())
    assert said.numbers["scores_changed"] == changed, (said.sentence, boxes["moved"][1][matched], boxes["golden"][1])
    reported = sorted(b["iou"] for b in said.numbers["moved_boxes"])
    assert reported == pytest.approx(sorted(ious[(ious >= 0.5) & (ious < 0.9)]), abs=0.01)


@pytest.mark.parametrize("task, why", [
    ("yolov5", "3549 rows, one per grid cell of a 416x416 input (an anchor-free YOLOX layout"),
    # the same row count as a YOLOv8 head of this input: read as one, its raw offsets were 94 tiny boxes
    ("yolov8", "only 0% of the 3549 boxes contain their anchor point"),
    ("text-det", "a DB probability map is an image of the 416x416 input"),
    ("segmentation", "is no mask of the 416x416 input: its 3549x6 map"),
])
def test_another_family_on_the_yolox_head_is_refused_in_one_line_not_misread(char_det, task, why):
    runs, _heads = char_det
    for key, (row, said) in _decisions(runs, task).items():
        assert said.numbers["status"] == "error" and "\n" not in said.sentence, said.sentence
        assert why in said.sentence, said.sentence
        assert task not in ("yolov5", "yolov8") or "use --task yolox" in said.sentence, said.sentence
        assert "box(es)" not in row["verdict_reason"] and row["verdict"] != "pass", (key, row["verdict_reason"])


def test_analyze_command_prints_the_yolox_verdicts(char_det, tmp_path):
    """The command a user types: the moved run fails on its moved boxes, the lossy run keeps all four."""
    runs, _heads = char_det
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "layerdiff.analyzer.cli.app", *(str(p) for p in runs.values()),
                           "--ref", str(runs["golden"]), "--task", TASK, "-o", str(tmp_path / "report")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    said = proc.stdout + proc.stderr
    assert "Traceback" not in said and (tmp_path / "report" / "index.html").is_file(), said[-2000:]
    assert "all 4 box(es) kept" in said and "4 of 4 box(es) moved (IoU" in said, said[-2000:]
