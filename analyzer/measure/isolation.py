"""Isolated dumps in the analysis: the error a layer makes alone, next to the error it shows in the full run.

`collect isolate` re-runs chosen layers on one backend/precision, each fed the *reference's* own
input tensors (collector/run/isolate.py). Measured against that reference with the same metrics and
thresholds as every other layer, the isolated error splits the blame that a cumulative comparison
cannot: a layer still off when run alone has a kernel that is off at this precision; a layer clean
alone only inherited error from upstream.

Matching rules (when one fails, the isolated dump is left out with one problem line saying why):
- reference: the dump named by the root attribute `isolated_from`. Among the inputs first (a copy in
  the isolated file's own directory preferred), else the file of that name beside the isolated
  dump. When `reference_sha256` is recorded the file must hash to it, so a reference re-collected
  under the same name is not mistaken for the one whose tensors were fed.
- cumulative run: a compared (non-isolated) run with the same `MATCH_FIELDS` as the isolated dump,
  fed the same input as the reference; the lowest repeat when there are several.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from layerdiff.analyzer.align.graph import LayerGraph, run_graph
from layerdiff.analyzer.measure.comparison import MEASURED, Comparison
from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import LayerdiffError
from layerdiff.analyzer.measure.storage import stores_fp16
from layerdiff.analyzer.measure.tolerances import Tolerances
from layerdiff.analyzer.runs.header import raw_header
from layerdiff.analyzer.runs.reference import Plan
from layerdiff.analyzer.runs.sources import Run

# What becomes of reference values an isolated layer's input type cannot hold: the harness that feeds each
# input in the type the node reads (ggml) converts them to Inf; where the engine stores activations as fp16
# (MNN's Arm82 backend, ncnn's fp16 storage) they become Inf or are clipped, as the engine converts.
FED_AS_INF = "enter as Inf"
FED_CHANGED = "cannot enter as they are (they become Inf or are clipped at 65504)"
MATCH_FIELDS = ("engine", "backend_requested", "precision_requested", "device_serial", "model_sha256")
# Isolated metrics kept per layer; each becomes an `isolated_<name>` column.
ISOLATED_METRICS = ("rel_l2", "max_abs", "mean_abs", "sqnr_db", "cosine", "pass_fraction", "n_nonfinite_mismatch",
                    "n_saturated", "zero_collapse")
# Columns added to the tidy comparison table (summary.csv, --json layers) for isolated layers.
ATTACHED_COLUMNS = ["isolated_status", "isolated_rel_l2", "isolated_max_abs", "isolated_sqnr_db", "isolation",
                    "isolated_reasons", "isolated_file"]
TABLE_COLUMNS = ["run", "pair", "position", "key", "op_type", "status", "rel_l2", "max_abs", "sqnr_db",
                 "isolated_status", "isolated_reasons", *(f"isolated_{m}" for m in ISOLATED_METRICS),
                 "isolated_nonfinite_new", "reference_peak", "isolated_fed_overflow", "isolated_fed", "isolated_fed_effect",
                 "isolated_range", "isolation",
                 "isolated_file", "isolated_reference", "isolated_setting",
                 "isolated_metrics"]  # every metric of the isolated layer, for the judge


@dataclass
class Isolation:
    """Every isolated layer shown (one row each), its finding, and the dumps that could not be placed."""

    table: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TABLE_COLUMNS))
    findings: list = field(default_factory=list)  # filled by the judge (layerdiff.analyzer.findings.isolation)
    problems: list[str] = field(default_factory=list)
    matched: list[dict] = field(default_factory=list)  # per isolated dump: file, reference, run, layers
    opened: list[Run] = field(default_factory=list)  # references opened from beside an isolated dump

    def close(self) -> None:
        for run in self.opened:
            run.dump.close()


def measure_isolated(isolated: list[Run], runs: list[Run], comparison: Comparison,
                     tolerances: Tolerances) -> Isolation:
    """Match each isolated dump and measure its layers against its reference (status `measured`, or why
    not); the judge (layerdiff.analyzer.findings.isolation) says where the blame lies."""
    result = Isolation()
    if not isolated:
        return result
    from layerdiff.analyzer.measure.metrics import PairKernel  # the kernels: only when there is something to measure

    kernel = PairKernel(tolerances)
    references = _ReferenceFinder(runs, result)
    graphs: dict[int, LayerGraph] = {}  # per reference: which tensors feed each isolated layer
    rows: list[dict] = []
    shown: dict[tuple[str, str], str] = {}
    for iso in isolated:
        reference = references.find(iso)
        if reference is None:
            continue
        index = _cumulative_pair(iso, reference, runs, comparison.plan, result.problems)
        if index is None:
            continue
        pair = comparison.plan.pairs[index]
        if not references.same_file(pair.base, reference, iso):
            result.problems.append(
                f"{iso.path}: isolated against {reference.path.name} while {pair.other.label} is compared with "
                f"{pair.base.path.name}; its isolated and cumulative columns use different references")
        layers = []
        for layer in iso.layers.to_dict("records"):
            where = (pair.other.label, str(layer["key"]))
            if where in shown:
                result.problems.append(f"{iso.path}: layer {layer['key']} of {pair.other.label} is also isolated in "
                                       f"{shown[where]}; showing that one")
                continue
            if id(reference) not in graphs:
                graphs[id(reference)] = run_graph(reference)
            row = _measure_layer(iso, reference, layer, kernel, result.problems, graphs[id(reference)])
            row.update(run=pair.other.label, pair=index, status="")
            shown[where] = iso.path.name
            rows.append(row)
            layers.append(row["key"])
        result.matched.append({"file": str(iso.path), "isolated_from": str(iso.attrs.get("isolated_from", "")),
                               "reference": str(reference.path), "run": pair.other.label, "layers": layers})
    result.table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    return result


class _ReferenceFinder:
    """Finds (and hash-checks) the reference of each isolated dump, opening files beside it if needed."""

    def __init__(self, runs: list[Run], result: Isolation) -> None:
        self.runs, self.result = runs, result
        self._hashes: dict[Path, str] = {}
        self._beside: dict[Path, Run | None] = {}

    def find(self, iso: Run) -> Run | None:
        name = str(iso.attrs.get("isolated_from") or "")
        if not name:
            return self._fail(f"{iso.path}: isolated dump without an isolated_from attribute; re-run `collect isolate`")
        here = iso.path.parent.resolve()
        candidates = sorted((r for r in self.runs if r.path.name == name),
                            key=lambda r: r.path.parent.resolve() != here)
        if not candidates:
            beside = self._open_beside(iso.path.parent / name)
            candidates = [beside] if beside is not None else []
        if not candidates:
            return self._fail(f"{iso.path}: isolated against {name}, which is neither among the inputs nor in "
                              f"{iso.path.parent}; pass that reference dump to analyze too")
        wanted = str(iso.attrs.get("reference_sha256") or "")
        for run in candidates:
            if not wanted or self._sha256(run.path) == wanted:
                return run
        return self._fail(f"{iso.path}: {candidates[0].path} is not the {name} it was isolated against (sha256 "
                          "differs: re-collected since?); re-run `collect isolate` against this reference")

    def same_file(self, base: Run, reference: Run, iso: Run) -> bool:
        """Is the run's comparison base the isolation's reference (the same path, or the same bytes)?"""
        if base.path.resolve() == reference.path.resolve():
            return True
        wanted = str(iso.attrs.get("reference_sha256") or "")
        return bool(wanted) and self._sha256(base.path) == wanted

    def _fail(self, line: str) -> None:
        self.result.problems.append(line)
        return None

    def _sha256(self, path: Path) -> str:
        key = path.resolve()
        if key not in self._hashes:
            from layerdiff.analyzer.formats.rawdump import sha256_file  # isolated dumps only: not every analysis

            self._hashes[key] = sha256_file(key)
        return self._hashes[key]

    def _open_beside(self, path: Path) -> Run | None:
        key = path.resolve()
        if key not in self._beside:
            self._beside[key] = None
            if path.is_file():
                try:
                    dump = DumpFile(path)
                except LayerdiffError as err:
                    self.result.problems.append(str(err))
                else:
                    run = Run(path=path, dump=dump, attrs=dump.attrs, label=path.stem)
                    self.result.opened.append(run)
                    self._beside[key] = run
        return self._beside[key]


def same_setting(a: Run, b: Run) -> bool:
    """Same engine, backend, precision, device and model: what an isolated dump shares with its run."""
    return all(str(a.attrs.get(f) or "") == str(b.attrs.get(f) or "") for f in MATCH_FIELDS)


def setting_label(run: Run) -> str:
    attrs = run.attrs
    device = attrs.get("device_serial") or attrs.get("device_model") or "?"
    setting = f"{attrs.get('backend_requested', '')}/{attrs.get('precision_requested', '')}"
    return f"{attrs.get('engine', '')} {setting} on {device}"


def _cumulative_pair(iso: Run, reference: Run, runs: list[Run], plan: Plan, problems: list[str]) -> int | None:
    """Index of the plan's reference pair whose run shares the isolated dump's setting and the reference's input."""
    def fits(run: Run) -> bool:
        return same_setting(iso, run) and (not reference.input_key or run.input_key == reference.input_key)

    pairs = [(i, p.other) for i, p in enumerate(plan.pairs) if p.kind == "reference" and fits(p.other)]
    if pairs:
        return min(pairs, key=lambda item: item[1].repeat)[0]
    idle = [r.label for r in runs if fits(r)]
    why = (f"; {idle[0]} matches but is not compared with a reference (it is one)" if idle else
           "; pass that run's dump too to see isolated next to cumulative errors")
    problems.append(f"{iso.path}: no compared run of {setting_label(iso)} fed the same input as "
                    f"{reference.path.name} among the inputs{why}")
    return None


def _measure_layer(iso: Run, reference: Run, layer: dict, kernel: PairKernel, problems: list[str],
                   graph: LayerGraph) -> dict:
    """One isolated layer against the same layer of its reference, with the analyzer's own metrics."""
    key = str(layer["key"])
    row = {c: math.nan for c in TABLE_COLUMNS} | {
        "key": key, "op_type": str(layer["op_type"]), "isolated_status": "", "isolated_reasons": "", "isolation": "",
        "isolated_file": iso.path.name, "isolated_reference": reference.path.name,
        "isolated_setting": f"{iso.attrs.get('backend_requested', '')}/{iso.attrs.get('precision_requested', '')}"}
    ref_layers = reference.layers
    hits = ref_layers.index[ref_layers["key"] == key]
    if not len(hits):
        return _unmeasured(row, "not_in_reference", f"{iso.path}: isolated layer {key} is not in its reference "
                           f"{reference.path.name}", problems)
    ref_row = ref_layers.loc[hits[0]]
    row["op_type"] = str(ref_row["op_type"] or layer["op_type"])  # the model's op type (MNN's harness writes "isolated")
    ref_order, iso_order = int(ref_row["order"]), int(layer["order"])
    try:
        ref_tensor, iso_tensor = reference.dump.tensor(ref_order), iso.dump.tensor(iso_order)
    except LayerdiffError as err:
        return _unmeasured(row, "unreadable", str(err), problems)
    if ref_tensor.size != iso_tensor.size:
        return _unmeasured(row, "shape_mismatch", f"{iso.path}: isolated layer {key} has shape "
                           f"{list(iso_tensor.shape)}, its reference {list(ref_tensor.shape)}", problems)
    metrics = kernel.compare(ref_tensor, iso_tensor.reshape(ref_tensor.shape), reference.stats_by_order()[ref_order],
                             iso.stats_by_order()[iso_order])
    row["isolated_status"], row["isolated_metrics"] = MEASURED, metrics
    row.update({f"isolated_{m}": metrics[m] for m in ISOLATED_METRICS})
    row["isolated_nonfinite_new"] = int(metrics["n_nan_new"] + metrics["n_posinf_new"] + metrics["n_neginf_new"])
    row["reference_peak"] = max(abs(float(ref_row["min"])), abs(float(ref_row["max"])))
    row["isolated_fed_overflow"], row["isolated_fed"], row["isolated_fed_effect"] = fed_overflow(iso, key, reference, graph)
    row["isolated_range"] = isolated_range(iso, key)
    return row


def isolated_range(iso: Run, key: str) -> str:
    """'' for a layer run alone; for the output of a sub-graph isolated as one piece (ggml's FIRST..LAST), its
    nodes: 'conv.im2col .. conv.out (7 nodes)'."""
    isolation = raw_header(iso).get("isolation")
    ranges = isolation.get("ranges") if isinstance(isolation, dict) else None
    nodes = ranges.get(key.removesuffix(":0")) if isinstance(ranges, dict) else None
    if not isinstance(nodes, list) or len(nodes) < 2:
        return ""
    return f"{nodes[0]} .. {nodes[-1]} ({len(nodes)} nodes)"


def fed_overflow(iso: Run, key: str, reference: Run, graph: LayerGraph) -> tuple[int, str, str]:
    """Reference values the layer's own input type could not hold: (count, a clause naming them, what became
    of them). A harness that counted them says so in the header (`recorded_fed`); otherwise they are read off
    the reference's /layers counts of the tensors feeding the layer (`fed_beyond_fp16`)."""
    recorded = recorded_fed(iso, key)
    if recorded is not None:
        return (*recorded, FED_AS_INF)
    return (*fed_beyond_fp16(iso, key, reference, graph), FED_CHANGED)


def recorded_fed(iso: Run, key: str) -> tuple[int, str] | None:
    """The values the harness counted, or None when it counts none (its header has no `isolation.fed`).

    Why: ggml's harness feeds an isolated node its inputs in the type the node reads them at this
    precision (f16 where the graph makes them f16), so a reference value above 65504 enters as Inf and
    the NaN that follows is the input's type, not the node's kernel.
    """
    isolation = raw_header(iso).get("isolation")
    fed = isolation.get("fed") if isinstance(isolation, dict) else None
    if not isinstance(fed, dict):
        return None
    entries = fed.get(key.removesuffix(":0")) or fed.get(key) or []
    lost = [e for e in entries if isinstance(e, dict) and isinstance(e.get("overflow"), (int, float)) and e["overflow"] > 0]
    clauses = [_fed_clause(e.get("src"), e.get("type"), int(e["overflow"]), int(e.get("values") or 0),
                           float(e.get("reference_peak") or 0)) for e in lost]
    return sum(int(e["overflow"]) for e in lost), "; ".join(clauses)


def fed_beyond_fp16(iso: Run, key: str, reference: Run, graph: LayerGraph) -> tuple[int, str]:
    """Values above fp16's 65504 in the reference tensors that feed the layer, when the isolated run stores
    activations as fp16 (its `precision_effective`): fed as they are, they cannot enter the layer unchanged.

    Why: an engine that stores fp16 (MNN's Arm82 backend, ncnn's fp16 storage) converts each fed tensor; a
    layer downstream of an overflowing one then fails alone because of what it was fed, not its kernel.
    Read from the reference's /layers counts (`n_fp16_overflow`), no tensor."""
    counted = ("n_fp16_overflow", "numel", "min", "max")
    if not stores_fp16(str(iso.attrs.get("precision_effective") or "")) or not set(counted) <= set(reference.layers):
        return 0, ""  # a dump without the counts (a foreign producer's) says nothing either way
    rows = reference.layers.drop_duplicates("key").set_index("key")[list(counted)]
    lost = []
    for source in graph.producers.get(key, ()):
        if source not in rows.index:
            continue
        over, values, low, high = (float(v) for v in rows.loc[source])
        if over > 0:  # NaN (a damaged count) is not
            peak = max(abs(low), abs(high))
            lost.append((int(over), _fed_clause(source, "fp16", int(over), int(values) if values == values else 0, peak)))
    return sum(n for n, _ in lost), "; ".join(clause for _, clause in lost)


def _fed_clause(source, type_name, overflow: int, values: int, peak: float) -> str:
    return (f"{source} as {type_name} ({overflow} of its {values} reference values, up to {peak:.4g}, are beyond "
            "that type's range)")


def _unmeasured(row: dict, status: str, problem: str, problems: list[str]) -> dict:
    problems.append(problem)
    row.update(isolated_status=status, isolated_reasons=problem)
    return row
