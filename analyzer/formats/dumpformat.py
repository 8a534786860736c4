"""The HDF5 dump's definition: layout constants, the /layers table columns, the root attributes.

One source of truth for the format (analyzer/FORMATS.md §2), shared by the writer
(`layerdiff.analyzer.formats.dumpwriter`) and the reader (`layerdiff.analyzer.formats.dumpfile`). Layer names never become HDF5 paths
(they contain `/`): tensors live under `/tensors/<order>` and the `/layers` table maps orders to names.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_NAME = "dump"
FORMAT_VERSION = 1
FORMAT_MINOR = 2  # additions and removals within version 1 that older readers do not need (FORMATS.md §2: 1 = /summaries/held_*, 2 = /tensors/<order> without attributes, held summaries of tensors over 65536 elements only)

# h5py's variable-length UTF-8 string type (what h5py.string_dtype("utf-8") returns), spelled without importing
# h5py: a re-judged analysis reads no HDF5 file and so never loads the library (runs/dumpheaders.py).
STRING_DTYPE = np.dtype("O", metadata={"vlen": str})
LAYER_COLUMNS: list[tuple[str, Any]] = [
    ("order", np.int64),
    ("key", STRING_DTYPE),
    ("op", STRING_DTYPE),
    ("op_type", STRING_DTYPE),
    ("output_index", np.int64),
    ("name", STRING_DTYPE),
    ("inputs", STRING_DTYPE),
    ("shape", STRING_DTYPE),
    ("dtype", STRING_DTYPE),
    ("layout", STRING_DTYPE),
    ("memory", STRING_DTYPE),
    ("time_ms", np.float64),
    ("numel", np.int64),
    ("min", np.float64),
    ("max", np.float64),
    ("mean", np.float64),
    ("std", np.float64),
    ("n_nan", np.int64),
    ("n_posinf", np.int64),
    ("n_neginf", np.int64),
    ("n_zero", np.int64),
    ("n_fp16_overflow", np.int64),
    ("n_fp16_underflow", np.int64),
    ("n_fp16_saturated", np.int64),
]
STRING_COLUMNS = [name for name, kind in LAYER_COLUMNS if kind is STRING_DTYPE]

# Root attributes every dump has, with the value used when a producer does not know it.
ROOT_DEFAULTS: dict[str, Any] = {
    "engine": "",
    "engine_version": "",
    "backend_requested": "",
    "backend_actual": "",
    "precision_requested": "",
    "precision_effective": "",
    "threads": 0,
    "device_serial": "",
    "device_model": "",
    "soc": "",
    "board": "",
    "abi": "",
    "android_release": "",
    "gpu": "",
    "model_name": "",
    "model_sha256": "",
    "input_label": "",
    "input_sha256": "",
    "infer_ms": math.nan,
    "harness": "",
    "repeat": 0,
    "outputs": "",  # JSON list of the tensor names the model declares as outputs, "" when it declares none
    "task": "",  # what the outputs are (collect --task; analyzer/outputs/task.py), "" when undeclared
    "exit_status": 0,
    "complete": True,
}


def tensor_key(op: str, output_index: int) -> str:
    """The alignment key of a tensor: `<op name>:<output index>`."""
    return f"{op}:{output_index}"


def partial_path(path: Path) -> Path:
    """Where a file is written before it is complete; renamed over `path` at the end."""
    return path.with_name(f".{path.name}.partial")
