"""How numbers are said: one rounding rule for every share in a verdict, a finding or a table.

A share is printed with three significant digits, more when needed to keep it off 100% and 0% unless
it is exactly 1 or 0, so a disagreement is never rounded into agreement ("top-1 agreement 100%: the output's decision
changes" was 0.9986). And a layer is named as a user finds it: the node name Netron shows, then the
tensor it wrote.
"""
from __future__ import annotations

import math

from layerdiff.errors import LayerdiffError


def percent(share: float) -> str:
    """'99.9%', '1.39%', '100%': three significant digits, more where fewer would round a share that is
    not exactly 1 or 0 onto 100% or 0%."""
    if share is None or (isinstance(share, float) and math.isnan(share)):
        return "n/a"
    value = float(share) * 100
    if value in (0.0, 100.0) or not math.isfinite(value):
        return f"{value:g}%"
    for digits in range(3, 12):
        text = f"{value:.{digits}g}"
        if float(text) not in (0.0, 100.0):
            return text + "%"
    return f"{value!r}%"


def layer_name(key: str, op: str | None = None) -> str:
    """'warp/grid_sample (tensor gs:0)': the node a user sees in Netron and the tensor name; just the
    tensor when the node name says nothing more (it is the tensor's own prefix, or unknown)."""
    key, op = str(key), str(op or "")
    if not op or op == "nan" or op == key or key.startswith(op + ":") or key.split(":")[0] == op:
        return key
    return f"{op} (tensor {key})"


def with_node_names(rows, base):
    """The rows with `op` the node name the reference's engine recorded (ONNX Runtime goldens key layers
    by tensor name; their node names are in the raw header's `node_names`), so sentences name both."""
    try:
        names = base.dump.provenance.get("raw_header", {}).get("node_names") or {}
    except (AttributeError, TypeError, ValueError, LayerdiffError):
        names = {}
    if not names or "op" not in rows:
        return rows
    return rows.assign(op=rows["key"].map(names).fillna(rows["op"]))
