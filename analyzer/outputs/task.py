"""The declared task of a model's outputs (`--task`): which decoder reads them, with which conventions.

A task is `NAME[:key=value,...]`, e.g. `picodet`, `yolov5:conf=0.4`, `text-det:thresh=0.3`. The
names are the families whose outputs a user reads as decisions rather than numbers:

  classification  class scores (logits or probabilities): top-1 / top-5 over the last axis
  yolov5          one [N, 5 + C] head: cx, cy, w, h, objectness, C class scores (sigmoided)
  yolov8          one [4 + C, N] head (or [N, 4 + C]): cx, cy, w, h, C class scores
  picodet         per stride, scores [N, C] and a box distribution [N, 4 x (reg_max + 1)] (GFL/DFL)
  ssd             decoded boxes [N, 4] (x0, y0, x1, y1) and scores [N, C]
  text-det        a DB text-probability map [H, W]: boxes of the regions above `thresh`
  segmentation    per-pixel class scores [C, H, W] (argmax), or one probability map [H, W]
  language-model  next-token logits [positions, vocabulary]: the next token kept, and the KL divergence
                  of the run's distribution from the reference's (llama.cpp's own quantisation yardstick);
                  a ggml run's `result_output` is read this way without being told
  regression      every element is the result: the scale-aware element error, no decision

Options every detector takes: conf (score threshold), iou (NMS IoU), moved (a matched box whose IoU
is below this moved), score_tol (a score change beyond it is reported). picodet also takes
strides=8/16/32/64 and reg_max; text-det takes thresh and min_area. language-model takes kld_warn and
kld_fail (mean KL divergence in nats above which the run warns / fails).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from layerdiff.errors import UsageError

DETECTORS = ("yolov5", "yolov8", "picodet", "ssd", "text-det")
LANGUAGE_MODEL = "language-model"
TASKS = ("classification", *DETECTORS, "segmentation", LANGUAGE_MODEL, "regression")
ALIASES = {"elements": "regression", "detection-yolov5": "yolov5", "detection-yolov8": "yolov8",
           "boxes": "ssd", "db": "text-det", "classifier": "classification", "lm": LANGUAGE_MODEL,
           "llm": LANGUAGE_MODEL, "next-token": LANGUAGE_MODEL}
DEFAULTS = {
    "yolov5": {"conf": 0.25, "iou": 0.45},
    "yolov8": {"conf": 0.25, "iou": 0.45},
    "picodet": {"conf": 0.4, "iou": 0.5, "strides": "8/16/32/64", "reg_max": 7},
    "ssd": {"conf": 0.4, "iou": 0.5},
    "text-det": {"thresh": 0.3, "conf": 0.5, "min_area": 3},
    # mean KL divergence (nats) per position: llama.cpp's q8_0 weights sit near 1e-3, 4-bit ones near 1e-2
    # to 5e-2 (its perplexity tool's --kl-divergence tables); a tenth of a nat is a different model
    LANGUAGE_MODEL: {"kld_warn": 0.01, "kld_fail": 0.1},
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
    options = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
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
    return {**(COMMON if name in DETECTORS else {}), **DEFAULTS.get(name, {})}.get(key)


def task_of(attrs: dict) -> Task | None:
    """The task a run's file records (collect --task), None when it records none or a bad one."""
    try:
        return parse_task(attrs.get("task") or None)
    except UsageError:
        return None
