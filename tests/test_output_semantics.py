"""Outputs judged by what they are: top-1 only for class scores, whatever the engine's batch
axis; declared detector tasks decoded into boxes and compared as a user would; one rounding rule."""
from __future__ import annotations

import math

import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.findings.wording import layer_name, percent
from layerdiff.analyzer.measure import classes
from layerdiff.analyzer.outputs.detection import components, decode
from layerdiff.analyzer.outputs.task import parse_task
from layerdiff.errors import LayerdiffError
from tests.analyze_dumps import write_dump

N_ANCHORS, N_CLASSES = 3 * (64 + 16 + 4), 80  # YOLOv5's 3 anchors per grid cell of a 64x64 input (strides 8/16/32)


def _summary(analysis):
    return {r["run"]: r for r in analysis.summary.to_dict("records") if r["role"] == "compared"}


def _yolo_head(boxes: list[tuple[float, float, float, float, int]], seed: int = 0) -> np.ndarray:
    """A YOLOv5 head [1, N, 5 + C]: low-score background anchors, and each given box (cx, cy, w, h,
    class) on three neighbouring anchors with high objectness, as a trained head answers."""
    rng = np.random.default_rng(seed)
    head = rng.uniform(0.0, 0.02, (1, N_ANCHORS, 5 + N_CLASSES)).astype(np.float32)
    head[0, :, :4] = rng.uniform(0, 64, (N_ANCHORS, 4))
    for k, (cx, cy, w, h, cls) in enumerate(boxes):
        for j, shift in enumerate((0.0, 0.5, -0.5)):
            row = head[0, 100 * k + j]
            row[:4] = (cx + shift, cy, w, h)
            row[4] = 0.9 - 0.05 * j
            row[5 + cls] = 0.95
    return head


def _detector_dump(path, head: np.ndarray, **attrs):
    layers = [("data", "Input", [], (1, 3, 64, 64)), ("head", "Sigmoid", ["data"], head.shape)]
    data = np.random.default_rng(9).normal(size=(1, 3, 64, 64)).astype(np.float32)
    return write_dump(path, {"data": data, "head": head}, layers=layers, **attrs)


def test_one_flipped_argmax_among_anchors_is_no_decision(tmp_path):
    """a detector head's axes are anchors and coordinates; an argmax flip there
    (values moved far below the tolerance) must not fail the run, nor give another verdict when the
    reference dropped the batch axis (ncnn)."""
    head = _yolo_head([(20, 20, 10, 12, 3), (44, 30, 8, 8, 7)])
    head[0, 5:7, 10] = 0.0301, 0.0300  # two background anchors, nearly equal in one column
    run = head.copy()
    run[0, 5:7, 10] = 0.0300, 0.0301  # the argmax over "axis 1" (the anchors) flips, by 1e-4    _detector_dump(tmp_path / "ref.h5", head)
    _detector_dump(tmp_path / "mnn.h5", run, backend="vulkan", precision="low")
    verdicts = []
    for ref_head in (head, head.reshape(N_ANCHORS, -1) + np.float32(2.5e-7)):  # ORT's [1,N,C], ncnn's [N,C]
        folder = tmp_path / f"ref{len(verdicts)}"
        folder.mkdir()
        _detector_dump(folder / "ref.h5", ref_head)
        _detector_dump(folder / "run.h5", run, backend="vulkan", precision="low")
        analysis = analyze_paths([folder])
        try:
            (row,) = _summary(analysis).values()
            assert math.isnan(row["top1"])  # a head is not class scores
            assert "top-1" not in row["verdict_reason"]
            verdicts.append(row["verdict"])
        finally:
            analysis.close()
    assert verdicts == ["pass", "pass"]


def test_declared_yolov5_task_says_which_box_moved(tmp_path):
    """A box that really moved is said as a moved box with its IoU; an unchanged run passes."""
    boxes = [(20, 20, 10, 12, 3), (44, 30, 8, 8, 7), (12, 48, 14, 6, 1)]
    head = _yolo_head(boxes)
    moved = _yolo_head([boxes[0], (45.5, 30.5, 8, 8, 7), boxes[2]])  # box 2 shifted: IoU ~0.62
    same = head + np.random.default_rng(1).normal(0, 1e-4, head.shape).astype(np.float32)
    _detector_dump(tmp_path / "ref.h5", head)
    _detector_dump(tmp_path / "moved.h5", moved, backend="vulkan", precision="low")
    _detector_dump(tmp_path / "same.h5", same, backend="opencl", precision="low")
    analysis = analyze_paths([tmp_path], task="yolov5")
    try:
        rows = {r["config"].split("/")[0] if "/" in r["config"] else r["run"]: r for r in _summary(analysis).values()}
        moved_row = next(r for r in rows.values() if "vulkan" in r["run"])
        same_row = next(r for r in rows.values() if "opencl" in r["run"])
        assert moved_row["verdict"] == "fail" and moved_row["task"] == "yolov5"
        assert "1 of 3 box(es) moved (IoU 0.6" in moved_row["verdict_reason"]
        assert same_row["verdict"] == "pass", same_row["verdict_reason"]
        said = [f for f in analysis.findings if f.kind == "output_decision"]
        assert {f.severity for f in said} == {"fail", "info"}
        assert any("all 3 box(es) kept" in f.sentence for f in said)
        iou = next(f for f in said if f.severity == "fail").numbers["moved_boxes"][0]["iou"]
        expect = 6.5 * 7.5 / (2 * 64 - 6.5 * 7.5)  # two 8x8 boxes shifted by (1.5, 0.5)
        assert iou == pytest.approx(expect, abs=1e-3)
    finally:
        analysis.close()


def test_class_axis_is_found_the_same_for_every_engine_layout():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(1, 1000)).astype(np.float32)
    prob = np.exp(logits) / np.exp(logits).sum()
    assert classes.class_axis(prob) == 0 and classes.class_axis(prob.reshape(1000)) == 0
    assert classes.class_axis(prob.reshape(1, 1000, 1, 1)) == 0
    assert classes.class_axis(logits) is None  # logits are not recognised without a declared task
    assert classes.class_axis(logits, declared=True) == 0
    sigmoid_scores = rng.uniform(0, 1, (1, 7600, 10)).astype(np.float32)  # a detector's per-anchor scores
    assert classes.class_axis(sigmoid_scores) is None
    seq = rng.uniform(0, 1, (1, 30, 97))
    seq /= seq.sum(axis=-1, keepdims=True)  # a recogniser's per-step softmax
    assert classes.class_axis(seq) == 1 and classes.class_axis(seq[0]) == 1


def test_a_flip_at_a_near_tie_is_not_a_changed_decision():
    ref = np.array([[0.50, 0.495, 0.005], [0.8, 0.1, 0.1]], dtype=np.float32)
    run = np.array([[0.495, 0.50, 0.005], [0.8, 0.1, 0.1]], dtype=np.float32)
    agree = classes.topk_agreement(ref, run, tolerance=0.011)
    assert agree["top1"] == 1.0 and agree["n_tie_flips"] == 1 and agree["n_flips"] == 0
    run[1] = (0.1, 0.8, 0.1)
    agree = classes.topk_agreement(ref, run, tolerance=0.011)
    assert agree["top1"] == 0.0 and agree["n_flips"] == 1


def test_one_rounding_rule_never_rounds_a_disagreement_away():
    assert percent(0.9986) == "99.9%" and percent(0.99999) == "99.999%" and percent(1.0) == "100%"
    assert percent(1e-6) == "0.0001%" and percent(0.0) == "0%" and percent(0.0139) == "1.39%"


def test_findings_name_the_node_and_the_tensor():
    assert layer_name("gs:0", "warp/grid_sample") == "warp/grid_sample (tensor gs:0)"
    assert layer_name("conv1:0", "conv1") == "conv1:0"


def test_task_text_is_checked_in_one_line():
    assert parse_task("picodet:conf=0.5").get("conf") == 0.5
    assert parse_task("picodet:conf=0.5").text == "picodet:conf=0.5"
    assert parse_task("elements").name == "regression"
    for bad in ("yolo9", "picodet:bogus=1", "yolov5:conf=high"):
        with pytest.raises(LayerdiffError, match="--task"):
            parse_task(bad)


def test_text_detection_regions_become_boxes():
    prob = np.zeros((1, 1, 40, 60), dtype=np.float32)
    prob[0, 0, 5:12, 4:30] = 0.9
    prob[0, 0, 20:30, 10:50] = 0.8
    boxes = decode(parse_task("text-det"), [prob[0, 0]], (40, 60), 0.5)
    assert sorted(map(tuple, boxes.xyxy.astype(int).tolist())) == [(4, 5, 30, 12), (10, 20, 50, 30)]
    ring = np.zeros((30, 30), bool)
    ring[5:25, 5] = ring[5:25, 24] = ring[5, 5:25] = ring[24, 5:25] = True
    assert len(np.unique(components(ring))) == 2  # one region (and the background)


def _regions_by_flood_fill(prob: np.ndarray, thresh: float, min_area: int) -> list[tuple[list[int], float]]:
    """PP-OCR's DB boxes worked out the plain way: each 4-connected region above `thresh` found by a flood
    fill from its first pixel (row-major), its box and the mean probability of its pixels."""
    mask = prob > thresh
    seen = np.zeros(mask.shape, dtype=bool)
    found = []
    for y, x in zip(*np.nonzero(mask)):
        if seen[y, x]:
            continue
        seen[y, x] = True
        stack, pixels = [(y, x)], []
        while stack:
            r, c = stack.pop()
            pixels.append((r, c))
            for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= rr < mask.shape[0] and 0 <= cc < mask.shape[1] and mask[rr, cc] and not seen[rr, cc]:
                    seen[rr, cc] = True
                    stack.append((rr, cc))
        if len(pixels) >= min_area:
            rows, cols = np.array(pixels).T
            found.append(([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1],
                          float(np.mean([prob[r, c] for r, c in sorted(pixels)], dtype=np.float64))))
    return found


@pytest.mark.parametrize("seed", range(6))
def test_text_detection_boxes_and_scores_match_a_flood_fill(seed):
    """Boxes, their order and their scores (the region's mean probability) are those a flood fill of the
    map finds, on blotchy maps with touching, nested and single-pixel regions."""
    rng = np.random.default_rng(seed)
    noise = rng.random((48, 70))
    prob = ((noise + np.roll(noise, 1, 0) + np.roll(noise, 1, 1)) / 3).astype(np.float32)
    for thresh, min_area in ((0.5, 1), (0.6, 3), (0.7, 2)):
        expected = [f for f in _regions_by_flood_fill(prob.astype(np.float64), thresh, min_area) if f[1] >= 0.55]
        boxes = decode(parse_task(f"text-det:thresh={thresh},min_area={min_area}"), [prob], (48, 70), 0.55)
        assert boxes.xyxy.tolist() == [box for box, _ in expected]
        assert boxes.scores == pytest.approx([score for _, score in expected], rel=1e-12, abs=0)
        assert len(expected) > 5


def test_collect_records_the_declared_task_and_refuses_a_bad_one(tmp_path):
    """`collect --task` writes the task into every run; analyze then judges by it without --task."""
    import subprocess
    import sys

    import h5py

    cli = [sys.executable, "-m", "layerdiff.collector.cli"]
    bad = subprocess.run(cli + ["-o", str(tmp_path / "bad"), "--task", "yolo9"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown task 'yolo9'" in bad.stderr and not (tmp_path / "bad").exists()
    good = subprocess.run(cli + ["-o", str(tmp_path / "runs"), "--task", "segmentation", "--no-report"],
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    (dump,) = (tmp_path / "runs").glob("*.h5")
    with h5py.File(dump, "r") as f:
        assert f.attrs["task"] == "segmentation"


def test_yolov8_ssd_and_segmentation_decode_by_their_conventions():
    from layerdiff.analyzer.outputs.segmentation import compare_masks

    n, c = 64 + 16 + 4, 4  # one anchor per grid cell of a 64x64 input
    head = np.zeros((4 + c, n), np.float32)  # YOLOv8 as exported: [4 + C, anchors]
    head[:4] = 5.0
    head[:4, 7] = (30, 40, 10, 20)
    head[4 + 2, 7] = 0.8
    boxes = decode(parse_task("yolov8"), [head], (64, 64), 0.25)
    assert boxes.xyxy.tolist() == [[25, 30, 35, 50]] and boxes.classes.tolist() == [2]
    assert decode(parse_task("yolov8"), [head.T.copy()], (64, 64), 0.25).xyxy.tolist() == [[25, 30, 35, 50]]
    xyxy = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [40, 40, 50, 60]], np.float32)
    scores = np.array([[0.9, 0.1], [0.8, 0.1], [0.2, 0.7]], np.float32)
    ssd = decode(parse_task("ssd"), [xyxy, scores.T.copy()], None, 0.4)  # scores as [C, N]: NMS keeps 2
    assert ssd.xyxy.tolist() == [[0, 0, 10, 10], [40, 40, 50, 60]] and ssd.classes.tolist() == [0, 1]
    logits = np.zeros((3, 8, 8), np.float32)
    logits[1, :4] = 5.0
    run = logits.copy()
    run[1, 3] = 0.0  # one row of class 1 becomes class 0 (argmax of equal zeros)
    mask = compare_masks(logits, run, tolerance=0.01)
    assert mask.n_changed == 8 and mask.worst_class == 1 and mask.worst_iou == pytest.approx(24 / 32)
    # a probability map whose one foreground pixel sits at a near tie (selfie segmentation, LiteRT gpu/low on
    # an H200): its flip is no lost region (the IoU over every pixel read 0.000 for class 1)
    probs = np.full((16, 16), 0.01, np.float32)
    probs[5, 5] = 0.5004
    flipped = probs.copy()
    flipped[5, 5] = 0.4998
    mask = compare_masks(probs, flipped, tolerance=0.001)
    assert (mask.n_changed, mask.n_tie_changed, mask.worst_class, mask.worst_iou) == (0, 1, -1, 1.0)


def test_declared_classification_judges_logits_and_the_summary_says_top1(tmp_path):
    """Logits are no recognisable distribution: judged by element error unless --task classification
    says they are class scores; then a changed clear decision fails and the summary's top-1 says it."""
    layers = [("data", "Input", [], (1, 3, 8, 8)), ("logits", "InnerProduct", ["data"], (1, 10))]
    data = np.zeros((1, 3, 8, 8), np.float32)
    logits = np.linspace(-2, 2, 10, dtype=np.float32).reshape(1, 10)
    flipped = logits.copy()
    flipped[0, 0] = 2.5  # the clear best class (2.0) loses to another
    write_dump(tmp_path / "ref.h5", {"data": data, "logits": logits}, layers=layers)
    write_dump(tmp_path / "run.h5", {"data": data, "logits": flipped}, layers=layers, backend="vulkan", precision="low")
    for task, top1 in ((None, None), ("classification", 0.0)):
        analysis = analyze_paths([tmp_path], task=task)
        try:
            (row,) = _summary(analysis).values()
        finally:
            analysis.close()
        if top1 is None:
            assert math.isnan(row["top1"]) and "top-1" not in row["verdict_reason"]
        else:
            assert row["top1"] == top1 and row["verdict"] == "fail" and "top-1 agreement 0%" in row["verdict_reason"]
