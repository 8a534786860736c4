"""Which repeated block (transformer layer) a node belongs to, where the graph's names say so.

Why: llama.cpp names every node of layer N `<what>-N` (`attn_norm-0`, `Qcur-3`, `ffn_out-11`; ggml
adds ` (view)`, ` (permuted)`, `#1` for views and reused names) and its KV cache `cache_k_lN`. A
llama.cpp user reads "block 3" as the fourth transformer layer, so findings and the layer table say it.
Only graphs named that way get blocks: at least half of the distinct node names must end in `-N`, so
another engine's names (`conv1`, `/model/layer.3/Conv`, a lone `input-1`) never get a block.
"""
from __future__ import annotations

import math
import re
from typing import Iterable

_DECORATION = re.compile(r"(?:#\d+| \([a-z ]+\))+$")  # ggml's view/reshape suffixes and layerdiff's `#N`
_BLOCK = re.compile(r"^.+-(\d+)$")
_CACHE = re.compile(r"^cache_[kv]_l(\d+)$")  # llama.cpp's per-layer KV cache tensors
MIN_SHARE = 0.5


def node_name(key: str) -> str:
    """The node name under a layer key: `Qcur-3 (view)#1:0` -> `Qcur-3` (output index and decorations off)."""
    name = str(key).rsplit(":", 1)[0] if re.search(r":\d+$", str(key)) else str(key)
    return _DECORATION.sub("", name)


def _block(name: str) -> int | None:
    match = _BLOCK.match(name) or _CACHE.match(name)
    return int(match.group(1)) if match else None


def layer_blocks(keys: Iterable[str]) -> dict[str, int]:
    """key -> block number for a graph named block by block; empty for any other graph."""
    keys = list(dict.fromkeys(str(k) for k in (keys.tolist() if hasattr(keys, "tolist") else keys)))
    names = {k: node_name(k) for k in keys}
    distinct = set(names.values())
    if not distinct or sum(bool(_BLOCK.match(n)) for n in distinct) < MIN_SHARE * len(distinct):
        return {}
    return {k: b for k, n in names.items() if (b := _block(n)) is not None}


def block_clause(block) -> str:
    """' in block 3' for a row with a block, '' otherwise (a NaN cell, a missing column)."""
    if block is None or (isinstance(block, float) and math.isnan(block)):
        return ""
    return f" in block {int(block)}"
