"""Detector heads decoded with each family's own conventions into boxes (see task.py for the layouts).

Every decoder takes the model's outputs with their size-1 axes dropped (so ncnn's missing batch axis
changes nothing), the input's height and width, the task and a score threshold, and returns the boxes a
user of that family would get after its usual post-processing (threshold, per-class NMS).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from layerdiff.analyzer.outputs.boxes import Boxes, nms
from layerdiff.analyzer.outputs.task import Task
from layerdiff.errors import InputError


def decode(task: Task, outputs: list[np.ndarray], input_hw: tuple[int, int] | None, conf: float) -> Boxes:
    """The boxes of one run: the task's decoder at score threshold `conf`."""
    if task.name == "text-det":  # one map, read in float64 where it is compared and averaged, never copied whole
        return _text_det([np.asarray(o) for o in outputs], input_hw, task, conf)
    arrays = [np.asarray(o, dtype=np.float64) for o in outputs]
    decoder = {"yolov5": _yolov5, "yolox": _yolox, "yolov8": _yolov8, "picodet": _picodet, "ssd": _ssd}[task.name]
    return nms(decoder(arrays, input_hw, task, conf), float(task.get("iou")))


def decode_at_two(task: Task, outputs: list[np.ndarray], input_hw: tuple[int, int] | None, conf: float,
                  low: float) -> tuple[Boxes, Boxes]:
    """The boxes at `conf` and at the lower threshold `low` (the boxes just under the threshold the
    comparison looks for). A DB text map is decoded once: its regions do not depend on the score threshold,
    which only drops regions by their mean probability, so the boxes at `conf` are those at `low` scoring
    at least `conf`, in the same order. Other families are decoded at each threshold (their NMS runs on
    what the threshold kept)."""
    if task.name != "text-det" or low > conf:
        return decode(task, outputs, input_hw, conf), decode(task, outputs, input_hw, low)
    everything = decode(task, outputs, input_hw, low)
    return everything.take(everything.scores >= conf), everything


def _one(arrays: list[np.ndarray], task: Task, ndim: int = 2) -> np.ndarray:
    """The single head a YOLO task reads: the largest output of `ndim` dimensions."""
    heads = [a for a in arrays if a.ndim == ndim]
    if not heads:
        raise InputError(f"--task {task.text}: no output has {ndim} non-trivial axes "
                             f"(shapes {[list(a.shape) for a in arrays]})")
    return max(heads, key=lambda a: a.size)


def _xywh_boxes(xywh: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> Boxes:
    cx, cy, w, h = xywh.T
    return Boxes(np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1), scores, classes)


SINGLE_HEAD = ("yolov5", "yolox", "yolov8", "text-det")  # tasks that read one output (outputs/pick.py picks it)


def grid_cells(input_hw: tuple[int, int], strides: list[int], ceil: bool = False) -> int:
    """Grid cells of an input at these strides (the feature map of stride s is H // s x W // s, or
    rounded up for an input that is not a multiple of the stride)."""
    return sum(_side(input_hw[0], s, ceil) * _side(input_hw[1], s, ceil) for s in strides)


def _side(size: int, stride: int, ceil: bool) -> int:
    return -(-size // stride) if ceil else size // stride


def image_of_input(map_hw: tuple[int, ...], input_hw: tuple[int, int]) -> bool:
    """Whether a [H, W] map can be an image of the input: the same scale on both axes, each side off by at
    most the one pixel a rounded-down or rounded-up resize gives (a mask at 1/4 of 801x600 is 200x150 or 201x150)."""
    (h, w), (height, width) = map_hw[-2:], input_hw
    return abs(h / height - w / width) <= 1 / height + 1 / width


def anchor_counts(input_hw: tuple[int, int], per_cell: int) -> set[int]:
    """The row counts a YOLO head of this input can have: `per_cell` predictions per grid cell at strides
    8/16/32 (or 8/16/32/64, the P6 models), feature maps rounded down or up."""
    return {per_cell * grid_cells(input_hw, strides, ceil) for strides in ([8, 16, 32], [8, 16, 32, 64])
            for ceil in (False, True)}


def _columns(head: np.ndarray, task: Task, family: str) -> None:
    """Refuse a head that is not [N, 5 + C] (with C = the `classes` option when given)."""
    classes = int(task.get("classes") or 0)
    if head.ndim == 2 and head.shape[1] > head.shape[0]:
        raise InputError(f"--task {task.text}: this head is {list(head.shape)}, more columns than rows: boxes and "
                         f"class scores down the rows, anchors across ([4 + C, N], YOLOv8's layout: use --task yolov8); "
                         f"a {family} head is [anchors, 5 + C]")
    if head.ndim != 2 or head.shape[1] < 6 or (classes and head.shape[1] != 5 + classes):
        expected = f"5 + {classes} = {5 + classes}" if classes else "5 + classes (6 or more)"
        raise InputError(f"--task {task.text}: a {family} head is [anchors, {expected}] (box, objectness, "
                         f"class scores), this output is {list(head.shape)}")


def _yolov5(arrays, input_hw, task: Task, conf: float) -> Boxes:
    """[N, 5 + C]: centre box, objectness, class scores; score = objectness x best class score."""
    head = _one(arrays, task)
    _columns(head, task, "YOLOv5")
    if input_hw is not None and len(head) not in anchor_counts(input_hw, 3):
        if len(head) in anchor_counts(input_hw, 1):
            raise InputError(f"--task {task.text}: this head has {len(head)} rows, one per grid cell of a "
                             f"{input_hw[0]}x{input_hw[1]} input (an anchor-free YOLOX layout, raw grid offsets); "
                             "YOLOv5 has 3 anchors per cell with decoded boxes: use --task yolox")
        raise InputError(f"--task {task.text}: this output is {list(head.shape)}; {len(head)} rows fit no YOLOv5 anchor "
                         f"layout of a {input_hw[0]}x{input_hw[1]} input (3 anchors per grid cell at strides "
                         f"8/16/32: {3 * grid_cells(input_hw, [8, 16, 32])} rows)")
    cls = head[:, 5:]
    classes = np.argmax(cls, axis=1)
    scores = head[:, 4] * cls[np.arange(len(head)), classes]
    keep = scores >= conf
    return _xywh_boxes(head[keep, :4], scores[keep], classes[keep])


def _yolox(arrays, input_hw, task: Task, conf: float) -> Boxes:
    """A raw YOLOX grid head [N, 5 + C] (exported without decoding): one row per grid cell, strides finest
    first, cells row by row; box = ((x, y) + cell) x stride, size = exp(w, h) x stride; objectness and
    class scores already sigmoided; score = objectness x best class score (YOLOX's demo decoding)."""
    head = _one(arrays, task)
    _columns(head, task, "YOLOX")
    if input_hw is None:
        raise InputError(f"--task {task.text}: the input's height and width are unknown (no input in the dump); "
                         "YOLOX's grid follows from them")
    strides = sorted(int(s) for s in str(task.get("strides")).replace(",", "/").split("/") if s)
    cells = grid_cells(input_hw, strides)
    ceil = len(head) != cells and len(head) == grid_cells(input_hw, strides, ceil=True)
    cells = grid_cells(input_hw, strides, ceil)
    if len(head) != cells:
        raise InputError(f"--task {task.text}: this head has {len(head)} rows, but a {input_hw[0]}x{input_hw[1]} "
                         f"input has {cells} grid cells at strides {'/'.join(map(str, strides))} (one row per "
                         "cell in a YOLOX head)")
    grid, stride = yolox_grid(input_hw, strides, ceil)
    xy = (head[:, :2] + grid) * stride[:, None]
    with np.errstate(over="ignore"):
        wh = np.exp(head[:, 2:4]) * stride[:, None]
    cls = head[:, 5:]
    classes = np.argmax(cls, axis=1)
    scores = head[:, 4] * cls[np.arange(len(head)), classes]
    keep = scores >= conf
    return _xywh_boxes(np.concatenate([xy, wh], axis=1)[keep], scores[keep], classes[keep])


def yolox_grid(input_hw: tuple[int, int], strides: list[int], ceil: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(cell x, y per row, stride per row) of a YOLOX head, in its order: per stride, row by row."""
    grids, per_row = [], []
    for s in strides:
        h, w = _side(input_hw[0], s, ceil), _side(input_hw[1], s, ceil)
        ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        grids.append(np.stack([xs.reshape(-1), ys.reshape(-1)], axis=1))
        per_row.append(np.full(h * w, s))
    return np.concatenate(grids).astype(np.float64), np.concatenate(per_row).astype(np.float64)


def _yolov8(arrays, input_hw, task: Task, conf: float) -> Boxes:
    """[4 + C, N] (as exported) or [N, 4 + C]: centre box then class scores, no objectness."""
    head = _one(arrays, task)
    if head.shape[0] < head.shape[1]:
        head = head.T  # anchors are the longer axis
    if head.shape[1] < 5:
        raise InputError(f"--task {task.text}: a YOLOv8 head is [4 + classes, anchors], this output is {list(head.shape)}")
    if input_hw is not None and len(head) not in anchor_counts(input_hw, 1):
        raise InputError(f"--task {task.text}: this output has {len(head)} anchors, but a {input_hw[0]}x{input_hw[1]} "
                         f"input has {grid_cells(input_hw, [8, 16, 32])} grid cells at strides 8/16/32 (a YOLOv8 "
                         "head has one prediction per cell)")
    cls = head[:, 4:]
    classes = np.argmax(cls, axis=1)
    scores = cls[np.arange(len(head)), classes]
    keep = scores >= conf
    return _xywh_boxes(head[keep, :4], scores[keep], classes[keep])


def check_reference(task: Task, outputs: list[np.ndarray], input_hw: tuple[int, int] | None) -> None:
    """Refuse a head the task would misread, by a fact of the family's own decoding checked on the
    reference's outputs (the run compared with it may be broken: that is a failure, not a refusal)."""
    if task.name == "yolov8" and input_hw is not None:
        _anchors_inside_their_boxes(_one([np.asarray(o, dtype=np.float64) for o in outputs], task), input_hw, task)


def _anchors_inside_their_boxes(head: np.ndarray, input_hw: tuple[int, int], task: Task) -> None:
    """YOLOv8 decodes each box as non-negative distances from its anchor point to the four edges, so every
    box contains its anchor point. A head whose boxes mostly do not holds no decoded boxes in pixels (a raw
    YOLOX grid head of the same row count reads as tiny boxes in the top-left corner)."""
    if head.shape[0] < head.shape[1]:
        head = head.T
    points = _anchor_points(input_hw, len(head))
    if head.shape[1] < 5 or points is None:
        return  # the decoder refuses this shape in its own words
    cx, cy, w, h = head[:, :4].T
    slack = max(1.0, 0.01 * max(input_hw))
    inside = (np.abs(cx - points[:, 0]) <= np.abs(w) / 2 + slack) & (np.abs(cy - points[:, 1]) <= np.abs(h) / 2 + slack)
    if inside.mean() < 0.5:
        raise InputError(f"--task {task.text}: in the reference only {inside.mean():.0%} of the {len(head)} boxes contain "
                         "their anchor point, which every YOLOv8 box does (its edges are non-negative distances from "
                         "it): the first four columns are not boxes in pixels; a raw grid head with objectness "
                         "[cells, 5 + C] is YOLOX's layout: use --task yolox")


def _anchor_points(input_hw: tuple[int, int], rows: int) -> np.ndarray | None:
    """The anchor point (cell centre, pixels) of each row of a one-per-cell head of `rows` rows, or None
    when no stride layout of the input has that many cells."""
    for strides in ([8, 16, 32], [8, 16, 32, 64]):
        for ceil in (False, True):
            if grid_cells(input_hw, strides, ceil) == rows:
                grid, stride = yolox_grid(input_hw, strides, ceil)
                return (grid + 0.5) * stride[:, None]
    return None


def _picodet(arrays, input_hw, task: Task, conf: float) -> Boxes:
    """Per stride a score tensor [N, C] and a distance distribution [N, 4 (reg_max + 1)] (GFL)."""
    if input_hw is None:
        raise InputError(f"--task {task.text}: the input's height and width are unknown (no input layer in the dump)")
    bins = int(task.get("reg_max")) + 1
    strides = sorted(int(s) for s in str(task.get("strides")).replace(",", "/").split("/") if s)
    levels = _picodet_levels(arrays, bins, task)
    found = []
    for (scores, dist), stride in zip(levels, strides):
        width = math.ceil(input_hw[1] / stride)
        index = np.arange(len(scores))
        cx, cy = (index % width + 0.5) * stride, (index // width + 0.5) * stride
        classes = np.argmax(scores, axis=1)
        best = scores[index, classes]
        keep = best >= conf
        prob = _softmax(dist[keep].reshape(-1, 4, bins))
        l, t, r, b = (prob @ np.arange(bins) * stride).T
        xyxy = np.stack([cx[keep] - l, cy[keep] - t, cx[keep] + r, cy[keep] + b], axis=1)
        found.append(Boxes(xyxy, best[keep], classes[keep]))
    return Boxes(np.concatenate([f.xyxy for f in found]), np.concatenate([f.scores for f in found]),
                 np.concatenate([f.classes for f in found]))


def _picodet_levels(arrays, bins: int, task: Task) -> list[tuple[np.ndarray, np.ndarray]]:
    """(scores, distribution) per level, finest first: outputs paired by their anchor count; in a pair the
    distribution is the one 4 x bins wide whose values are not all probabilities."""
    by_count: dict[int, list[np.ndarray]] = {}
    for a in arrays:
        if a.ndim == 2:
            by_count.setdefault(a.shape[0], []).append(a)
    levels = []
    for count in sorted(by_count, reverse=True):
        group = by_count[count]
        dists = [a for a in group if a.shape[1] == 4 * bins and not (a.min() >= 0 and a.max() <= 1)]
        scores = [a for a in group if all(a is not d for d in dists)]
        if len(dists) != 1 or len(scores) != 1:
            raise InputError(f"--task {task.text}: the outputs with {count} anchors are not one score tensor "
                                 f"and one {4 * bins}-wide distance distribution (shapes {[list(a.shape) for a in group]})")
        levels.append((scores[0], dists[0]))
    if not levels:
        raise InputError(f"--task {task.text}: no [anchors, width] outputs (shapes {[list(a.shape) for a in arrays]})")
    return levels


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _ssd(arrays, input_hw, task: Task, conf: float) -> Boxes:
    """Decoded boxes [N, 4] (x0, y0, x1, y1) and class scores [N, C] (or [C, N]) of the same N."""
    boxes = [a for a in arrays if a.ndim == 2 and a.shape[1] == 4]
    if not boxes:
        raise InputError(f"--task {task.text}: no [N, 4] box output (shapes {[list(a.shape) for a in arrays]})")
    xyxy = boxes[0]
    rest = [a for a in arrays if a is not xyxy and xyxy.shape[0] in a.shape]
    if not rest:
        raise InputError(f"--task {task.text}: no score output with {xyxy.shape[0]} boxes")
    scores = rest[0] if rest[0].ndim == 1 else (rest[0] if rest[0].shape[0] == xyxy.shape[0] else rest[0].T)
    scores = scores.reshape(len(xyxy), -1)
    classes = np.argmax(scores, axis=1)
    best = scores[np.arange(len(xyxy)), classes]
    keep = best >= conf
    return Boxes(xyxy[keep], best[keep], classes[keep])


def _text_det(arrays, input_hw, task: Task, conf: float) -> Boxes:
    """DB text detection: regions of the probability map above `thresh`; a region's score is its mean
    probability (PP-OCR's box score), kept when >= conf and at least `min_area` pixels."""
    prob = _one(arrays, task)
    if input_hw is not None and not image_of_input(prob.shape, input_hw):
        raise InputError(f"--task {task.text}: a DB probability map is an image of the {input_hw[0]}x{input_hw[1]} input "
                         f"(its size or a scaled copy), this output is {list(prob.shape)}")
    above = np.greater(prob, float(task.get("thresh")), signature=(np.float64, np.float64, np.bool_))  # as in float64
    regions = _text_regions(prob, above, int(task.get("min_area")))
    return regions.take(regions.scores >= conf)


class _Runs(NamedTuple):
    """The horizontal runs of a 2-D boolean map, in row-major order, with their 4-connected region."""

    rows: np.ndarray  # the run's row
    first: np.ndarray  # its first column
    end: np.ndarray  # one past its last column
    region: np.ndarray  # its region's label: the region's first pixel's flat index + 1 (row-major)


def _text_regions(prob: np.ndarray, mask: np.ndarray, min_area: int) -> Boxes:
    """Every region of `mask` of at least `min_area` pixels, by ascending label: its box (x0, y0, x1, y1)
    and its score, the mean of `prob` over its pixels taken in row-major order. Worked out from the runs:
    the pixels are gathered region by region with one index over the foreground, so the map is not
    labelled pixel by pixel and no region is looked up in the whole map."""
    runs = _labelled_runs(mask)
    if runs.rows.size == 0:
        return Boxes.empty()
    lengths = runs.end - runs.first
    order = np.argsort(runs.region, kind="stable")  # runs by region; row-major within a region
    starts_in_foreground = np.cumsum(lengths) - lengths  # where each run's pixels begin in prob[mask]
    sorted_lengths = lengths[order]
    pixel = (np.repeat(starts_in_foreground[order] - (np.cumsum(sorted_lengths) - sorted_lengths), sorted_lengths)
             + np.arange(int(sorted_lengths.sum())))
    values = np.asarray(prob[mask][pixel], dtype=np.float64)  # each region's pixels together, row-major within it
    region = runs.region[order]
    group = np.flatnonzero(np.r_[True, region[1:] != region[:-1]])  # each region's first run
    area = np.add.reduceat(sorted_lengths, group)
    at = np.cumsum(area) - area  # each region's first pixel in `values`
    xyxy = np.stack([np.minimum.reduceat(runs.first[order], group), np.minimum.reduceat(runs.rows[order], group),
                     np.maximum.reduceat(runs.end[order], group), np.maximum.reduceat(runs.rows[order], group) + 1],
                    axis=1).astype(np.float64)
    big = area >= min_area
    scores = np.array([float(values[a:a + n].mean()) for a, n in zip(at[big].tolist(), area[big].tolist())])
    return Boxes(xyxy[big], scores, np.zeros(int(big.sum()), dtype=np.int64))


def components(mask: np.ndarray) -> np.ndarray:
    """4-connected component labels of a boolean map (0 = background); a region's label is its first
    pixel's flat index + 1 (row-major)."""
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"components: a 2-D map, not {mask.ndim}-D")
    runs = _labelled_runs(mask)
    labels = np.zeros(mask.size, dtype=np.int64)
    labels[mask.reshape(-1)] = np.repeat(runs.region, runs.end - runs.first)  # foreground pixels in run order
    return labels.reshape(mask.shape)


def _labelled_runs(mask: np.ndarray) -> _Runs:
    """The runs of a 2-D boolean map and their regions. Numpy only: the horizontal runs of each row are
    the units (found from where the flattened map switches on and off), runs of adjacent rows whose
    columns overlap are joined (min-label propagation with pointer jumping over the run graph, a few
    passes over a few thousand runs rather than over every pixel of the map)."""
    height, width = mask.shape
    stride = width + 1  # each row followed by one background pixel: no run crosses a row's end
    padded = np.zeros((height, stride), dtype=np.int8)
    padded[:, :width] = mask
    steps = np.diff(padded.reshape(-1), prepend=np.int8(0))
    starts = np.flatnonzero(steps == 1)  # a run's first pixel, in the padded numbering
    ends = np.flatnonzero(steps == -1)  # one past its last pixel
    rows = starts // stride
    first = starts - rows * stride
    upper, lower = _touching_runs(starts, ends, rows, stride)
    root = np.arange(starts.size)
    if upper.size:
        while True:
            joined = np.minimum(root[upper], root[lower])
            updated = root.copy()
            np.minimum.at(updated, upper, joined)
            np.minimum.at(updated, lower, joined)
            updated = updated[updated]
            if np.array_equal(updated, root):
                break
            root = updated
    smallest = np.full(starts.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(smallest, root, rows * width + first)
    return _Runs(rows, first, ends - rows * stride, smallest[root] + 1)


def _touching_runs(starts: np.ndarray, ends: np.ndarray, rows: np.ndarray, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(upper, lower) run indices of every pair of runs in adjacent rows that share a column. Runs are
    disjoint and in row-major order, so the runs of the row above that a run touches are one contiguous
    range: those ending after its first column and starting before its end."""
    below = np.flatnonzero(rows > 0)
    if below.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = np.searchsorted(ends, starts[below] - stride, side="right")
    last = np.searchsorted(starts, ends[below] - stride, side="left")
    counts = np.maximum(last - first, 0)
    lower = np.repeat(below, counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    upper = np.repeat(first, counts) + offsets
    return upper, lower
