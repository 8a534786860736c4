"""pass / warn / fail per layer, from thresholds whose defaults are written down here and in the docs.

The defaults are chosen for what mobile low-precision arithmetic really does: fp16 keeps a layer's
relative L2 error near 1e-3, bf16 near 1e-2, so fp16 passes, bf16 drift warns, and anything at
10% or more of the signal (SQNR below 20 dB), any new NaN/Inf, or most of a tensor's values gone to
zero fails. Every number can be changed on the command line.
"""
from __future__ import annotations

import math
import pandas as pd

from layerdiff.analyzer.findings.wording import percent
from layerdiff.analyzer.findings.thresholds import Thresholds  # noqa: F401 (the public place it was always imported from)

STATUS_ORDER = {"pass": 0, "warn": 1, "fail": 2}
# A zero collapse needs this many values that mattered gone to 0: one zero in a 2-value tensor is 50%.
MIN_ZERO_COLLAPSED = 8


def collapsed(share: float, count, limit: float) -> bool:
    """A meaningful zero collapse: over `limit` of the significant values, and at least MIN_ZERO_COLLAPSED of them."""
    try:
        return share > limit and int(count) >= MIN_ZERO_COLLAPSED
    except (TypeError, ValueError):
        return False


def classify(row: dict, t: Thresholds) -> tuple[str, str]:
    """Status of one compared layer and the reasons, in words, most severe first."""
    fails, warns = [], []
    if row.get("n_nonfinite_mismatch", 0):
        fails.append(f"{row['n_nonfinite_mismatch']} NaN/Inf not in the reference")
    rel_l2 = row.get("rel_l2", 0.0)
    if fails:
        pass  # rel L2 is infinite because of the NaN/Inf: already said
    elif rel_l2 == math.inf and row.get("max_abs", math.inf) <= t.atol:
        pass  # an all-zero reference: no relative error exists, and the run stays within atol of it
    elif _over(rel_l2, t.fail_rel_l2):
        fails.append(f"rel L2 {rel_l2:.3g} > {t.fail_rel_l2:g}")
    elif _over(rel_l2, t.warn_rel_l2):
        warns.append(f"rel L2 {rel_l2:.3g} > {t.warn_rel_l2:g}")
    collapse, count = row.get("zero_collapse", 0.0), row.get("n_zero_collapsed", 0)
    if collapsed(collapse, count, t.fail_zero_collapse):
        fails.append(f"{percent(collapse)} of non-zeros became 0")
    elif collapsed(collapse, count, t.warn_zero_collapse):
        warns.append(f"{percent(collapse)} of non-zeros became 0")
    if row.get("n_saturated", 0):
        warns.append(f"{row['n_saturated']} values pinned at +-65504")
    if row.get("pass_fraction", 1.0) < t.min_pass_fraction:
        warns.append(f"allclose pass {percent(row['pass_fraction'])} < {percent(t.min_pass_fraction)}")
    lost = row.get("n_nan_lost", 0) + row.get("n_posinf_lost", 0) + row.get("n_neginf_lost", 0)
    if lost:
        warns.append(f"{lost} reference NaN/Inf not reproduced")
    if fails:
        return "fail", "; ".join(fails + warns)
    if warns:
        return "warn", "; ".join(warns)
    return "pass", ""


# A run's verdict weighs what reaches the model's outputs (17 of 18,988 mask pixels changed
# by an fp16 flush is not "this op breaks"), judged by what each output is:
# - with a declared task (--task), the decoded outputs compared as a user would (outputs/judge.py);
# - a recognised class-score output (measure/classes.py): its top-1 decisions, counted only where the
#   reference decides (a flip at a near tie is a warning), and its scores' rel L2;
# - any other output: the share of its elements changed against its own scale (|diff| > atol + rtol x
#   max|ref|), bounded by --min-pass-fraction like the per-layer allclose share. Per-element allclose
#   would judge a 0.05 probability moved by 1e-3 as changed, so one model's verdict flipped with input size.


def output_beyond(outputs: pd.DataFrame) -> pd.Series:
    """Share of each output's elements changed against its scale (allclose share for older results)."""
    if "beyond_scale" in outputs and outputs["beyond_scale"].notna().all():
        return outputs["beyond_scale"].astype(float)
    return 1.0 - outputs["pass_fraction"].astype(float)


def score_vectors(outputs: pd.DataFrame) -> pd.Series:
    """Which outputs are class scores with a decision: their verdict is the top-1 class, not every score."""
    return outputs["top1"].astype(float).notna()


def dense_output_beyond(outputs: pd.DataFrame) -> float:
    """The worst share changed beyond tolerance among the dense outputs (masks, feature maps, detector
    heads), the figure the verdict weighs and runs.csv reports; NaN when the run has no dense output."""
    dense = outputs[~score_vectors(outputs)]
    return float(output_beyond(dense).max()) if len(dense) else math.nan


def worst_output(outputs: pd.DataFrame):
    """The output every table and sentence quotes for a run: the one with the largest rel L2 (NaN/Inf
    first), so the summary and the findings name the same output."""
    if len(outputs) == 0:
        return None
    rel = outputs["rel_l2"].astype(float).fillna(math.inf)
    return outputs.loc[rel.idxmax()]


def _flips(outputs: pd.DataFrame, column: str) -> int:
    if column not in outputs:
        return 0
    return int(outputs[column].astype(float).fillna(0).sum())


def run_verdict(layer_statuses, outputs: pd.DataFrame | None, t: Thresholds | None = None,
                judgement=None) -> tuple[str, str]:
    """The verdict of one run from its layers' statuses and its measured output rows, with the reason.

    `outputs` has columns status, rel_l2, beyond_scale (pass_fraction), top1, n_top1_flips, n_tie_flips,
    n_nonfinite_mismatch. `judgement` (outputs/judge.py) is the decoded-output comparison of a declared
    task: it decides when present. Without a compared output the worst layer decides. Otherwise: fail
    when an output gets new NaN/Inf, more than 1 - min_pass_fraction of a dense output's elements changed
    against its scale, a class-score output changes a decision where the reference decides, or its
    scores are off by more than fail_rel_l2; warn when layers or outputs diverge but the outputs keep
    within that; else pass.
    """
    t = t or Thresholds()
    statuses = layer_statuses.tolist() if hasattr(layer_statuses, "tolist") else list(layer_statuses)
    layers_worst = worst(statuses)
    if outputs is None or len(outputs) == 0:
        return layers_worst, "no model output compared: the worst layer decides"
    if (outputs["n_nonfinite_mismatch"].fillna(0) > 0).any():
        return "fail", "NaN/Inf reach a model output"
    said = _layers_said(statuses)
    if judgement is not None and judgement.status in ("pass", "warn", "fail"):
        if judgement.status != "pass":
            return judgement.status, f"{judgement.task}: {judgement.reason}"
        if said:
            return "warn", f"{said}, but the decoded outputs are unchanged ({judgement.task}: {judgement.reason})"
        return "pass", ""
    allowed = 1.0 - t.min_pass_fraction
    scores = score_vectors(outputs)
    beyond = dense_output_beyond(outputs)
    beyond = 0.0 if math.isnan(beyond) else beyond
    if beyond > allowed:
        dense = outputs[~scores]
        name = dense.loc[output_beyond(dense).idxmax(), "key"]
        return "fail", (f"{percent(beyond)} of output {name}'s elements changed by more than {t.atol:g} + {t.rtol:g} x "
                        f"its largest value (> {percent(allowed)})")
    flips, ties = _flips(outputs, "n_top1_flips"), _flips(outputs, "n_tie_flips")
    top1 = outputs.loc[scores, "top1"].astype(float)
    if len(top1) and (flips or float(top1.min()) < 1.0):
        row = outputs.loc[top1.idxmin()]
        return "fail", (f"top-1 agreement {percent(float(row['top1']))} at output {row['key']}: "
                        f"{flips or 'some'} decision(s) change where the reference decides")
    score_rel = outputs.loc[scores, "rel_l2"].astype(float) if "rel_l2" in outputs else pd.Series(dtype=float)
    if len(score_rel) and float(score_rel.max()) > t.fail_rel_l2:
        return "fail", (f"the output scores are off by rel L2 {float(score_rel.max()):.3g} (> {t.fail_rel_l2:g}), "
                        "though every top-1 decision is the same")
    if ties:
        return "warn", (f"{ties} top-1 flip(s) where the reference's two best classes are within the output's "
                        "tolerance (a near tie); every clear decision is the same")
    if scores.any() and bool((outputs.loc[scores, "status"] != "pass").any()):
        return "warn", "the output scores move beyond tolerance, but every top-1 decision is the same"
    if said:
        if scores.all():
            return "warn", f"{said}, but no top-1 decision changes"
        return "warn", (f"{said}, but only {percent(beyond)} of the outputs' elements changed beyond atol + rtol x their "
                        f"largest value (<= {percent(allowed)})" + (" and no top-1 decision changes" if scores.any() else ""))
    return "pass", ""


def _layers_said(statuses: list[str]) -> str:
    """'3 layer(s) fail, 2 layer(s) warn' ('' when every layer passes)."""
    counts = {s: statuses.count(s) for s in ("fail", "warn") if statuses.count(s)}
    return ", ".join(f"{n} layer(s) {s}" for s, n in counts.items())


def pair_verdict(rows: pd.DataFrame, t: Thresholds | None = None, judgement=None,
                 not_compared: list[str] = (), stopped: bool = False) -> tuple[str, str]:
    """run_verdict of one pair's rows of the tidy table ('not compared' when no layer was measured).

    `not_compared` (findings/coverage.py): why some outputs were not compared; such a run is never a
    pass. `stopped`: the run died before an output (the app gets no result): a fail."""
    verdict, why = _pair_verdict(rows, t, judgement)
    if judgement is not None and judgement.status == "error" and verdict == "pass":  # a task that could not be read
        verdict, why = "warn", f"{judgement.task} not applied: {judgement.reason}"
    if not not_compared or verdict == "not compared":
        return verdict, why
    gap = "not every output was compared: " + "; ".join(not_compared)
    if stopped:
        return "fail", gap + (f"; {why}" if why else "")
    if verdict == "pass":
        return "warn", gap
    return verdict, f"{why}; {gap}" if why else gap


def _pair_verdict(rows: pd.DataFrame, t: Thresholds | None, judgement) -> tuple[str, str]:
    status = rows["status"]
    is_measured = status.isin(["pass", "warn", "fail"])  # masks, not filtered copies of the whole table
    if not is_measured.any():
        return "not compared", ""
    is_output = rows["is_output"].astype(bool)
    reshaped = ((status == "shape_mismatch") & is_output).to_numpy()
    if reshaped.any():  # the app gets another tensor: no verdict on the other outputs may hide it
        r = rows[reshaped].iloc[0]
        return "fail", (f"model output {r['key']} has shape {r['run_shape']} in the run and {r['shape']} in the "
                        "reference: the run computes another tensor there, not an inaccurate one")
    return run_verdict(status, rows[is_measured & is_output], t, judgement)


def _over(value: float, limit: float) -> bool:
    return value > limit or (isinstance(value, float) and math.isnan(value))


def worst(statuses) -> str:
    """The most severe of several statuses ('pass' for none)."""
    best = "pass"
    for status in statuses:
        if STATUS_ORDER.get(status, -1) > STATUS_ORDER[best]:
            best = status
    return best
