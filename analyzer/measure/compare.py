"""Streaming every planned comparison layer by layer into one tidy table (one row per layer x run).

Measuring knows no threshold: a measured row has status `measured` and every metric, and the judge
stage (layerdiff.analyzer.findings.layerstatus) turns it into pass / warn / fail, so moving a threshold
re-judges the stored measurement without reading a tensor. The tolerances (atol, rtol) are part of what
is measured: the allclose share and the top-1 decision margin are counted element by element.

Memory stays at "one reference tensor + one run tensor": for each reference run the layers are
visited in its execution order, its tensor is read once, and every run compared against it reads
its own matching tensor, is measured, and is released before the next. Problems with single
layers (a huge declared shape, an unreadable dataset, a shape that does not match) become rows
with a status saying so and one problem line; they never stop the analysis.
"""
from __future__ import annotations

import functools
import json
import math
from typing import Callable

import numpy as np
import pandas as pd

from layerdiff.analyzer.align.byname import NameRules, PairAlignment, align_layers
from layerdiff.analyzer.align.naming import naming_of
from layerdiff.analyzer.align.axes import AxisMap, axis_map, canonical_tensor, names_axes, recorded_layouts
from layerdiff.analyzer.align.values import ValueErrors
from layerdiff.analyzer.formats.dumpfile import TensorBuffer
from layerdiff.errors import LayerdiffError
from layerdiff.progress import Steps
from layerdiff.analyzer.align.graph import LayerGraph, run_graph
from layerdiff.analyzer.measure.metrics import PairKernel, Tolerances
from layerdiff.analyzer.measure.classes import decision_tolerance, topk_agreement
from layerdiff.analyzer.measure.estimate import SIGMA_COLUMNS, SketchedValueErrors, estimate_layer
from layerdiff.analyzer.measure.storage import sampled_evidence
from layerdiff.analyzer.runs.reference import Pair, Plan
from layerdiff.analyzer.runs.sources import Run
from layerdiff.analyzer.measure.comparison import MEASURED, Comparison
from layerdiff.analyzer.align.blocks import layer_blocks
from layerdiff.analyzer.align.unmatched import relabel_unmatched

MAX_KEPT_OUTPUT_BYTES = 16 * 1024 * 1024  # a model output kept with the measurement for the judge at most this big


class MeasureMemo:
    """Rows measured by an earlier analysis of the same files, for a later one to take instead of measuring.

    Why: a sketch-first collection analyses its runs once per round, and between rounds a few tensors left on
    the phone become whole while every other layer keeps its bytes. A row is keyed by both files, both
    orders, whether each side was whole or estimated, the shapes and layouts matched and the tolerances: a
    layer whose side changed from estimated to whole is a new key and is measured again. Valid only while the
    files change that way alone (the holder, `collector/run/sketchpull.refine`, drops it afterwards)."""

    IDENTITY = ("pair", "comparison", "run", "reference", "position")  # the plan's, not the measurement's

    def __init__(self) -> None:
        self.rows: dict[tuple, tuple[dict, list[str]]] = {}
        self.hits = 0

    @staticmethod
    def key(base: Run, order: int, pair: Pair, match: dict, is_output: bool, tolerances: Tolerances) -> tuple:
        other_order = int(match["other_order"])
        return (str(base.path), int(order), int(order) in base.dump.estimated_orders, str(pair.other.path),
                other_order, other_order in pair.other.dump.estimated_orders, tuple(match["base_shape"]),
                tuple(match["other_shape"]), str(match.get("base_layout") or ""),
                str(match.get("other_layout") or ""), str(match["key"]), is_output, tolerances.atol, tolerances.rtol)

    def recall(self, key: tuple, row: dict, problems: list[str]) -> bool:
        """Fill `row` from the remembered measurement of `key`; False when there is none."""
        found = self.rows.get(key)
        if found is None:
            return False
        measured, said = found
        row.update(measured)
        problems.extend(said)
        self.hits += 1
        return True

    def remember(self, key: tuple, row: dict, said: list[str]) -> None:
        self.rows[key] = ({k: v for k, v in row.items() if k not in self.IDENTITY}, list(said))


def compare_all(plan: Plan, rules: NameRules, tolerances: Tolerances, steps: Steps | None = None,
                memo: MeasureMemo | None = None) -> Comparison:
    """Align every pair, then measure all of them, reading each base tensor once (`steps` shows
    the progress of both: a golden against renamed runs at a real input size takes a while). `memo`: rows
    measured by an earlier analysis of the same files, reused (MeasureMemo)."""
    steps = steps or Steps.quiet()
    runs = {id(p.base): p.base for p in plan.pairs} | {id(p.other): p.other for p in plan.pairs}
    runs[id(plan.reference)] = plan.reference
    graphs = {run.label: run_graph(run) for run in runs.values()}
    alignments = [_align(p, rules, steps) for p in plan.pairs]
    for pair, alignment in zip(plan.pairs, alignments):
        relabel_unmatched(alignment, pair.base, pair.other)
    comparison = Comparison(plan=plan, table=pd.DataFrame(), alignments=alignments, graphs=graphs,
                            storage={run.label: sampled_evidence(run) for run in runs.values()})
    for index, (pair, alignment) in enumerate(zip(plan.pairs, alignments)):
        if alignment.matched.empty:
            comparison.problems.append(
                f"{pair.other.shown_path}: no layer in common with {pair.base.shown_path.name} (names differ and no "
                "layer matched by structure and values: a different model? try --name-map or --rename)")
    rows = _Rows()
    kernel = PairKernel(tolerances)
    bases = list({id(p.base): p.base for p in plan.pairs}.values())
    total = sum(len(a.matched) for a in alignments)
    with steps.step(f"measuring {total} matched layers", total) as advance:
        counter = _Progress(total, advance)
        for base in bases:
            members = [(i, p, alignments[i]) for i, p in enumerate(plan.pairs) if p.base is base]
            _stream_base(base, members, kernel, tolerances, graphs[base.label], rows, comparison.problems,
                         counter.tick, memo)
    comparison.table = rows.frame()
    comparison.outputs = kept_outputs(plan, alignments, graphs)
    comparison.table["growth"], comparison.table["worst_input"] = _growth(comparison.table, plan.pairs, graphs)
    blocks = layer_blocks(comparison.table["key"])
    if blocks:  # a graph named block by block (llama.cpp's `Qcur-3`): each row says its block
        comparison.table["block"] = comparison.table["key"].map(blocks).astype(float)
    return comparison


def kept_outputs(plan: Plan, alignments: list[PairAlignment], graphs: dict[str, LayerGraph]) -> dict[tuple[str, int], np.ndarray]:
    """The matched model outputs of every run-vs-reference pair, both sides, read once here: what a task
    decodes (layerdiff.analyzer.outputs.judge) is part of the measurement, so judging with another `--task`
    reads no tensor. An output that does not read, or is over MAX_KEPT_OUTPUT_BYTES, is left out (the judge
    then reads it from the dump, and says so if it is unreadable)."""
    kept: dict[tuple[str, int], np.ndarray] = {}
    for pair, alignment in zip(plan.pairs, alignments):
        if pair.kind != "reference" or alignment.matched.empty:
            continue
        outputs = set(graphs[pair.base.label].outputs())
        matched = alignment.matched
        rows = matched[matched["key"].isin(outputs)]
        for base_order, other_order in zip(rows["base_order"].tolist(), rows["other_order"].tolist()):
            for run, order in ((pair.base, int(base_order)), (pair.other, int(other_order))):
                if (str(run.path), order) in kept or order in run.dump.estimated_orders:
                    continue
                declared = run.dump.declared_nbytes(order)
                if declared is not None and declared > MAX_KEPT_OUTPUT_BYTES:
                    continue  # too big to keep: left out without reading it
                try:
                    values = run.dump.tensor(order)
                except (LayerdiffError, OSError):
                    continue
                if values.nbytes <= MAX_KEPT_OUTPUT_BYTES:
                    kept[(str(run.path), order)] = np.array(values)  # its own memory: a buffer is reused
    return kept


def _align(pair: Pair, rules: NameRules, steps: Steps) -> PairAlignment:
    with steps.step(f"aligning {pair.other.label} with {pair.base.label}") as advance:
        return align_layers(pair.base.layers, pair.other.layers, rules, value_error(pair.base, pair.other),
                            both_fp32(pair.base, pair.other), progress=advance,
                            naming=naming_of(pair.base.attrs, pair.other.attrs))


def both_fp32(base: Run, other: Run) -> bool:
    """Neither run declares a reduced precision (a foreign golden that says nothing counts as fp32)."""
    return all(str(r.attrs.get("precision_effective") or "fp32").lower() == "fp32" for r in (base, other))


def value_error(base: Run, other: Run) -> ValueErrors:
    """rel L2 between row i of base's /layers and row j of other's (inf when unreadable or sizes differ).

    Only structural alignment calls it, for the few same-shape candidates of an ambiguous match;
    answers are remembered and screened by fingerprints (`layerdiff.analyzer.align.values`)."""
    base_orders, other_orders = base.layers["order"].tolist(), other.layers["order"].tolist()
    base_layouts, other_layouts = (recorded_layouts(run.layers) for run in (base, other))
    if not (names_axes(base_layouts) and names_axes(other_layouts)):  # as structural alignment sees shapes
        base_layouts, other_layouts = [""] * len(base_layouts), [""] * len(other_layouts)
    # tensors in one axis order (NHWC as NCHW), as structural alignment sees their shapes
    errors = ValueErrors(lambda i: canonical_tensor(_read(base, base_orders[i])[0], base_layouts[i]),
                         lambda j: canonical_tensor(_read(other, other_orders[j])[0], other_layouts[j]))
    if base.dump.estimated_orders or other.dump.estimated_orders:  # a sketch-first run: its summaries answer
        return SketchedValueErrors(errors, base.dump, other.dump, base_orders, other_orders)
    return errors



def _growth(table: pd.DataFrame, pairs: list[Pair], graphs: dict[str, LayerGraph]) -> tuple[list[float], list[str]]:
    """Per row: rel L2 at the layer / worst rel L2 at the layers feeding it (NaN without compared feeders
    or when they are exact), and which feeding layer that worst one is ("" without one).

    Above 1 the layer amplifies the error it received; the findings name the largest amplifier, and
    follow the worst inputs back to where the error entered (a big jump, not a doubling).
    """
    growth = [math.nan] * len(table)
    worst = [""] * len(table)
    for index, rows in table.groupby("pair"):
        graph = graphs[pairs[int(index)].base.label]
        keys = rows["key"].tolist()
        rel = dict(zip(keys, rows["rel_l2"].tolist()))
        known = set(rel)
        for i, key in zip(rows.index.tolist(), keys):
            inputs = [(rel[k], k) for k in graph.upstream(key, known) if math.isfinite(rel[k])]
            worst_in, worst_key = max(inputs, default=(0.0, ""))
            worst[i] = worst_key
            if worst_in > 0.0 and math.isfinite(rel[key]):
                growth[i] = rel[key] / worst_in
    return growth, worst


class _Progress:
    """Counts layer comparisons for an optional progress callback (done, total)."""

    def __init__(self, total: int, callback: Callable[[int, int], None] | None) -> None:
        self.total, self.done, self.callback = total, 0, callback

    def tick(self) -> None:
        self.done += 1
        if self.callback:
            self.callback(self.done, self.total)


def _stream_base(base: Run, members: list[tuple[int, Pair, PairAlignment]], kernel: PairKernel,
                 tolerances: Tolerances, graph: LayerGraph, rows: "_Rows", problems: list[str],
                 tick: Callable[[], None], memo: MeasureMemo | None = None) -> None:
    """Visit the base's layers in execution order; read each once for all pairs that need it (not at all when
    `memo` remembers every row that needs it)."""
    base_stats = base.stats_by_order()
    outputs = set(graph.outputs())
    # the matches as one list per column, a row's dict built only when it is measured: a dict per
    # match held ~1 KB per layer for the whole pass (50 MB at 50,000 layers)
    wanted: dict[int, list[tuple[int, Pair, dict[str, list], int]]] = {}
    for index, pair, alignment in members:
        columns = {str(c): alignment.matched[c].tolist() for c in alignment.matched.columns}
        for i, base_order in enumerate(columns.get("base_order", [])):
            wanted.setdefault(base_order, []).append((index, pair, columns, i))
    positions = {int(o): i for i, o in enumerate(base.layers["order"])}
    base_buffer, other_buffer = TensorBuffer(), TensorBuffer()  # two layers' memory, reused: no page faults
    for order in sorted(wanted, key=lambda o: positions.get(o, o)):
        pending = []
        for index, pair, columns, i in wanted[order]:
            match = {c: values[i] for c, values in columns.items()}
            row = _layer_row(index, pair, match, positions.get(order, order), match["key"] in outputs)
            key = MeasureMemo.key(base, order, pair, match, row["is_output"], tolerances) if memo is not None else None
            if key is not None and memo.recall(key, row, problems):
                rows.append(row)
                tick()
            else:
                pending.append((pair, match, row, key))
        if pending:
            _measure_order(base, order, pending, base_stats, kernel, tolerances, rows, problems, tick, memo,
                           base_buffer, other_buffer)


def _measure_order(base: Run, order: int, pending: list[tuple[Pair, dict, dict, tuple | None]], base_stats: dict,
                   kernel: PairKernel, tolerances: Tolerances, rows: "_Rows", problems: list[str],
                   tick: Callable[[], None], memo: MeasureMemo | None, base_buffer: TensorBuffer,
                   other_buffer: TensorBuffer) -> None:
    """Measure the rows of one base layer that no memo answered, reading the base tensor once for them."""
    estimated = order in base.dump.estimated_orders  # left on the device: measured from its summary
    summaries_only = estimated or all(int(match["other_order"]) in pair.other.dump.estimated_orders
                                      for pair, match, _row, _key in pending)
    base_tensor, base_error = (None, "") if summaries_only else _read(base, order, base_buffer)
    if base_error:
        problems.append(base_error)
    for pair, match, row, key in pending:
        said: list[str] = []
        if base_error:
            row.update(status="unreadable", reasons=f"reference tensor unreadable: {base_error}")
        elif summaries_only or int(match["other_order"]) in pair.other.dump.estimated_orders:
            _estimate(row, base, order, base_tensor, pair, match, kernel, tolerances, said)
        else:
            judged, judged_stats, _moved = _plain_side(base, match["key"], base_tensor, base_stats[order], row["is_output"])
            _measure(row, judged, pair, match, kernel, tolerances, judged_stats, said, other_buffer)
        problems.extend(said)
        if key is not None and not base_error:
            memo.remember(key, row, said)
        rows.append(row)
        tick()
    del base_tensor


def _measure(row: dict, base_tensor: np.ndarray, pair: Pair, match: dict, kernel: PairKernel,
             tolerances: Tolerances, base_stats: dict, problems: list[str],
             buffer: TensorBuffer | None = None) -> None:
    """Fill one row's metrics from the two tensors (the run's is read here); status `measured`, or why not."""
    axes = matched_axes(match)
    if axes.status == "mismatch":
        row.update(status="shape_mismatch", reasons=axes.reason)
        return
    if not axes.measurable:
        row.update(status="layout_mismatch", reasons=axes.reason)
        return
    other_tensor, error = _read(pair.other, match["other_order"], buffer)
    if error:
        problems.append(error)
        row.update(status="unreadable", reasons=error)
        return
    other_tensor, other_stats, moved = _plain_side(pair.other, match["other_key"], other_tensor,
                                                   pair.other.stats_by_order()[match["other_order"]], row["is_output"])
    if other_tensor.size != base_tensor.size:
        row.update(status="shape_mismatch", reasons="stored tensor sizes differ")
        return
    try:  # the run's tensor in the reference's axis order (a transpose view when the recorded axes differ)
        other_tensor = axes.apply(other_tensor, base_tensor.shape)
    except ValueError:  # the stored tensor does not have the shape its /layers row declares
        row.update(status="shape_mismatch", reasons="stored tensor shape differs from the one recorded in /layers")
        return
    row.update(kernel.compare(base_tensor, other_tensor, base_stats, other_stats))
    if row["is_output"]:  # top-k only where the output is recognisably class scores (measure/classes.py)
        agree = topk_agreement(base_tensor, other_tensor, decision_tolerance(base_tensor, tolerances, base_stats))
        row.update(top1=agree["top1"], top5=agree["top5"], n_top1_flips=agree["n_flips"],
                   n_tie_flips=agree["n_tie_flips"])
    row["status"], row["reasons"] = MEASURED, ""
    row["plain_judged"] = moved  # a fact for the judge: this output's numbers are the plain run's


def _estimate(row: dict, base: Run, order: int, base_tensor: np.ndarray | None, pair: Pair, match: dict,
              kernel: PairKernel, tolerances: Tolerances, problems: list[str]) -> None:
    """Fill one row from the tensors' summaries (one side or both left on the device): every metric with
    its uncertainty, `estimated` set; status `measured`, or why not (analyzer/measure/estimate.py)."""
    axes = matched_axes(match)
    if axes.status == "mismatch":
        row.update(status="shape_mismatch", reasons=axes.reason)
        return
    if axes.status not in ("same", "squeezed"):
        row.update(status="not_pulled", reasons="a summary compares only with a tensor in the same axis order; "
                                                  "pull this layer whole")
        return
    try:
        ref = base.dump.summary(order)  # a tensor held whole: its sketch, computed once per file version
        run = pair.other.dump.summary(int(match["other_order"]))
        row.update(estimate_layer(ref, run, tolerances, kernel))
    except (LayerdiffError, ValueError) as err:
        problems.append(f"{pair.other.shown_path}: {match['key']}: {err}")
        row.update(status="unreadable", reasons=str(err))
        return
    row["status"], row["reasons"] = MEASURED, ""


def _plain_side(run: Run, key: str, tensor: np.ndarray, stats: dict, is_output: bool) -> tuple[np.ndarray, dict, bool]:
    """(tensor, stats, moved): a model output is judged as the plain run computed it, when the dump stored that
    run (FORMATS.md §2 `/plain_outputs`); `moved` says observing changed it. Other layers are as dumped."""
    plain = run.plain_outputs().get(key) if is_output else None
    if plain is None or plain.size != tensor.size:
        return tensor, stats, False
    observed = np.asarray(tensor).reshape(plain.shape)
    moved = observed.dtype != plain.dtype or observed.tobytes() != plain.tobytes()
    if not moved:
        return tensor, stats, False
    from layerdiff.analyzer.formats.tensorstats import tensor_stats

    return plain, {**stats, **tensor_stats(plain).as_dict()}, True


def matched_axes(match: dict) -> AxisMap:
    """How a matched row's run tensor maps onto the reference's (decided again from the row's recorded
    layouts and shapes: the answer is cached, and the matched table stays plain data)."""
    return axis_map(str(match.get("base_layout") or ""), tuple(match["base_shape"]),
                    str(match.get("other_layout") or ""), tuple(match["other_shape"]))


def _read(run: Run, order: int, buffer: TensorBuffer | None = None) -> tuple[np.ndarray | None, str]:
    try:
        return run.dump.tensor(int(order), buffer), ""
    except LayerdiffError as err:
        return None, str(err)


def _layer_row(index: int, pair: Pair, match: dict, position: int, is_output: bool) -> dict:
    return {
        "pair": index, "comparison": pair.kind, "run": pair.other.label, "reference": pair.base.label,
        "position": position, "key": match["key"], "run_key": match["other_key"], "op": match["op"],
        "op_type": match["op_type"], "shape": _shape_text(tuple(match["base_shape"])),
        "run_shape": _shape_text(tuple(match["other_shape"])), "shape_status": match["shape_status"],
        "permutation": match["permutation"],
        "match": match["match"], "confidence": match["confidence"], "is_output": is_output, "top1": math.nan, "top5": math.nan,
        "n_top1_flips": math.nan, "n_tie_flips": math.nan,
    }


@functools.lru_cache(maxsize=4096)
def _shape_text(shape: tuple) -> str:
    """A shape as the table shows it, `[1, 64, 56, 56]`; layers share shapes, so rows share the string."""
    return json.dumps(list(shape))


TABLE_COLUMNS = [
    "pair", "comparison", "run", "reference", "position", "key", "run_key", "op", "op_type", "status",
    "reasons", "shape", "run_shape", "shape_status", "permutation", "match", "confidence", "is_output", "numel", "max_abs",
    "mean_abs", "median_abs", "p99_abs", "max_rel", "mean_rel", "rel_l2", "cosine", "sqnr_db",
    "pass_fraction", "n_fail", "beyond_scale", "n_nonfinite_mismatch", "n_nan_new", "n_nan_lost", "n_posinf_new",
    "n_posinf_lost", "n_neginf_new", "n_neginf_lost", "zero_collapse", "n_zero_collapsed",
    "n_saturated", "n_zero_new", "n_out_of_range", "ref_min", "ref_max", "run_min", "run_max", "range_excess",
    "top1", "top5", "n_top1_flips", "n_tie_flips", "plain_judged", "estimated", *SIGMA_COLUMNS,
]  # plus "growth" and "worst_input", added once every row of a pair is known


class _Rows:
    """Measured rows, turned into DataFrame blocks every `BLOCK` rows: a dict per layer costs ~3 KB,
    which at 50,000 layers was ~150 MB of peak memory before the table was built."""

    BLOCK = 2048

    def __init__(self) -> None:
        self._pending: list[dict] = []
        self._blocks: list[pd.DataFrame] = []

    def append(self, row: dict) -> None:
        self._pending.append(row)
        if len(self._pending) >= self.BLOCK:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._blocks.append(_tidy(pd.DataFrame(self._pending)))
            self._pending = []

    def frame(self) -> pd.DataFrame:
        self._flush()
        if not self._blocks:
            return _tidy(pd.DataFrame())
        return pd.concat(self._blocks, ignore_index=True) if len(self._blocks) > 1 else self._blocks[0]


def _tidy(frame: pd.DataFrame) -> pd.DataFrame:
    for column in TABLE_COLUMNS:
        if column not in frame:
            frame[column] = math.nan
    return frame[TABLE_COLUMNS].reset_index(drop=True)
