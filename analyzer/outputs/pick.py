"""Which model output a task reads: the one the user names, else the one whose shape fits the task's role.

A task that decodes the wrong tensor reports confident nonsense (a pose model's heatmaps read as 64
classes of a mask, a YOLOX head read as YOLOv5 boxes), so every task reads one output it can explain:
named with `--task NAME:OUTPUT`, or picked by shape here, and the judgement names the output it read.
A named output that does not exist is refused with the outputs there are.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerdiff.errors import InputError

MAX_LISTED = 8


@dataclass
class Output:
    """One model output of a pair: its layer key, tensor name, both runs' values (size-1 axes dropped),
    the reference's shape as dumped and the byte order the dump records for it."""

    key: str
    name: str
    ref: np.ndarray
    run: np.ndarray
    shape: tuple[int, ...]
    layout: str = ""

    def said(self) -> str:
        return f"{self.key} {list(self.shape)}"


def listed(outputs: list[Output]) -> str:
    shown = ", ".join(o.said() for o in outputs[:MAX_LISTED])
    return shown + (f" and {len(outputs) - MAX_LISTED} more" if len(outputs) > MAX_LISTED else "")


def named(outputs: list[Output], wanted: str, task_text: str) -> Output:
    """The output called `wanted` (its layer key, its tensor name, or its op name)."""
    for output in outputs:
        if wanted in (output.key, output.name, output.key.rsplit(":", 1)[0]):
            return output
    raise InputError(f"--task {task_text}: the model has no output {wanted!r} (outputs: {listed(outputs)})")


def the_output(outputs: list[Output], task, fits, role: str) -> Output:
    """The output the task reads: the named one, else the best of those `fits` accepts (`fits(output)`
    returns a rank, larger is better, or None when the output cannot play the role).

    Outputs that fit equally well are refused, not picked by their order: a hand landmark model declares
    its landmarks in pixels and its world landmarks in metres with the same 63 values, and the metres
    read as pixels never move."""
    wanted = str(task.get("output") or "")
    if wanted:
        return named(outputs, wanted, task.text)
    ranked = [(rank, i) for i, o in enumerate(outputs) if (rank := fits(o)) is not None]
    if not ranked:
        raise InputError(f"--task {task.text}: no output is {role} (outputs: {listed(outputs)})")
    best = max(ranked)
    tied = [outputs[i] for rank, i in ranked if rank == best[0]]
    if len(tied) > 1:
        raise InputError(f"--task {task.text}: {len(tied)} outputs fit {role} equally ({listed(tied)}); name the one "
                         f"to read: --task {task.name}:OUTPUT")
    return outputs[best[1]]


def spatial(output: Output) -> tuple[np.ndarray, np.ndarray] | None:
    """(ref, run) as [C, H, W] (or [H, W]) by the layout the dump records, None when the output is no map.

    [N, C, H, W] is channel-first unless the dump says NHWC (a TFLite graph's order); a 3-D output is
    [1, H, W] (one map) or [C, H, W] (ncnn drops the batch axis); a 2-D [H, W] is one map."""
    dims = [d for d in output.shape]
    if len(dims) == 4 and dims[0] == 1:
        channels_last = output.layout.split(" ")[0].upper() == "NHWC"
        ref = output.ref.reshape(dims[1:])
        run = output.run.reshape(dims[1:]) if output.run.size == output.ref.size else output.run
        if channels_last:
            ref, run = np.moveaxis(ref, -1, 0), np.moveaxis(run, -1, 0)
        return (ref[0], run[0]) if ref.shape[0] == 1 else (ref, run)
    if len(dims) == 3 and dims[0] > 1 and min(dims[1:]) >= 2:
        same = output.run.size == output.ref.size
        return output.ref.reshape(dims), output.run.reshape(dims) if same else output.run
    if (len(dims) == 3 and dims[0] == 1) or len(dims) == 2:
        hw = dims[-2:]
        if min(hw) < 2:
            return None
        return output.ref.reshape(hw), output.run.reshape(hw) if output.run.size == output.ref.size else output.run
    return None
