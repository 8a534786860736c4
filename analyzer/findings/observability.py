"""What a backend lets us see: tensors it never wrote, zeros it never wrote, and graphs it split.

Every run records how it knows its dumped tensors were written (`observability`, FORMATS.md §1) and lists
the tensors it could not observe (`not_observable`: never written, fused away, stale, not readable, each
with the fact that tells it: a sentinel that survived the run, the engine's own record). The analyzer reads
that record, never the engine's name: such tensors are reported as "not observable on this backend", never
as a missing layer, a failing layer, a divergence or nondeterminism.

A few outputs of an engine that reads intermediates back indirectly (the record's `indirect`: LiteRT's GPU
accelerator, every activation made a model output) read back as all zeros while every op consuming them
agrees with the reference: the sentinel was overwritten, but with the zeros of a buffer the accelerator
never computed into. Such a layer is marked `not_observable` (neither pass nor fail) only when the run
declares indirect readback and every consumer agrees, so a real zero collapse (its consumers then diverge
too) still fails.

A run whose graph the accelerator split between GPU and CPU (`options.placement.split`) gets a
`split_graph` finding naming the rejected operator types, the op counts and, where the engine could
derive it (`options.placement.per_op`), the first CPU layers by name. LiteRT's GPU accelerator derives
its per-op list from TFLite's partition rule; the C++ harness's MNN engine observes it (an op whose
outputs are host tensors in a GPU session ran on MNN's CPU backup) and says so in `per_op.how`.
"""
from __future__ import annotations

import pandas as pd

from layerdiff.analyzer.findings.finding import MAX_NAMED, Finding, FindingKind, Severity, named
from layerdiff.analyzer.runs.header import declared_unobservable, raw_footer, raw_header, reads_back_indirectly  # noqa: F401

NOT_WRITTEN_ZEROS = ("not observable on this backend: read back as all zeros while every op consuming it agrees "
                     "with the reference (the backend never filled this tensor's buffer; its computation is right)")


def mark_unwritten_zeros(table: pd.DataFrame, pairs, graphs: dict) -> pd.DataFrame:
    """Failing all-zero layers of indirectly read runs whose every consumer agrees: `not_observable`."""
    if table.empty:
        return table
    for index, pair in enumerate(pairs):
        if not reads_back_indirectly(pair.other):
            continue  # the engine reads every tensor from the op that produced it: its zeros are real
        rows = table[table["pair"] == index]
        status = dict(zip(rows["key"], rows["status"]))
        graph = graphs[pair.base.label]
        zeros = rows[(rows["status"] == "fail") & (rows["zero_collapse"].fillna(0) >= 1.0)]
        for i, key in zip(zeros.index, zeros["key"]):
            users = graph.consumers.get(key, ())
            if users and all(status.get(u) in ("pass", "warn") for u in users):
                table.loc[i, "status"] = "not_observable"
                table.loc[i, "reasons"] = NOT_WRITTEN_ZEROS
    return table


def split_graph(run) -> list[Finding]:
    """A graph the accelerator split between GPU and CPU: which operator types it refused, how many ran where,
    and (where the engine derived it, FORMATS.md) which operators by name fell back to the CPU."""
    placement = raw_header(run).get("options", {}).get("placement")
    if not isinstance(placement, dict) or not placement.get("split"):
        return []
    rejected = placement.get("rejected") or []
    refused = "; ".join(f"{r.get('op_type')}: {r.get('reason')}" for r in rejected) or "no reason given"
    counts = (f"{placement.get('gpu_ops')} operators on the GPU and {placement.get('cpu_ops')} on the CPU "
              f"(of {placement.get('ops')})" if placement.get("gpu_ops") is not None else "part of the graph on the CPU")
    where, cpu_layers = _cpu_operators(placement.get("per_op"))
    numbers = {k: placement.get(k) for k in ("gpu_ops", "cpu_ops", "ops", "rejected", "weight_ops", "adapter")}
    numbers["cpu_layers"] = cpu_layers
    return [Finding(FindingKind.SPLIT_GRAPH, run.label, "", ",".join(str(r.get("op_type")) for r in rejected),
                    f"Split graph in {run.label}: the GPU accelerator ({placement.get('adapter') or 'adapter unknown'}) "
                    f"refused {refused}, so it ran {counts}, tensors crossing between them: its numbers are a "
                    f"GPU+CPU mix, and an error can come from the hand-over as much as from a GPU kernel. {where}",
                    severity=Severity.WARN, numbers=numbers)]


def _cpu_operators(per_op) -> tuple[str, list[str] | None]:
    """The sentence naming the first CPU operators, and every CPU layer's name (None: not known per operator)."""
    if not isinstance(per_op, dict) or not per_op.get("derived"):
        why = per_op.get("why") if isinstance(per_op, dict) else ""
        return f"Which operators fell back is known only by type{' (' + why + ')' if why else ''}.", None
    cpu = [c for c in per_op.get("cpu") or [] if isinstance(c, dict)]
    layers = [f"{c.get('name')} ({c.get('op_type')})" for c in cpu if not c.get("weight")]
    weights = [c for c in cpu if c.get("weight")]
    types = ", ".join(sorted({str(c.get("op_type")) for c in weights}))
    parts = ([f"layer(s) {named(layers)}"] if layers else []) + \
            ([f"{len(weights)} weight-decoding operator(s) ({types})"] if weights else [])
    how = per_op.get("how") or "derived from TFLite's partition rule, which reproduces the accelerator's counts"
    return (f"On the CPU: {' and '.join(parts) or 'nothing'}; every other layer ran on the GPU ({how}).",
            [c.get("name") for c in cpu if not c.get("weight")])


def plain_run_record(run) -> dict | None:
    """The engine's comparison of the observed run with a plain run (FORMATS.md §1 `plain_run`): the footer's,
    or the header's `options.plain_run` of dumps written before the footer carried it; None when absent."""
    record = raw_footer(run).get("plain_run")
    if not isinstance(record, dict):
        record = raw_header(run).get("options", {}).get("plain_run")
    return record if isinstance(record, dict) else None


def observation_changed(run, warn_rel_l2: float) -> list[Finding]:
    """The model run as an app runs it (no tensor observed) gives other outputs than the dumped run: observing
    changed the computation. The verdict then judges the plain run's outputs (compare.py), the layer values
    describe the observed computation, and the sentence says what the engine does differently when observed
    (the record's `observing`, written by the engine)."""
    record = plain_run_record(run)
    if record is None:
        return []
    outputs = [o for o in record.get("outputs") or [] if isinstance(o, dict)]
    moved = [o for o in outputs if _moved(o.get("vs_observed"))]
    if not moved:
        return []
    far = [o for o in moved if _beyond(o.get("vs_observed"), warn_rel_l2)]
    spread = [o.get("vs_second_plain_run") for o in outputs if isinstance(o.get("vs_second_plain_run"), dict)]
    steady = bool(spread) and all(d.get("identical") for d in spread if d.get("compared"))
    observing = str(record.get("observing") or "the engine did not say what it does differently when observed")
    sentence = (f"Observing changed the result in {run.label}: the model run as an app runs it (no layer observed, "
                f"same input and configuration) gives other outputs than the dumped run: {_listed(moved, 'vs_observed')}"
                f"{' (two plain runs agree bit for bit: the difference is the observation, not run-to-run spread)' if steady else ''}. "
                "The verdict judges the plain run's outputs; the layer values describe the observed computation. "
                f"Observed, this engine runs differently: {observing}.")
    return [Finding(FindingKind.OBSERVATION_CHANGED, run.label, str(moved[0].get("key") or moved[0].get("name") or ""), "",
                    sentence, severity=Severity.FAIL if far else Severity.WARN,
                    numbers={"outputs_moved_by_observation": [o.get("name") for o in moved],
                             "beyond_warn_rel_l2": [o.get("name") for o in far], "plain_runs_identical": steady,
                             "observing": observing, "plain_run": record})]


def observed_vs_plain(run, warn_rel_l2: float) -> list[Finding]:
    """Whether the dumped values describe the app's computation: `observation_changed` when a plain run's
    outputs differ from the observed run's, and `nondeterminism` when two plain runs differ beyond
    `--warn-rel-l2` or the two calibration runs of an observed graph differ at any dumped tensor
    (`options.run_to_run`): the layer values are then one draw of a backend that is not reproducible."""
    found = observation_changed(run, warn_rel_l2)
    check = plain_run_record(run) or {}
    outputs = [o for o in check.get("outputs") or [] if isinstance(o, dict)]
    unstable = [o for o in outputs if _beyond(o.get("vs_second_plain_run"), warn_rel_l2)]
    varying = raw_header(run).get("options", {}).get("run_to_run") or {}
    first_varying = (varying.get("first_differing") or [{}])[0] if varying.get("tensors_differing") else None
    if not unstable and first_varying is None:
        return found
    parts = []
    if first_varying is not None:
        parts.append(f"two runs of the observed graph on the same input differ at {varying['tensors_differing']} of "
                     f"{varying.get('tensors_compared')} dumped tensors, first {first_varying.get('key')} "
                     f"({first_varying.get('op_type')}, max abs {_figure(first_varying, 'max_abs'):.3g}): "
                     "its layer values are one draw of a backend that is not reproducible")
    if unstable:
        parts.append("two plain runs of the same input differ: " + _listed(unstable, "vs_second_plain_run")
                     + "; the engine's results for this model are not reproducible (each run is one draw)")
    layer = str(first_varying.get("key", "")) if first_varying is not None else str(unstable[0].get("name", ""))
    return found + [Finding(FindingKind.NONDETERMINISM, run.label, layer, "",
                            f"Observation check in {run.label}: " + "; and ".join(parts) + ".", severity=Severity.WARN,
                            numbers={"outputs_not_reproducible": [o.get("name") for o in unstable], "plain_run": check,
                                     "run_to_run": varying})]


def _moved(diff) -> bool:
    """Observed and plain outputs differ: bit for bit where the record says (`identical`), else by any amount."""
    if not isinstance(diff, dict) or not diff.get("compared"):
        return False
    if "identical" in diff:
        return not diff.get("identical")
    return not _figure(diff, "rel_l2") == 0.0


def _beyond(diff, warn_rel_l2: float) -> bool:
    """Two runs differ beyond the tolerance; runs the record calls bit-identical never do (a record whose rel L2 is
    infinite only because both runs hold the same infinities)."""
    return (isinstance(diff, dict) and bool(diff.get("compared")) and not diff.get("identical")
            and not _figure(diff, "rel_l2") <= warn_rel_l2)


def _figure(diff, name: str) -> float:
    """A difference figure as a number: a missing, null (JSON has no infinity) or odd value is infinite."""
    try:
        value = float(diff.get(name, 0.0) if isinstance(diff, dict) else "inf")
    except (TypeError, ValueError):
        return float("inf")
    return value if value == value else float("inf")


def _listed(outputs: list[dict], side: str) -> str:
    return ", ".join(f"{o.get('name')} by rel L2 {_figure(o.get(side), 'rel_l2'):.3g} (max abs {_figure(o.get(side), 'max_abs'):.3g})"
                     for o in outputs[:MAX_NAMED])

