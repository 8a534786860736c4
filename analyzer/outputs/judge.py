"""A run's outputs judged by what they are: decoded with the declared task and compared as a user would.

One judgement per run-vs-reference pair. With a declared task (`--task`, or the `task` the run's file
records) the output it reads (named, or picked by its role: pick.py) is decoded by the family's
conventions (detection.py, segmentation.py, classes.py, landmarks.py, embedding.py) and the judgement
says what changed in the user's terms ("1 of 7 boxes moved (IoU 0.64)"). An output the task cannot
read is refused in one line (status "error"), never decoded anyway.
Without one there is no judgement here: the verdict weighs the scale-aware element error of each output,
and top-1 only where an output is recognisably class scores (classes.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING


from layerdiff.analyzer.findings.wording import percent
from layerdiff.analyzer.formats.enginefacts import facts_of
from layerdiff.analyzer.measure import classes
from layerdiff.analyzer.outputs.pick import Output, spatial, the_output
from layerdiff.analyzer.outputs.task import LANGUAGE_MODEL, Task, parse_task, task_of
from layerdiff.errors import InputError, LayerdiffError

if TYPE_CHECKING:
    from layerdiff.analyzer.outputs.boxes import BoxChanges, Boxes

MAX_SAID = 3  # boxes described one by one before "..."


@dataclass
class OutputJudgement:
    """The decoded-output verdict of one run against its reference, in words and numbers."""

    task: str
    status: str  # pass | warn | fail | error (the outputs could not be decoded with the task)
    reason: str
    outputs: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)


def pair_task(pair, declared: Task | None, output_keys: list[str] = ()) -> Task | None:
    """The task a pair is judged by: the declared one, else what the reference's or the run's file records,
    else the one both runs' engines declare for an output the pair has (llama.cpp's logits output)."""
    return declared or task_of(pair.base.attrs) or task_of(pair.other.attrs) or _recognised(pair, output_keys)


def _recognised(pair, output_keys: list[str]) -> Task | None:
    """An output whose name both engines declare tells the task (`engine_facts.output_tasks`): no need to be
    told. Both must agree, so an output of another engine that happens to bear the name says nothing."""
    for key in output_keys:
        name = str(key).split(":", 1)[0]
        tasks = {facts_of(run.attrs).task_for_output(name) for run in (pair.base, pair.other)}
        if len(tasks) == 1 and "" not in tasks:
            try:
                return parse_task(tasks.pop())
            except LayerdiffError:  # a header's declaration the analyzer cannot read: as if none
                return None
    return None


def judge_pair(pair, alignment, output_keys: list[str], task: Task, tolerance_of,
               decoded: dict | None = None, values=None) -> OutputJudgement:
    """Decode the pair's matched outputs with `task` and compare them (`tolerance_of(ref)` gives an
    output's decision tolerance: atol + rtol x max|ref|). `decoded`: the reference's boxes already decoded
    for an earlier pair of the same reference (runs compared with one golden decode it once). `values(run,
    order)`: an output's values (`Comparison.output_values`: kept with the measurement), else read from the
    run's dump."""
    from layerdiff.analyzer.outputs import detection  # the task decoders: imported when a task is judged

    matched = alignment.matched
    rows = matched[matched["key"].isin(output_keys)] if len(matched) else matched
    if len(rows) == 0 or task.name == "regression":
        return OutputJudgement(task.text, "none", "", [])
    order = {k: i for i, k in enumerate(output_keys)}
    rows = rows.assign(_o=rows["key"].map(order)).sort_values("_o")
    names = [str(k) for k in rows["key"]]
    try:
        outputs = _outputs(pair, rows, values or (lambda run, order: run.dump.tensor(order)))
        ref, run = [o.ref for o in outputs], [o.run for o in outputs]
        if task.name in detection.SINGLE_HEAD:
            hw = input_hw(pair.base) or input_hw(pair.other)
            head = the_output(outputs, task, _head_fits(task, hw), "a detector head ([anchors, columns])")
            return _detections(pair, task, [head.ref], [head.run], [head.key], decoded)
        if task.is_detector:
            if task.get("output"):
                raise InputError(f"--task {task.text}: {task.name} reads all of its outputs together (paired by "
                                 "their shapes); it takes no output name")
            return _detections(pair, task, ref, run, names, decoded)
        if task.name == "segmentation":
            return _masks(task, _mask_output(pair, outputs, task), tolerance_of)
        if task.name == "landmarks":
            return _landmarks(pair, task, outputs)
        if task.name == "embedding":
            return _embedding(task, outputs)
        if task.name == LANGUAGE_MODEL and task.get("output"):
            chosen = the_output(outputs, task, None, "")
            return _next_tokens(task, [chosen.ref], [chosen.run], [chosen.key], tolerance_of)
        if task.name == LANGUAGE_MODEL:
            return _next_tokens(task, ref, run, names, tolerance_of, _declared_outputs(pair, LANGUAGE_MODEL))
        if task.get("output"):
            chosen = the_output(outputs, task, None, "")
            ref, run, names = [chosen.ref], [chosen.run], [chosen.key]
        return _classes(task, ref, run, names, tolerance_of)
    except (InputError, ValueError, IndexError) as err:
        text = str(err)
        said = text if text.startswith("--task") else f"the outputs do not decode as {task.text}: {text}"
        return OutputJudgement(task.text, "error", said, names)


def _outputs(pair, rows, values) -> list[Output]:
    """The pair's compared outputs, in the model's order: values with size-1 axes dropped, the reference's
    dumped shape and recorded layout."""
    stats = pair.base.stats_by_order()
    outputs = []
    for key, base_order, other_order in zip(rows["key"], rows["base_order"], rows["other_order"]):
        a = values(pair.base, int(base_order))
        b = classes.squeezed(values(pair.other, int(other_order)))
        ref = classes.squeezed(a)
        outputs.append(Output(str(key), _tensor_name(pair.base, int(base_order), str(key)), ref,
                              b.reshape(ref.shape) if b.size == ref.size else b, tuple(a.shape),
                              stats.layout(int(base_order))))
    return outputs


def _tensor_name(run, order: int, key: str) -> str:
    layers = run.layers
    hit = layers.loc[layers["order"] == order, "name"]
    return str(hit.iloc[0]) if len(hit) else key


def _head_fits(task: Task, hw: tuple[int, int] | None):
    """A single-head detector reads a 2-D output ([anchors, columns] after size-1 axes are dropped; a
    text map for text-det): first those whose anchor count fits the family's layout for the input's size
    (a text map of the input's size), then the largest."""
    from layerdiff.analyzer.outputs import detection

    per_cell = 3 if task.name == "yolov5" else 1

    def fits(output: Output):
        if output.ref.ndim != 2:
            return None
        if hw is None:
            return (False, output.ref.size)
        if task.name == "text-det":
            return (tuple(output.ref.shape) == hw, output.ref.size)
        return (max(output.ref.shape) in detection.anchor_counts(hw, per_cell), output.ref.size)
    return fits


INPUT_OPS = ("input", "data", "placeholder")  # an input layer's op type, in lower case, as engines dump it


def input_hw(run) -> tuple[int, int] | None:
    """Height and width of the run's first image-like input (3 or more axes): from the inputs the dump
    stores, else from an input layer's shape (ncnn dumps its Input layer)."""
    try:
        for _name, shape in run.dump.input_shapes():
            if len(shape) == 4 and shape[-1] <= 4 < shape[1]:  # NHWC (a TFLite model's image)
                return int(shape[1]), int(shape[2])
            if len(shape) >= 3:
                return int(shape[-2]), int(shape[-1])
    except (LayerdiffError, OSError, KeyError):
        pass
    layers = run.layers
    for op_type, shape in zip(layers["op_type"].tolist(), layers["shape"].tolist()):  # a plain scan: a few inputs
        if str(op_type).lower() not in INPUT_OPS:
            continue
        dims = json.loads(shape) if isinstance(shape, str) else list(shape)
        if len(dims) >= 3:
            return int(dims[-2]), int(dims[-1])
    return None


def _detections(pair, task: Task, ref, run, names, decoded: dict | None = None) -> OutputJudgement:
    from layerdiff.analyzer.outputs import detection
    from layerdiff.analyzer.outputs.boxes import compare_boxes

    hw = input_hw(pair.base) or input_hw(pair.other)
    conf, tol = float(task.get("conf")), float(task.get("score_tol"))
    detection.check_reference(task, ref, hw)
    low = max(conf - tol, 0.0)
    key = (str(pair.base.path), tuple(names), task.text, hw)  # the same reference outputs, decoded the same way
    if decoded is None or key not in decoded:
        found = detection.decode_at_two(task, ref, hw, conf, low)
        if decoded is not None:
            decoded[key] = found
    ref_boxes, ref_all = found if decoded is None else decoded[key]
    run_boxes, run_all = detection.decode_at_two(task, run, hw, conf, low)
    changes = compare_boxes(ref_boxes, run_boxes, ref_all, run_all, float(task.get("moved")), tol)
    status = "fail" if changes.decisions_changed else ("warn" if changes.scores or changes.threshold else "pass")
    numbers = {"boxes_reference": len(ref_boxes), "boxes_run": len(run_boxes), "moved": len(changes.moved),
               "lost": len(changes.lost), "gained": len(changes.gained), "relabelled": len(changes.relabelled),
               "scores_changed": len(changes.scores), "at_threshold": len(changes.threshold),
               "min_iou": min(changes.ious, default=math.nan),
               "moved_boxes": [_box(ref_boxes, i) | {"iou": iou} for i, _, iou in changes.moved]}
    said = box_sentence(changes, ref_boxes, run_boxes, task)
    if task.name in detection.SINGLE_HEAD:
        said += f" (decoded from {names[0]})"
    return OutputJudgement(task.text, status, said, names, numbers)


def box_sentence(c: BoxChanges, ref: Boxes, run: Boxes, task: Task) -> str:
    """'1 of 7 boxes moved (IoU 0.64: class 2 at [..]); 0 lost, 0 gained; scores within 0.05'."""
    n = c.n_reference
    parts = []
    if c.moved:
        said = "; ".join(f"IoU {iou:.2f}: class {int(ref.classes[i])} at {_xyxy(ref, i)}" for i, _, iou in c.moved[:MAX_SAID])
        parts.append(f"{len(c.moved)} of {n} box(es) moved ({said}{'; ...' if len(c.moved) > MAX_SAID else ''})")
    if c.relabelled:
        i, j, _ = c.relabelled[0]
        parts.append(f"{len(c.relabelled)} box(es) changed class (class {int(ref.classes[i])} -> {int(run.classes[j])} "
                     f"at {_xyxy(ref, i)})")
    if c.lost:
        parts.append(f"{len(c.lost)} of {n} box(es) lost (first: class {int(ref.classes[c.lost[0]])} at "
                     f"{_xyxy(ref, c.lost[0])}, score {ref.scores[c.lost[0]]:.3f})")
    if c.gained:
        parts.append(f"{len(c.gained)} box(es) gained (first: class {int(run.classes[c.gained[0]])} at "
                     f"{_xyxy(run, c.gained[0])}, score {run.scores[c.gained[0]]:.3f})")
    if c.scores:
        worst = max(c.scores, key=lambda s: abs(s[2]))
        parts.append(f"{len(c.scores)} box score(s) changed by more than {task.get('score_tol'):g} (worst {worst[2]:+.3f})")
    if c.threshold:
        kind, i, other = c.threshold[0]
        parts.append(f"{len(c.threshold)} box(es) only cross the score threshold {task.get('conf'):g} "
                     f"({kind} in the run; its score there {other:.3f})")
    if not parts:
        iou = f", IoU >= {min(c.ious):.3f}" if c.ious else ""
        return f"all {n} box(es) kept{iou}, scores within {task.get('score_tol'):g}"
    kept = n - len(c.moved) - len(c.lost) - len(c.relabelled) - sum(1 for k, _, _ in c.threshold if k == "lost")
    return "; ".join(parts) + f"; {kept} of {n} kept in place"


def _xyxy(boxes: Boxes, i: int) -> str:
    return "[" + ", ".join(f"{v:.0f}" for v in boxes.xyxy[i]) + "]"


def _box(boxes: Boxes, i: int) -> dict:
    return {"xyxy": [float(v) for v in boxes.xyxy[i]], "class": int(boxes.classes[i]), "score": float(boxes.scores[i])}


def _mask_output(pair, outputs: list[Output], task: Task) -> Output:
    """The mask: the named output, else the map whose height and width are the input's (a pose model's
    segmentation, not its 64x64 heatmaps), else the largest map. A named output that is no map is refused."""
    from layerdiff.analyzer.outputs import detection

    hw = input_hw(pair.base) or input_hw(pair.other)

    def fits(output: Output):
        maps = spatial(output)
        return None if maps is None else (tuple(maps[0].shape[-2:]) == hw, maps[0].size)
    chosen = the_output(outputs, task, fits, "a mask ([N, C, H, W], [N, H, W, C] by its recorded layout, or [H, W])")
    if spatial(chosen) is None:
        raise InputError(f"--task {task.text}: output {chosen.said()} is not a mask (segmentation reads [N, C, H, W] "
                         "or [N, H, W, C], as the dump records its layout, or one map [H, W])")
    mask_hw = tuple(spatial(chosen)[0].shape[-2:])
    if hw is not None and not detection.image_of_input(mask_hw, hw):
        raise InputError(f"--task {task.text}: output {chosen.said()} is no mask of the {hw[0]}x{hw[1]} input: its "
                         f"{mask_hw[0]}x{mask_hw[1]} map is not the input's size nor a scaled copy of it")
    return chosen


def _masks(task: Task, output: Output, tolerance_of) -> OutputJudgement:
    """Fail when more than 1% of the mask's deciding pixels change class."""
    from layerdiff.analyzer.outputs.segmentation import compare_masks

    ref, run = spatial(output)
    if ref.size != run.size:
        raise ValueError(f"{output.key} has {ref.size} values in the reference and {run.size} in the run")
    m = compare_masks(ref, run, tolerance_of(ref))
    status = "fail" if m.changed_share > 0.01 else ("warn" if m.n_changed or m.n_tie_changed else "pass")
    regions = (f"worst class IoU {m.worst_iou:.3f} (class {m.worst_class})" if m.worst_class >= 0
               else "every class region kept")
    text = f"{m.n_changed} of {m.n_decided} deciding pixels of {output.key} change class ({percent(m.changed_share)}), {regions}"
    if m.n_tie_changed:
        text += f"; {m.n_tie_changed} pixel(s) at a near tie flip"
    return OutputJudgement(task.text, status, text, [output.key],
                           {"pixels": m.n_pixels, "decided": m.n_decided, "changed": m.n_changed,
                            "tie_changed": m.n_tie_changed, "worst_iou": m.worst_iou, "worst_class": m.worst_class})


def _landmarks(pair, task: Task, outputs: list[Output]) -> OutputJudgement:
    """Fail when a judged landmark moved more than `px` pixels; warn above a quarter of that."""
    from layerdiff.analyzer.outputs import landmarks

    def fits(output: Output):  # a flat list, or [K, D] with D of 2..5: never a map
        listed = output.ref.ndim == 1 or (output.ref.ndim == 2 and 2 <= output.ref.shape[-1] <= 5)
        return output.ref.size if listed and landmarks.guess_dims(output.shape) else None
    chosen = the_output(outputs, task, fits, "a landmark list ([K x D] values, x and y first)")
    dims = int(task.get("dims") or 0) or landmarks.guess_dims(chosen.shape)
    if chosen.ref.ndim > 2 or not dims or chosen.ref.size % dims or chosen.ref.size // dims < 2:
        raise InputError(f"--task {task.text}: output {chosen.said()} is not a landmark list of K x {dims or 'D'} "
                         "values (give dims=D, the values per landmark)")
    scale = (1.0, 1.0)
    if int(task.get("normalized") or 0):
        hw = input_hw(pair.base) or input_hw(pair.other)
        if hw is None:
            raise InputError(f"--task {task.text}: normalized coordinates need the input size, and the dump has no input")
        scale = (float(hw[1]), float(hw[0]))
    if chosen.run.size != chosen.ref.size:
        raise ValueError(f"{chosen.key} has {chosen.ref.size} values in the reference and {chosen.run.size} in the run")
    c = landmarks.compare_landmarks(chosen.ref, chosen.run, dims, int(task.get("points") or 0), scale)
    px = float(task.get("px"))
    moved = [i for i, d in enumerate(c["distances"]) if not d <= px]
    status = "fail" if moved else ("warn" if c["worst_px"] > px / 4 else "pass")
    head = (f"{len(moved)} of {c['points']} landmarks of {chosen.key} moved more than {px:g} px" if moved
            else f"all {c['points']} landmarks of {chosen.key} within {px:g} px")
    text = f"{head} (worst: landmark {c['worst']} by {c['worst_px']:.2f} px; mean {c['mean_px']:.2f} px)"
    numbers = {"points": c["points"], "moved": len(moved), "moved_landmarks": moved[:50], "worst": c["worst"],
               "worst_px": c["worst_px"], "mean_px": c["mean_px"], "dims": dims}
    return OutputJudgement(task.text, status, text, [chosen.key], numbers)


def _embedding(task: Task, outputs: list[Output]) -> OutputJudgement:
    """Fail when a row's cosine similarity to the reference falls below fail_cos; warn below warn_cos."""
    from layerdiff.analyzer.outputs import embedding

    def fits(output: Output):
        return output.ref.size if output.ref.ndim <= 2 and output.ref.size >= 2 else None
    chosen = the_output(outputs, task, fits, "an embedding ([D] or [N, D])")
    if chosen.ref.ndim > 2 or chosen.ref.size < 2:
        raise InputError(f"--task {task.text}: output {chosen.said()} is not an embedding (embedding reads [D] or [N, D])")
    if chosen.run.size != chosen.ref.size:
        raise ValueError(f"{chosen.key} has {chosen.ref.size} values in the reference and {chosen.run.size} in the run")
    cos = embedding.cosine_rows(chosen.ref, chosen.run)
    worst = float(cos.min())
    fail, warn = float(task.get("fail_cos")), float(task.get("warn_cos"))
    status = "fail" if worst < fail else ("warn" if worst < warn else "pass")
    rows = f"{len(cos)} embedding(s) of {chosen.key}" if len(cos) > 1 else f"the embedding {chosen.key}"
    text = (f"cosine similarity of {rows} to the reference: {'lowest ' if len(cos) > 1 else ''}{worst:.6f} "
            f"(fails below {fail:g}, warns below {warn:g})")
    return OutputJudgement(task.text, status, text, [chosen.key],
                           {"rows": int(len(cos)), "min_cosine": worst, "mean_cosine": float(cos.mean())})


def _declared_outputs(pair, task_name: str) -> set[str]:
    """The output names either engine of the pair declares as `task_name`'s (`engine_facts.output_tasks`)."""
    return {name for run in (pair.base, pair.other) for name, task in facts_of(run.attrs).output_tasks
            if task == task_name}


def _next_tokens(task: Task, ref, run, names, tolerance_of, declared: set[str] = frozenset()) -> OutputJudgement:
    """Logits: fail when a clear next token changes or the mean KL divergence passes kld_fail; warn at a
    near-tie flip or above kld_warn. `declared`: the outputs the engines declare as their logits."""
    from layerdiff.analyzer.outputs import nexttoken

    i = nexttoken.logits_output(names, ref, declared)
    if i is None:
        return OutputJudgement(task.text, "error", "no single output holds next-token logits (name it with "
                               "--task language-model:output=NAME, or keep one output with a vocabulary axis)", names)
    if ref[i].size != run[i].size:
        raise ValueError(f"{names[i]} has {ref[i].size} values in the reference and {run[i].size} in the run")
    c = nexttoken.compare_logits(ref[i], run[i], tolerance_of(ref[i]))
    warn, fail = float(task.get("kld_warn")), float(task.get("kld_fail"))
    if c["flips"] or not c["kld_mean"] <= fail:
        status = "fail"
    elif c["tie_flips"] or c["kld_mean"] > warn:
        status = "warn"
    else:
        status = "pass"
    return OutputJudgement(task.text, status, nexttoken.sentence(names[i], c, warn), [names[i]], c)


def _classes(task: Task, ref, run, names, tolerance_of) -> OutputJudgement:
    """Declared class scores: every output with a class axis, top-1 over its deciding positions."""
    said, numbers, status = [], {}, "pass"
    for name, a, b in zip(names, ref, run):
        agree = classes.topk_agreement(a, b, tolerance_of(a), declared=True)
        if math.isnan(agree["top1"]):
            continue
        numbers[name] = agree
        if agree["n_flips"]:
            status = "fail"
        elif agree["n_tie_flips"] and status == "pass":
            status = "warn"
        said.append(f"{name}: top-1 agreement {percent(agree['top1'])} of {agree['n_decided']} deciding position(s)"
                    + (f", {agree['n_tie_flips']} flip(s) at near ties" if agree["n_tie_flips"] else ""))
    if not said:
        return OutputJudgement(task.text, "error", "no output has a class axis of 2 or more classes", names)
    return OutputJudgement(task.text, status, "; ".join(said), names, numbers)


def judge_all(comparison, declared: Task | None, thresholds) -> dict[int, OutputJudgement]:
    """The judgement of every run-vs-reference pair that has a task (declared or recorded in its files)."""
    judgements, decoded = {}, {}
    for index, pair in enumerate(comparison.plan.pairs):
        if pair.kind != "reference":
            continue
        keys = comparison.graph(pair.base).outputs()
        task = pair_task(pair, declared, keys)
        if task is None:
            continue
        judgement = judge_pair(pair, comparison.alignments[index], keys, task,
                               lambda ref: classes.decision_tolerance(ref, thresholds.tolerances), decoded,
                               comparison.output_values)
        if judgement.status != "none":
            judgements[index] = judgement
    return judgements
