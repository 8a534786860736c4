"""The declared task of a model's outputs (`--task`): which decoder reads them, with which conventions.

A task is `NAME[:OUTPUT][,key=value,...]`, e.g. `picodet`, `yolov5:conf=0.4`, `yolox:output,conf=0.3`,
`segmentation:output=Identity_2`. OUTPUT (or `output=NAME`) names the model output the task reads (its
tensor name or layer key); without it each task picks the output by its shape (outputs/pick.py) and
says which. The names are the families whose outputs a user reads as decisions rather than numbers:

  classification  class scores (logits or probabilities): top-1 / top-5 over the last axis
  yolov5          one [N, 5 + C] head: cx, cy, w, h, objectness, C class scores (sigmoided)
  yolox           one raw grid head [N, 5 + C], one row per grid cell of strides 8/16/32 (row-major, finest
                  stride first): x, y offsets in cells, log w, log h, objectness, C class scores
  yolov8          one [4 + C, N] head (or [N, 4 + C]): cx, cy, w, h, C class scores
  picodet         per stride, scores [N, C] and a box distribution [N, 4 x (reg_max + 1)] (GFL/DFL)
  ssd             decoded boxes [N, 4] (x0, y0, x1, y1) and scores [N, C]
  text-det        a DB text-probability map [H, W]: boxes of the regions above `thresh`
  segmentation    per-pixel class scores [N, C, H, W] or [N, H, W, C] (argmax, the axis order the dump
                  records), or one probability map [H, W]
  landmarks       keypoints [K x D] in input pixels (x, y first): how many moved more than `px` pixels
  embedding       an embedding vector per row: the cosine similarity of the run's to the reference's
  language-model  next-token logits [positions, vocabulary]: the next token kept, and the KL divergence
                  of the run's distribution from the reference's (llama.cpp's own quantisation yardstick);
                  a ggml run's `result_output` is read this way without being told
  regression      every element is the result: the scale-aware element error, no decision

Options every detector takes: conf (score threshold), iou (NMS IoU), moved (a matched box whose IoU
is below this moved), score_tol (a score change beyond it is reported). picodet also takes
strides=8/16/32/64 and reg_max; yolox takes strides=8/16/32; yolov5 and yolox take classes (0: any);
text-det takes thresh and min_area. language-model takes kld_warn and kld_fail (mean KL divergence in
nats above which the run warns / fails). landmarks takes dims (values per landmark, 0: 5 when the size
divides by 5, else 3, else 2), points (how many landmarks are judged, 0: all), px (fail above this
movement in pixels) and normalized (1: coordinates are in [0, 1] of the input size). embedding takes
warn_cos and fail_cos (cosine similarity below which the run warns / fails).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from layerdiff.errors import UsageError

DETECTORS = ("yolov5", "yolox", "yolov8", "picodet", "ssd", "text-det")
LANGUAGE_MODEL = "language-model"
TASKS = ("classification", *DETECTORS, "segmentation", "landmarks", "embedding", LANGUAGE_MODEL, "regression")
ALIASES = {"elements": "regression", "detection-yolov5": "yolov5", "detection-yolov8": "yolov8",
           "boxes": "ssd", "db": "text-det", "classifier": "classification", "lm": LANGUAGE_MODEL,
           "llm": LANGUAGE_MODEL, "next-token": LANGUAGE_MODEL}
DEFAULTS = {
    "yolov5": {"conf": 0.25, "iou": 0.45, "classes": 0},
    # YOLOX's own demo thresholds (its onnx_inference: score 0.3, NMS 0.45)
    "yolox": {"conf": 0.3, "iou": 0.45, "strides": "8/16/32", "classes": 0},
    "yolov8": {"conf": 0.25, "iou": 0.45},
    "picodet": {"conf": 0.4, "iou": 0.5, "strides": "8/16/32/64", "reg_max": 7},
    "ssd": {"conf": 0.4, "iou": 0.5},
    "text-det": {"thresh": 0.3, "conf": 0.5, "min_area": 3},
    # mean KL divergence (nats) per position: llama.cpp's q8_0 weights sit near 1e-3, 4-bit ones near 1e-2
    # to 5e-2 (its perplexity tool's --kl-divergence tables); a tenth of a nat is a different model
    LANGUAGE_MODEL: {"kld_warn": 0.01, "kld_fail": 0.1},
    "landmarks": {"dims": 0, "points": 0, "px": 2.0, "normalized": 0},
    # a sentence encoder's cosine similarity to itself under fp16 stays above 0.999; below 0.99 the
    # neighbours a search returns change
    "embedding": {"warn_cos": 0.999, "fail_cos": 0.99},
}
COMMON = {"moved": 0.9, "score_tol": 0.05}


@dataclass(frozen=True)
class Task:
    """A parsed `--task`: its name and every option, defaults filled in."""

    name: str
    options: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The task as the user would type it again (what the results record)."""
        given = [f"{k}={v}" for k, v in sorted(self.options.items()) if _default(self.name, k) != v]
        return self.name + (":" + ",".join(given) if given else "")

    def get(self, key: str):
        return self.options.get(key, _default(self.name, key))

    @property
    def is_detector(self) -> bool:
        return self.name in DETECTORS


def parse_task(text: str | None) -> Task | None:
    """`--task` text -> Task (None for no task); a bad name or option is one UsageError line."""
    if text is None or not str(text).strip():
        return None
    name, _, rest = str(text).strip().partition(":")
    name = ALIASES.get(name.lower(), name.lower())
    if name not in TASKS:
        raise UsageError(f"--task {text}: unknown task {name!r}; one of: {', '.join(TASKS)}")
    known = {**COMMON, **DEFAULTS.get(name, {})} if name in DETECTORS else dict(DEFAULTS.get(name, {}))
    known["output"] = ""
    options = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep and "output" not in options:  # a bare word names the output the task reads
            key, sep, value = "output", "=", item
        if not sep or key not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise UsageError(f"--task {text}: unknown option {item!r} for {name} (options: {allowed})")
        options[key] = _value(text, key, value, known[key])
    return Task(name, {**known, **options})


def _value(text: str, key: str, value: str, default):
    """An option's value, typed like its default."""
    if isinstance(default, str):
        return value
    try:
        return type(default)(value)
    except ValueError:
        raise UsageError(f"--task {text}: {key}={value} is not a number") from None


def _default(name: str, key: str):
    return {**(COMMON if name in DETECTORS else {}), **DEFAULTS.get(name, {}), "output": ""}.get(key)


def task_of(attrs: dict) -> Task | None:
    """The task a run's file records (collect --task), None when it records none or a bad one."""
    try:
        return parse_task(attrs.get("task") or None)
    except UsageError:
        return None
