"""Foreign dumps in, layerdiff HDF5 dumps out: format detection and the one entry point `import_any`.

Formats (one module each): our raw dump directory (rawdir), a layerdiff HDF5 from elsewhere
(hdf5dump), MNN's text dumps (mnn_text), Paddle-Lite's precision profiler directory (paddle_profiler)
and model_debug_tool tensor file (paddle_debug), Polygraphy RunResults JSON (polygraphy_json), `.npy`
directories and `.npz` archives incl. ONNX Runtime name -> array files (npyfiles), and a `.zip` of
any of these (archive). Everything read here is untrusted; see common.py for the rules.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ImportResult", "detect_format", "find_dumps", "import_any", "import_many", "import_one", "import_many_results",
           "parse_set_options", "SUPPORTED_FORMATS"]


def __getattr__(name: str) -> Any:
    """The entry points load on first use: every analysis opens the conversion cache
    (`layerdiff.analyzer.importers.convcache`), which must not import all nine format readers
    (~10 ms at each start) when every input is already a layerdiff dump."""
    if name in __all__:
        return getattr(importlib.import_module("layerdiff.analyzer.importers.dispatch"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
