"""Polygraphy `--save-outputs` RunResults JSON (polygraphy/json/serde.py, comparator/struct.py).

Layout (Polygraphy 0.4x-0.5x): the file is
  {"lst": [[<runner name>, [<IterationResult>, ...]], ...], "polygraphy_class": "RunResults"}
an IterationResult is
  {"outputs": {<tensor name>: <array>}, "runtime": <seconds>, "runner_name": <str>,
   "polygraphy_class": "IterationResult"}
and an array is either a LazyArray `{"values": <ndarray>, "polygraphy_class": "LazyArray"}` or an
ndarray `{"array": <base64 of np.save bytes>, "polygraphy_class": "ndarray"}`. Older files mark types
with `"__polygraphy_encoded_<Type>": "polygraphy_serialized_json_type"` instead, stored `"array"` as
latin-1 text of the .npy bytes, or wrapped it in an .npz. Torch tensors are `torch.save` pickles:
refused. A directory of `<index>.json` files (one RunResults per iteration) is read as one run.

Output order is the runner's order (for `--onnx-outputs mark all`, the graph's node order).
"""
from __future__ import annotations

import base64
import binascii
import io
import re
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from layerdiff.errors import DumpFormatError
from layerdiff.analyzer.importers.common import ForeignDump, Layer
from layerdiff.analyzer.importers.npyformat import read_npy, read_npy_bytes
from layerdiff.analyzer.formats.limits import MAX_JSON_BYTES, check_plain_file, load_json

POLYGRAPHY_FORMAT = "polygraphy-json"
TYPE_MARKER = "polygraphy_class"
LEGACY_MARKER = "polygraphy_serialized_json_type"
ENGINES = {"onnxrt": "onnxruntime", "trt": "tensorrt", "tf": "tensorflow", "onnx-ref": "onnx-reference",
           "pluginref": "polygraphy-pluginref", "pytorch": "pytorch"}
_ITERATION_FILE = re.compile(r"^\d+\.json$")


def detect_polygraphy(path: Path) -> bool:
    if path.is_dir():
        files = [p for p in path.iterdir() if p.is_file()]
        return bool(files) and all(_ITERATION_FILE.match(p.name) for p in files)
    if not (path.is_file() and path.suffix.lower() == ".json"):
        return False
    with open(path, "rb") as fh:
        head = fh.read(4096)
    return b'"lst"' in head or b"RunResults" in head


def read_polygraphy(path: Path, runner: str | int | None = None, iteration: int = 0) -> ForeignDump:
    files = sorted(p for p in path.iterdir() if p.is_file() or p.is_symlink()) if path.is_dir() else [path]
    if path.is_dir():
        for file in files:
            check_plain_file(file)  # a symbolic link would put the file it points to in the output
    runs = _merged_runs([_load_json(p) for p in files], path)
    name, iterations = _pick_runner(runs, runner, path)
    if not 0 <= iteration < len(iterations):
        raise DumpFormatError(f"{path}: runner {name!r} has {len(iterations)} iteration(s); iteration {iteration} does not exist")
    result = iterations[iteration]
    outputs = _plain(result.get("outputs")) if isinstance(result, dict) else None
    if not isinstance(outputs, dict):
        raise DumpFormatError(f"{path}: iteration {iteration} of runner {name!r} has no outputs object")
    dump = ForeignDump(source=path, format=POLYGRAPHY_FORMAT, attrs=_attrs(name, result))
    dump.provenance.update({"polygraphy_runners": [r for r, _ in runs], "polygraphy_runner": name,
                            "polygraphy_iteration": iteration, "polygraphy_iterations": len(iterations)})
    for tensor_name, encoded in outputs.items():
        where = f"{path}: runner {name!r} output {tensor_name!r}"
        dump.layers.append(Layer(op=str(tensor_name), output_index=0, name=str(tensor_name),
                                 load=_loader(encoded, where), where=where))
    return dump


def _load_json(path: Path) -> Any:
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise DumpFormatError(f"{path}: {size} bytes of JSON, over the {MAX_JSON_BYTES} byte limit (LAYERDIFF_MAX_JSON_BYTES)")
    with open(path, "rb") as fh:
        return load_json(fh.read(), str(path))  # bad JSON, bad UTF-8, huge integers, deep nesting: one line


def _merged_runs(documents: list[Any], path: Path) -> list[tuple[str, list]]:
    """[(runner name, [iteration, ...])], iterations of the same runner concatenated across files."""
    merged: dict[str, list] = {}
    for doc in documents:
        lst = doc.get("lst") if isinstance(doc, dict) else None
        if not isinstance(lst, list):
            raise DumpFormatError(f"{path}: not a Polygraphy RunResults file (no \"lst\" list)")
        for entry in lst:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], list)):
                raise DumpFormatError(f"{path}: malformed RunResults entry (expected [runner name, [iterations]])")
            merged.setdefault(entry[0], []).extend(entry[1])
    if not merged:
        raise DumpFormatError(f"{path}: the RunResults holds no runner")
    return list(merged.items())


def _pick_runner(runs: list[tuple[str, list]], runner: str | int | None, path: Path) -> tuple[str, list]:
    if runner is None:
        return runs[0]
    if isinstance(runner, int) or str(runner).isdigit():
        index = int(runner)
        if 0 <= index < len(runs):
            return runs[index]
    else:
        matches = [r for r in runs if r[0] == runner] or [r for r in runs if str(runner) in r[0]]
        if len(matches) == 1:
            return matches[0]
    names = ", ".join(r[0] for r in runs)
    raise DumpFormatError(f"{path}: no single runner matches {runner!r}; runners are: {names}")


def _attrs(runner_name: str, result: dict) -> dict[str, Any]:
    prefix = runner_name.split("-runner")[0]
    attrs: dict[str, Any] = {"engine": ENGINES.get(prefix, prefix), "harness": f"polygraphy ({runner_name})"}
    runtime = result.get("runtime")
    if isinstance(runtime, (int, float)) and not isinstance(runtime, bool) and abs(runtime) < 1e12:
        attrs["infer_ms"] = float(runtime) * 1000.0
    return attrs


def _plain(value: Any) -> Any:
    """Strip Polygraphy's type markers from a dict (new and legacy)."""
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if k != TYPE_MARKER and v != LEGACY_MARKER}


def _loader(encoded: Any, where: str):
    return lambda: decode_array(encoded, where)


def decode_array(encoded: Any, where: str, depth: int = 0) -> np.ndarray:
    """An array from a serialized LazyArray / ndarray object; never unpickles."""
    if not isinstance(encoded, dict) or depth > 4:
        raise DumpFormatError(f"{where}: not a serialized array")
    kind = encoded.get(TYPE_MARKER) or next((k for k, v in encoded.items() if v == LEGACY_MARKER), "")
    if "tensor" in encoded or "Tensor" in str(kind):
        raise DumpFormatError(f"{where}: torch tensors are pickles and are never loaded; save numpy outputs")
    if "values" in encoded:
        return decode_array(encoded["values"], where, depth + 1)
    payload = encoded.get("array")
    if not isinstance(payload, str):
        raise DumpFormatError(f"{where}: array payload missing")
    data = _payload_bytes(payload, where)
    if data[:2] == b"PK":
        return _first_npz_member(data, where)
    return read_npy_bytes(data, where)


def _payload_bytes(payload: str, where: str) -> bytes:
    try:
        return base64.b64decode(payload.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        pass
    try:
        return payload.encode("latin-1")  # Polygraphy < 0.33 stored raw .npy bytes as latin-1 text
    except UnicodeEncodeError:
        raise DumpFormatError(f"{where}: array payload is neither base64 nor latin-1 .npy bytes") from None


def _first_npz_member(data: bytes, where: str) -> np.ndarray:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = [i for i in archive.infolist() if not i.is_dir()]
            if not infos:
                raise DumpFormatError(f"{where}: empty .npz payload")
            with archive.open(infos[0]) as fh:
                return read_npy(fh, infos[0].file_size, where)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError) as err:
        raise DumpFormatError(f"{where}: corrupt .npz payload ({err})") from None
