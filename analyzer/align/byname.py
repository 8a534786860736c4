"""Matching the layers of two runs by name, so every later step compares like with like.

Runs of one model on different engines or backends do not list the same layers: an engine adds helper
ops on some backends or inserts copies of a blob, converters rename the ops they rewrite. Alignment
therefore never fails: it matches what it can and lists the rest. Matching goes, in order, through
1. the user's explicit name map (`--name-map`, old -> new) and regex rules (`--rename`), applied to
   both runs before anything else, because the user knows best;
2. exact keys `<op>:<output_index>` (multi-output ops keep their index);
3. the name rules the two runs' engines declare (their dumps' `engine_facts`, `align.naming`: renames,
   then how their dump tools write keys) and the engine-neutral ones, only for layers still unmatched
   and only where the normalized key is unique on both sides, so a rule can never steal a layer that
   already matched exactly;
4. when names matched less than half of the smaller run (pnnx renames everything), the graph
   structure of the leftovers (`layerdiff.analyzer.align.structure`: shapes, op types, order, edges).
Every match has a confidence: 1 for names, lower for structure (see `layerdiff.analyzer.align.structure`).
Shapes are checked per matched layer; size-1 dimensions are squeezed when that makes them agree, and
axes in another order (NHWC against NCHW) are mapped from the recorded layouts or the shapes alone
(`layerdiff.analyzer.align.axes`): each matched row keeps both layouts, the map's status and its text.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from layerdiff.errors import InputError, UsageError
from layerdiff.analyzer.align.axes import axis_map, recorded_layouts
from layerdiff.analyzer.formats.limits import load_json
from layerdiff.analyzer.align.naming import NEUTRAL, PairNaming
from layerdiff.analyzer.align.unmatched import Unmatched, _shape


@dataclass
class NameRules:
    """The user's renames (name map + regex rules) and whether the built-in rules are used."""

    name_map: dict[str, str] = field(default_factory=dict)
    regex: list[tuple[re.Pattern, str]] = field(default_factory=list)
    builtin: bool = True

    def canonical_key(self, op: str, output_index: int) -> str:
        """Key after the user's rules; a map entry may name a whole key (`op:1`) or just the op."""
        key = f"{op}:{output_index}"
        if key in self.name_map:
            return self.name_map[key]
        op = self.name_map.get(op, op)
        for pattern, repl in self.regex:
            op = pattern.sub(repl, op)
        return f"{op}:{output_index}"


def parse_rename(spec: str) -> tuple[re.Pattern, str]:
    """`REGEX=REPL` from the command line, e.g. `--rename '^model/=` strips a prefix."""
    pattern, sep, repl = spec.partition("=")
    if not sep or not pattern:
        raise UsageError(f"--rename {spec!r}: expected REGEX=REPLACEMENT, e.g. '^net/='")
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise UsageError(f"--rename {spec!r}: bad regular expression ({err})") from None
    _check_replacement(spec, compiled, repl)
    return compiled, repl


def _check_replacement(spec: str, compiled: re.Pattern, repl: str) -> None:
    """Refuse a replacement naming a group the expression lacks (`\\9`, `\\g<x>`) now: `re` only finds
    out when a layer name first matches, deep inside alignment."""
    names = {number: name for name, number in compiled.groupindex.items()}
    groups = "".join(f"(?P<{names[i]}>)" if i in names else "()" for i in range(1, compiled.groups + 1))
    try:
        re.compile(groups).match("").expand(repl)
    except (re.error, IndexError) as err:
        raise UsageError(f"--rename {spec!r}: bad replacement ({err})") from None


def load_name_map(path: Path | str) -> dict[str, str]:
    """Read an old -> new map from JSON (object or list of pairs) or CSV (two columns, header optional)."""
    from layerdiff.analyzer.formats.limits import MAX_JSON_BYTES, check_plain_file, human_bytes

    path = Path(path)
    size = check_plain_file(path, InputError, follow=True).st_size  # /dev/zero or a FIFO would be read forever
    if size > MAX_JSON_BYTES:
        raise InputError(f"{path}: the name map holds {human_bytes(size)}, over the {human_bytes(MAX_JSON_BYTES)} "
                         "a name map may hold (set LAYERDIFF_MAX_JSON_BYTES to allow it)")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(f"{path}: cannot read the name map ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: the name map is not UTF-8 text (byte {err.start}); save it as UTF-8 CSV or JSON") from None
    if path.suffix.lower() == ".json" or text.lstrip().startswith(("{", "[")):
        return _map_from_json(path, text)
    return _map_from_csv(path, text)


def _map_from_json(path: Path, text: str) -> dict[str, str]:
    value = load_json(text, f"{path}: name map", InputError)
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        return {str(a): str(b) for a, b in value}
    raise InputError(f"{path}: name map must be a JSON object {{old: new}} or a list of [old, new] pairs")


def _map_from_csv(path: Path, text: str) -> dict[str, str]:
    rows = [r for r in csv.reader(text.splitlines()) if r and not r[0].startswith("#")]
    if rows and [c.strip().lower() for c in rows[0][:2]] in (["old", "new"], ["from", "to"]):
        rows = rows[1:]
    bad = [i + 1 for i, r in enumerate(rows) if len(r) != 2]
    if bad:
        raise InputError(f"{path}: name map CSV row {bad[0]} does not have exactly two columns old,new")
    return {r[0]: r[1] for r in rows}


@dataclass
class PairAlignment:
    """How the layers of `other` line up with those of `base` (the reference)."""

    matched: pd.DataFrame  # one row per matched layer, in the base's execution order
    only_base: pd.DataFrame  # base layers with no partner: key, op, op_type, why
    only_other: pd.DataFrame


MATCH_COLUMNS = ["key", "other_key", "base_order", "other_order", "op", "op_type", "other_op_type",
                 "base_shape", "other_shape", "shape_status", "permutation", "base_layout", "other_layout", "match", "confidence"]
# Names matched below this share of the smaller run: the runs were renamed, match by structure too.
STRUCTURE_BELOW = 0.5


def align_layers(base: pd.DataFrame, other: pd.DataFrame, rules: NameRules,
                 error: Callable[[int, int], float] | None = None, fp32: bool = False,
                 progress: Callable[[int, int], None] | None = None, naming: PairNaming = NEUTRAL) -> PairAlignment:
    """Match two `/layers` tables; never raises on odd names, duplicates or disjoint sets.

    `naming`: the name rules of the pair (`align.naming.naming_of` the two runs' attributes: what their
    engines declare; applied unless `rules.builtin` is off, its helper ops always explain unmatched layers).
    `error(base row, other row)` (rel L2 of the two tensors) lets structural matching settle
    ambiguous candidates by value, closely when both runs are `fp32` (see `layerdiff.analyzer.align.structure`);
    `progress(done, total)` hears how far structural matching is."""
    base_keys = _canonical_keys(base, rules)
    other_keys = _canonical_keys(other, rules)
    how = "renamed" if (rules.name_map or rules.regex) else "exact"
    pairs = _match_exact(base_keys, other_keys, how)
    if rules.builtin:
        pairs.update(_match_builtin(base_keys, other_keys, pairs, naming.renamed))
        if naming.key_rules:
            pairs.update(_match_builtin(base_keys, other_keys, pairs, naming.canonical))
    if naming.counted:  # a counted name (`Qcur-0#1`) on another op is another node: left to structure
        pairs = _counted_same_op(pairs, base, other, naming)
    confidence = {i: 1.0 for i in pairs}
    renamed = len(pairs) < STRUCTURE_BELOW * min(len(base), len(other))
    if rules.builtin and (renamed or error is not None):
        from layerdiff.analyzer.align.structure import match_by_structure  # only a fresh alignment matches by structure

        used = {j for j, _ in pairs.values()}
        found = match_by_structure(base, other, [i for i in range(len(base)) if i not in pairs],
                                   [j for j in range(len(other)) if j not in used], error, fp32, progress,
                                   use_edges=renamed, naming=naming)
        if not renamed:  # names did most: structure only adds leftovers whose values are the same tensor
            found = _value_confirmed(found, error, fp32)
        pairs.update({i: (j, "structure") for i, (j, _c) in found.items()})
        confidence.update({i: c for i, (_j, c) in found.items()})
    matched = _matched_frame(base, other, pairs, confidence)
    used_other = {j for j, _ in pairs.values()}
    by_structure = any(how == "structure" for _j, how in pairs.values())
    rows = {i: j for i, (j, _how) in pairs.items()}
    only_base = _unmatched_frame(base, [i for i in range(len(base)) if i not in pairs],
                                 Unmatched(base, other, rows, by_structure, naming))
    only_other = _unmatched_frame(other, [j for j in range(len(other)) if j not in used_other],
                                  Unmatched(other, base, {j: i for i, j in rows.items()}, by_structure, naming))
    return PairAlignment(matched=matched, only_base=only_base, only_other=only_other)


def _value_confirmed(found: dict[int, tuple[int, float]], error: Callable[[int, int], float] | None,
                     fp32: bool) -> dict[int, tuple[int, float]]:
    """The structural matches among name leftovers that values confirm. A converter renames the
    tensors it makes when it decomposes an op (MNN writes HardSigmoid as two BinaryOps, the second
    holding the golden's HardSigmoid values): those pair with their golden tensor. The graph edges
    cannot vouch for a leftover here (most of its neighbours matched by name, outside the structural
    pass), so a match values do not confirm is left unmatched rather than guessed."""
    from layerdiff.analyzer.align.structure import VALUES_AGREE, VALUES_AGREE_FP32

    agree = VALUES_AGREE_FP32 if fp32 else VALUES_AGREE
    return {i: (j, c) for i, (j, c) in found.items() if error is not None and error(i, j) <= agree}


def _canonical_keys(layers: pd.DataFrame, rules: NameRules) -> list[str]:
    """Keys after user rules; a rename that makes two layers collide keeps the raw key for the later one."""
    keys: list[str] = []
    seen: set[str] = set()
    for op, index, raw in zip(layers["op"].tolist(), layers["output_index"].tolist(), layers["key"].tolist()):
        key = rules.canonical_key(str(op), int(index))
        if key in seen:
            key = str(raw)
        seen.add(key)
        keys.append(key)
    return keys


def _counted_same_op(pairs: dict[int, tuple[int, str]], base: pd.DataFrame, other: pd.DataFrame,
                     naming: PairNaming) -> dict[int, tuple[int, str]]:
    """The name matches, less those of a counted name on two op types: the engine counts a name it gives several
    nodes, and the count shifts when a release names one more node, so the same counted name then names another op."""
    base_ops, other_ops = base["op"].tolist(), other["op"].tolist()
    base_types, other_types = base["op_type"].tolist(), other["op_type"].tolist()
    return {i: (j, how) for i, (j, how) in pairs.items()
            if str(base_types[i]) == str(other_types[j])
            or not (naming.is_counted(str(base_ops[i])) or naming.is_counted(str(other_ops[j])))}


def _match_exact(base_keys: list[str], other_keys: list[str], how: str) -> dict[int, tuple[int, str]]:
    where = {}
    for j, key in enumerate(other_keys):
        where.setdefault(key, j)
    return {i: (where[k], how) for i, k in enumerate(base_keys) if k in where}


def _match_builtin(base_keys: list[str], other_keys: list[str], done: dict[int, tuple[int, str]],
                   normal: Callable[[str], str]) -> dict[int, tuple[int, str]]:
    """Match leftovers whose normalized keys agree (unique matches only, so a rule never guesses)."""
    used = {j for j, _ in done.values()}
    left_base = _unique_by(normal, [(i, k) for i, k in enumerate(base_keys) if i not in done])
    left_other = _unique_by(normal, [(j, k) for j, k in enumerate(other_keys) if j not in used])
    return {i: (left_other[n], "builtin-rule") for n, i in left_base.items() if n in left_other}


def _unique_by(normal, indexed: list[tuple[int, str]]) -> dict[str, int]:
    groups: dict[str, list[int]] = {}
    for i, key in indexed:
        groups.setdefault(normal(key), []).append(i)
    return {n: idx[0] for n, idx in groups.items() if len(idx) == 1}


def _matched_frame(base: pd.DataFrame, other: pd.DataFrame, pairs: dict[int, tuple[int, str]],
                   confidence: dict[int, float]) -> pd.DataFrame:
    """One row per matched pair, built column-wise (row access through pandas cost ~1 ms a layer)."""
    base_rows = sorted(pairs)
    other_rows = [pairs[i][0] for i in base_rows]
    b = {c: base[c].to_numpy()[base_rows] for c in ("key", "order", "op", "op_type", "shape")}
    o = {c: other[c].to_numpy()[other_rows] for c in ("key", "order", "op_type", "shape")}
    base_shapes = [_shape(cell) for cell in b["shape"]]
    other_shapes = [_shape(cell) for cell in o["shape"]]
    base_all, other_all = recorded_layouts(base), recorded_layouts(other)
    base_layouts, other_layouts = [base_all[i] for i in base_rows], [other_all[j] for j in other_rows]
    maps = [axis_map(x, xs, y, ys) for x, xs, y, ys in zip(base_layouts, base_shapes, other_layouts, other_shapes)]
    return pd.DataFrame({
        "key": b["key"], "other_key": o["key"], "base_order": b["order"].astype(np.int64),
        "other_order": o["order"].astype(np.int64), "op": b["op"], "op_type": b["op_type"],
        "other_op_type": o["op_type"], "base_shape": base_shapes, "other_shape": other_shapes,
        "shape_status": [m.status for m in maps], "permutation": [m.text for m in maps],
        "base_layout": base_layouts, "other_layout": other_layouts,
        "match": [pairs[i][1] for i in base_rows],
        "confidence": [round(confidence.get(i, 1.0), 3) for i in base_rows],
    }, columns=MATCH_COLUMNS)


def _unmatched_frame(layers: pd.DataFrame, index: list[int], why: Unmatched) -> pd.DataFrame:
    part = layers.iloc[index]
    return pd.DataFrame({
        "key": list(part["key"]), "op": list(part["op"]), "op_type": list(part["op_type"]),
        "order": [int(v) for v in part["order"]],
        "why": [why.reason(i) for i in index],
    })


def shape_status(a: tuple[int, ...], b: tuple[int, ...]) -> str:
    """`same`, `squeezed` (equal once size-1 dims are dropped) or `mismatch`."""
    if a == b:
        return "same"
    if tuple(d for d in a if d != 1) == tuple(d for d in b if d != 1):
        return "squeezed"
    return "mismatch"
