"""Declared tasks read the output they can explain and refuse the ones they cannot: landmarks on
mediapipe's pose and face landmark models (LiteRT), a segmentation that picks the pose model's mask and
not its heatmaps, YOLOX grid heads decoded as YOLOX decodes them, embeddings by cosine similarity.
Every expectation is computed here with numpy from the dumped outputs, outside layerdiff."""
from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerdiff.analyzer.analysis import analyze_paths
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.analyzer.outputs.boxes import Boxes, nms
from layerdiff.analyzer.outputs.detection import decode
from layerdiff.analyzer.outputs.task import parse_task
from layerdiff.collector.inputs.inputset import InputSet
from layerdiff.collector.inputs.modelfiles import input_shapes, resolve_model
from layerdiff.collector.run.pipeline import RunSpec, collect_run
from layerdiff.collector.transport.devices import LocalDevice
from layerdiff.errors import InputError
from tests.analyze_dumps import write_dump
from tests.litert_models import image_input

POSE = "mediapipe/modules/pose_landmark/pose_landmark_full.tflite"
FACE = "mediapipe/modules/face_landmark/face_landmark.tflite"
SHIFT = 6  # pixels the picture moves in the "moved" runs


def _model(member: str) -> Path:
    path = Path(importlib.metadata.distribution("mediapipe").locate_file(member))
    assert path.is_file(), f"mediapipe does not ship {member} (tests/corpus-wheels.txt pins 0.10.14)"
    return path


def _collect(member: str, image: np.ndarray, out: Path, precision: str = "high") -> Path:
    model = resolve_model(_model(member))
    (name,) = input_shapes(model)
    outcome = collect_run(LocalDevice(), RunSpec(model, "cpu", precision, InputSet("picture", {name: image}, "test")), out)
    assert outcome.status == "done", outcome.message
    return outcome.paths[0]


def _as_input_of(run: Path, golden: Path) -> Path:
    """A run on a moved picture, labelled as a run on the golden's: what an engine whose landmarks moved gives."""
    with h5py.File(golden, "r") as g, h5py.File(run, "r+") as f:
        f.attrs["input_sha256"] = g.attrs["input_sha256"]
    return run


def _tensor(path: Path, name: str) -> np.ndarray:
    with DumpFile(path) as dump:
        layers = dump.layers
        return dump.tensor(int(layers.loc[layers["name"] == name, "order"].iloc[-1]))


def _judged(paths: list[Path], ref: Path, task: str) -> tuple[dict, object]:
    analysis = analyze_paths(paths, ref=ref, task=task)
    try:
        (row,) = [r for r in analysis.summary.to_dict("records") if r["role"] == "compared"]
        said = [f for f in analysis.findings if f.kind == "output_decision"]
        return row, (said[0] if said else None)
    finally:
        analysis.close()


def _moved(ref: np.ndarray, run: np.ndarray, dims: int, points: int, px: float) -> list[int]:
    a, b = ref.reshape(-1, dims)[:points], run.reshape(-1, dims)[:points]
    return [i for i, d in enumerate(np.hypot(*(b[:, :2] - a[:, :2]).T)) if d > px]


@pytest.fixture(scope="module")
def pose(tmp_path_factory):
    work = tmp_path_factory.mktemp("pose")
    picture = image_input((1, 256, 256, 3))
    golden = _collect(POSE, picture, work / "golden")
    moved = _as_input_of(_collect(POSE, np.roll(picture, SHIFT, axis=2), work / "moved"), golden)
    return golden, moved


def test_pose_landmarks_that_moved_are_counted_in_pixels(pose):
    golden, moved = pose
    expect = _moved(_tensor(golden, "Identity"), _tensor(moved, "Identity"), 5, 33, 2.0)
    assert expect, "the moved picture must move some body landmark by more than 2 px"
    row, said = _judged([golden, moved], golden, "landmarks:Identity,points=33")
    assert row["verdict"] == "fail", row["verdict_reason"]
    assert f"{len(expect)} of 33 landmarks of Identity:0 moved more than 2 px" in row["verdict_reason"]
    assert said.numbers["moved_landmarks"] == expect and said.numbers["dims"] == 5


def test_pose_landmarks_are_picked_by_shape_and_an_unchanged_run_passes(pose, tmp_path):
    golden, _ = pose
    with DumpFile(golden) as dump:  # the TFLite subgraph's outputs, as LiteRT's dump declares them
        assert json.loads(dump.attrs["outputs"]) == ["Identity", "Identity_1", "Identity_2", "Identity_3", "Identity_4"]
    again = _collect(POSE, image_input((1, 256, 256, 3)), tmp_path / "again")
    row, said = _judged([golden, again], golden, "landmarks")
    assert said.layer == "Identity:0"  # the [1, 195] list, not the world landmarks nor the flag
    assert said.numbers["points"] == 39 and said.numbers["worst_px"] == 0.0
    assert row["verdict"] == "pass", row["verdict_reason"]


def test_segmentation_reads_the_pose_mask_not_its_heatmaps(pose):
    """The pose model's largest output is its heatmaps [1, 64, 64, 39] (NHWC); the mask is [1, 256, 256, 1]."""
    golden, moved = pose
    a, b = _tensor(golden, "Identity_2")[0, :, :, 0] > 0, _tensor(moved, "Identity_2")[0, :, :, 0] > 0
    changed = int((a != b).sum())
    row, said = _judged([golden, moved], golden, "segmentation")
    assert said.layer == "Identity_2:0", said.sentence
    assert said.numbers["pixels"] == 256 * 256
    assert said.numbers["changed"] + said.numbers["tie_changed"] == changed  # near-tie flips told apart
    assert changed > 0.01 * a.size and said.numbers["changed"] > 0.01 * said.numbers["decided"]
    assert row["verdict"] == "fail", row["verdict_reason"]


def test_segmentation_refuses_an_output_that_is_not_a_mask(pose):
    golden, moved = pose
    row, said = _judged([golden, moved], golden, "segmentation:Identity")
    assert said.numbers["status"] == "error"
    assert "output Identity:0 [1, 195] is not a mask" in said.sentence
    assert row["verdict"] != "pass"


def test_a_detector_task_on_the_pose_model_is_refused_not_decoded(pose):
    """No pose output is a detector head: read as one, its 256 x 256 mask gave 121 'lost' boxes of class 250."""
    golden, moved = pose
    for task, why in (("yolov5", "256 rows fit no YOLOv5 anchor layout of a 256x256 input"),
                      ("yolov8", "256 anchors, but a 256x256 input has 1344 grid cells")):
        row, said = _judged([golden, moved], golden, task)
        assert said.numbers["status"] == "error" and why in said.sentence, said.sentence
        assert "box(es)" not in row["verdict_reason"]


def test_face_mesh_landmarks_three_values_each(tmp_path):
    picture = image_input((1, 192, 192, 3), seed=3)
    golden = _collect(FACE, picture, tmp_path / "golden")
    moved = _as_input_of(_collect(FACE, np.roll(picture, SHIFT, axis=1), tmp_path / "moved"), golden)
    expect = _moved(_tensor(golden, "conv2d_21"), _tensor(moved, "conv2d_21"), 3, 468, 2.0)
    row, said = _judged([golden, moved], golden, "landmarks")
    assert said.layer == "conv2d_21:0" and said.numbers["dims"] == 3 and said.numbers["points"] == 468
    assert said.numbers["moved_landmarks"] == expect[:50] and said.numbers["moved"] == len(expect)
    assert row["verdict"] == ("fail" if expect else "pass"), row["verdict_reason"]


# YOLOX: no YOLOX model ships in an installable wheel here, so its decoder is held against YOLOX's own
# decoding written out in numpy below, on a head with the layout YOLOX exports (grid cells in order).

def _yolox_head(hw: tuple[int, int], boxes: list[tuple[int, int, int, float, float, float, float, int]],
                classes: int = 3, seed: int = 0) -> np.ndarray:
    """[cells, 5 + classes]: low objectness background; each box (stride, gx, gy, dx, dy, log w, log h, class)
    set at its grid cell with high objectness."""
    rng = np.random.default_rng(seed)
    strides = (8, 16, 32)
    sizes = [(hw[0] // s, hw[1] // s) for s in strides]
    head = rng.uniform(0, 0.05, (sum(h * w for h, w in sizes), 5 + classes)).astype(np.float32)
    head[:, :4] = rng.normal(0, 0.5, (len(head), 4))
    starts = dict(zip(strides, np.cumsum([0] + [h * w for h, w in sizes])[:-1]))
    for stride, gx, gy, dx, dy, lw, lh, cls in boxes:
        row = starts[stride] + gy * (hw[1] // stride) + gx
        head[row, :5] = dx, dy, lw, lh, 0.9
        head[row, 5 + cls] = 0.95
    return head


def _numpy_yolox(head: np.ndarray, hw: tuple[int, int], conf: float) -> np.ndarray:
    """YOLOX's demo_postprocess + score filter, in numpy (xyxy of the boxes scoring >= conf)."""
    grids, strides = [], []
    for s in (8, 16, 32):
        hs, ws = hw[0] // s, hw[1] // s
        xv, yv = np.meshgrid(np.arange(ws), np.arange(hs))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((hs * ws, 1), s))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    xy = (head[:, :2] + grid) * stride
    wh = np.exp(head[:, 2:4]) * stride
    score = head[:, 4] * head[:, 5:].max(axis=1)
    keep = score >= conf
    return np.concatenate([xy - wh / 2, xy + wh / 2], axis=1)[keep]


def test_yolox_decoder_matches_yolox_own_decoding():
    hw = (64, 96)
    boxes = [(8, 3, 2, 0.5, 0.25, 1.2, 0.8, 0), (16, 4, 1, 0.1, 0.9, 0.3, 0.5, 2), (32, 2, 1, 0.5, 0.5, 0.7, 0.1, 1)]
    head = _yolox_head(hw, boxes)
    got = decode(parse_task("yolox"), [head], hw, 0.3)
    expect = _numpy_yolox(head.astype(np.float64), hw, 0.3)
    assert len(got) == len(expect) == 3
    order = np.lexsort(got.xyxy.T[::-1]), np.lexsort(expect.T[::-1])
    np.testing.assert_allclose(got.xyxy[order[0]], expect[order[1]], rtol=1e-6)


def test_yolov5_refuses_a_yolox_grid_head_and_yolox_refuses_a_head_of_another_size():
    hw = (64, 96)
    head = _yolox_head(hw, [(8, 3, 2, 0.5, 0.25, 1.2, 0.8, 0)])
    with pytest.raises(InputError, match="one per grid cell .* use --task yolox"):
        decode(parse_task("yolov5"), [head], hw, 0.25)
    with pytest.raises(InputError, match="input has 126 grid cells at strides 8/16/32"):
        decode(parse_task("yolox"), [head[:-1]], hw, 0.3)
    with pytest.raises(InputError, match=r"\[anchors, 5 \+ 80 = 85\]"):
        decode(parse_task("yolox:classes=80"), [head], hw, 0.3)


def _head_dump(path: Path, head: np.ndarray, hw: tuple[int, int], **attrs) -> Path:
    layers = [("data", "Input", [], (1, 3, *hw)), ("head", "Concat", ["data"], (1, *head.shape)),
              ("aux", "Sigmoid", ["data"], (1, 4))]
    data = np.random.default_rng(9).normal(size=(1, 3, *hw)).astype(np.float32)
    aux = np.full((1, 4), 0.5, np.float32)
    return write_dump(path, {"data": data, "head": head[None], "aux": aux}, layers=layers, **attrs)


def test_a_moved_yolox_box_fails_and_yolov5_on_it_is_refused_not_misread(tmp_path):
    hw = (64, 96)
    boxes = [(8, 3, 2, 0.5, 0.25, 1.2, 0.8, 0), (16, 4, 1, 0.1, 0.9, 0.3, 0.5, 2)]
    head = _yolox_head(hw, boxes)
    moved = _yolox_head(hw, [boxes[0], (16, 4, 1, 0.2, 0.9, 0.3, 0.5, 2)])  # box 2 moves by 1.6 px: IoU 0.86
    _head_dump(tmp_path / "ref.h5", head, hw)
    _head_dump(tmp_path / "run.h5", moved, hw, backend="vulkan", precision="low")
    row, said = _judged([tmp_path], tmp_path / "ref.h5", "yolox:head")
    assert row["verdict"] == "fail" and "1 of 2 box(es) moved" in row["verdict_reason"], row["verdict_reason"]
    assert "(decoded from head:0)" in said.sentence
    row, said = _judged([tmp_path], tmp_path / "ref.h5", "yolov5")
    assert said.numbers["status"] == "error" and "use --task yolox" in said.sentence
    assert "box(es) kept" not in row["verdict_reason"]


def test_a_task_naming_an_output_the_model_lacks_lists_the_outputs(tmp_path):
    hw = (64, 96)
    head = _yolox_head(hw, [(8, 3, 2, 0.5, 0.25, 1.2, 0.8, 0)])
    _head_dump(tmp_path / "ref.h5", head, hw)
    _head_dump(tmp_path / "run.h5", head, hw, backend="vulkan")
    row, said = _judged([tmp_path], tmp_path / "ref.h5", "yolox:nothing")
    assert "the model has no output 'nothing' (outputs: head:0 [1, 126, 8], aux:0 [1, 4])" in said.sentence
    assert row["verdict"] == "warn" and "not applied" in row["verdict_reason"]


MAGIKA_MEMBER = "magika/models/standard_v3_3/model.onnx"


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def magika(tmp_path_factory):
    """magika's content-type model (its output: a score per content type) on ONNX Runtime twice, on MNN
    (whose x86 build mislays a packed tensor inside the network, tests/test_layouts.py), and on another
    file labelled as the same input: an output that really changed."""
    from layerdiff.samples.onnx_emit import convert_many

    work = tmp_path_factory.mktemp("magika")
    onnx_path = work / "magika.onnx"
    onnx_path.write_bytes(Path(importlib.metadata.distribution("magika").locate_file(MAGIKA_MEMBER)).read_bytes())
    convert_many([(onnx_path, work / "magika.mnn", False)])
    text = Path(__file__).read_bytes()  # a Python file, as magika reads one: its first and last 1024 bytes
    ids = np.concatenate([np.frombuffer(text[:1024], np.uint8), np.frombuffer(text[-1024:], np.uint8)])
    other = _model(FACE).read_bytes()  # a binary model file: another content type
    other_ids = np.concatenate([np.frombuffer(other[:1024], np.uint8), np.frombuffer(other[-1024:], np.uint8)])
    runs = {}
    for label, model, ids_fed in (("golden", onnx_path, ids), ("again", onnx_path, ids), ("mnn", work / "magika.mnn", ids),
                                  ("other", onnx_path, other_ids)):
        inputs = {"bytes": ids_fed.astype(np.int32)[None]}
        spec = RunSpec(resolve_model(model), "cpu", "high", InputSet("source", inputs, "source"))
        outcome = collect_run(LocalDevice(), spec, work / label)
        assert outcome.status == "done", outcome.message
        runs[label] = outcome.paths[0]
    _as_input_of(runs["other"], runs["golden"])
    return runs


def test_embedding_is_judged_by_cosine_similarity(magika):
    golden = _tensor(magika["golden"], "target_label")
    judged = {}
    for label in ("again", "mnn", "other"):
        cos = _cosine(golden, _tensor(magika[label], "target_label"))
        expect = "fail" if cos < 0.99 else ("warn" if cos < 0.999 else "pass")
        row, said = _judged([magika["golden"], magika[label]], magika["golden"], "embedding")
        assert said.layer == "target_label:0"
        assert said.numbers["min_cosine"] == pytest.approx(cos, abs=1e-9)
        assert said.numbers["status"] == expect, (label, cos, said.sentence)
        judged[label] = row["verdict"]
        assert f"cosine similarity of the embedding target_label:0 to the reference: {cos:.6f}" in said.sentence
    assert judged["again"] == "pass" and judged["other"] == "fail"
    assert judged["mnn"] != "fail"  # its layers break, but its output keeps its direction: a warning, not a fail


def test_a_mask_is_read_in_the_axis_order_the_dump_records():
    from layerdiff.analyzer.measure.classes import squeezed
    from layerdiff.analyzer.outputs.pick import Output, spatial

    chw = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)
    cases = {"NCHW": chw[None], "NHWC": np.moveaxis(chw, 0, -1)[None], "": chw}  # ONNX, TFLite, ncnn (no batch)
    for layout, dumped in cases.items():
        ref, _run = spatial(Output("m:0", "m", squeezed(dumped), squeezed(dumped), dumped.shape, layout))
        np.testing.assert_array_equal(ref, chw)
    flat = np.zeros((1, 195), np.float32)
    assert spatial(Output("l:0", "l", squeezed(flat), squeezed(flat), flat.shape, "")) is None


HAND = "mediapipe/modules/hand_landmark/hand_landmark_lite.tflite"


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    """mediapipe's hand landmark model: 21 landmarks in pixels (`Identity` [1, 63]) and the same 21 in metres
    (`Identity_3` [1, 63]), beside a presence score and the handedness."""
    work = tmp_path_factory.mktemp("hand")
    picture = image_input((1, 224, 224, 3))
    golden = _collect(HAND, picture, work / "golden")
    moved = _as_input_of(_collect(HAND, np.roll(picture, SHIFT, axis=2), work / "moved"), golden)
    return golden, moved


def test_landmarks_refuses_two_outputs_of_the_same_size_instead_of_reading_metres_as_pixels(hand):
    golden, moved = hand
    pixels, metres = _tensor(golden, "Identity"), _tensor(golden, "Identity_3")
    assert pixels.size == metres.size == 63
    assert np.abs(metres).max() < 1 < np.abs(pixels).max()  # world landmarks never move 2 "px"
    row, said = _judged([golden, moved], golden, "landmarks")
    assert said.numbers["status"] == "error", said.sentence
    assert "2 outputs fit a landmark list" in said.sentence and "Identity:0 [1, 63], Identity_3:0 [1, 63]" in said.sentence
    assert "--task landmarks:OUTPUT" in said.sentence
    assert row["verdict"] != "pass" and "within" not in row["verdict_reason"]


def test_landmarks_named_on_the_hand_model_count_pixels(hand):
    golden, moved = hand
    expect = _moved(_tensor(golden, "Identity"), _tensor(moved, "Identity"), 3, 21, 2.0)
    row, said = _judged([golden, moved], golden, "landmarks:Identity")
    assert said.layer == "Identity:0" and said.numbers["dims"] == 3 and said.numbers["points"] == 21
    assert said.numbers["moved_landmarks"] == expect
    assert row["verdict"] == ("fail" if expect else said.numbers["status"]), row["verdict_reason"]
