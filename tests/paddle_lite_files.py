"""Paddle-Lite's own dump files, written byte for byte the way its C++ writes them, from a real run's
tensors: the precision profiler (lite/core/profile/precision_profiler.h) and model_debug_tool
(lite/tools/debug/debug_utils.h), v2.13. The tests import these and align them with the Paddle golden.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

PLACE = {"float32": "float", "int32": "int32_t", "int64": "int64_t", "uint8": "bool", "float16": "float16"}


def _dims(shape) -> str:
    return "{" + ",".join(str(int(d)) for d in shape) + "}"


def _cpp_double(value: float) -> str:
    return "%f" % value  # std::to_string(double)


def write_precision_profile(directory: Path, tensors: list[tuple[str, str, np.ndarray]], target: str = "arm",
                            precision: str = "float", write_files: bool = True, runs: int = 1) -> Path:
    """`PaddleLite_<date>/` with precision_summary.log and one `<var>_<k>.txt` per output (k: times written)."""
    directory.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with open(directory / "precision_summary.log", "a") as log:
        for _ in range(runs):
            log.write("\n\n========================================= Detailed Precision Profiler Summary "
                      "=========================================\n")
            log.write(f"{'operator:(kernel_info)':<45} {'output_tensor_name:(tensor_info)':<70} {'dims':<15} "
                      f"{'mean':<15} {'std_deviation':<15} {'ave_grow_rate*':<15}\n\n")
            for name, op_type, array in tensors:
                counts[name] = counts.get(name, 0) + 1
                written = f"{name}_{counts[name]}"
                flat = array.astype(np.float64).ravel()
                mean, std = flat.mean(), flat.std()
                grow = float(np.sum(np.diff(flat) / (flat[:-1] + 1e-5)) / flat.size) if flat.size > 1 else 0.0
                place = f"{target}/{precision if array.dtype == np.float32 else PLACE[array.dtype.name]}/NCHW"
                log.write(f"{op_type + ':' + place:<45} {written + ':' + place:<70} {_dims(array.shape):<15} "
                          f"{_cpp_double(mean):<15} {_cpp_double(std):<15} {_cpp_double(grow):<15}\n")
                if write_files:
                    lines = "".join("[%d] %f \n" % (i, v) for i, v in enumerate(flat))
                    (directory / (written.replace("/", "_") + ".txt")).write_text(lines)
    return directory


def write_debug_tool(directory: Path, feed: tuple[str, np.ndarray], tensors: list[tuple[str, str, list[str], np.ndarray]],
                     weights: dict[str, np.ndarray] | None = None, topology: bool = True, length: int = -1) -> Path:
    """`tensor_cpp.txt` (each instruction's inputs then outputs, every name once) and `topo_file.txt`."""
    directory.mkdir(parents=True, exist_ok=True)
    known = {feed[0]: feed[1], **(weights or {}), **{name: array for name, _, _, array in tensors}}
    written: set[str] = set()
    with open(directory / "tensor_cpp.txt", "w") as out, open(directory / "topo_file.txt", "w") as topo:
        topo.write(f"feed\t(X:feed)\t(Out:{feed[0]})\n")
        for name, op_type, inputs, _ in tensors:
            topo.write(f"{op_type}\t(X:{'#'.join(inputs)})\t(Out:{name})\n")
            for var in [*inputs, name]:
                if var in written or var not in known:
                    continue
                written.add(var)
                flat = known[var].astype(np.float64).ravel()
                flat = flat if length < 0 else flat[:length]
                out.write(f"{var}\t{_dims(known[var].shape)}\t" + " ".join("%g" % v for v in flat) + "\n")
    if not topology:
        (directory / "topo_file.txt").unlink()
    return directory / "tensor_cpp.txt"
