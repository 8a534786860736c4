"""What a `.mnn` file declares before any run: its inputs (shape, dtype), read through pymnn.

Also the two pymnn helpers the MNN host engine shares with it: keeping pymnn's CPU banner off stdout,
and the numpy dtype of an MNN tensor.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from layerdiff.errors import ModelFormatError
from layerdiff.collector.engines.base import InputSpecs


@contextlib.contextmanager
def quiet_stdout() -> Iterator[list[str]]:
    """pymnn prints a CPU-feature banner on stdout; keep stdout clean for progress lines and --json.

    What was printed is kept (`with quiet_stdout() as printed:`, then `printed[0]`): the banner is
    MNN's own word on the CPU's features (fp16:1), which the MNN engine records.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    printed: list[str] = []
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 1)
            try:
                yield printed
            finally:
                _flush_c_stdout()
                os.dup2(saved, 1)
                sink.seek(0)
                printed.append(sink.read(1 << 16).decode(errors="replace"))
    finally:
        os.close(saved)


def _flush_c_stdout() -> None:
    """MNN prints with C stdio, which buffers when stdout is not a terminal: flush it into the sink."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def mnn_dtype(MNN, tensor) -> str:
    kind = tensor.getDataType()
    for halide, name in ((MNN.Halide_Type_Int, "int32"), (MNN.Halide_Type_Int64, "int64"),
                         (MNN.Halide_Type_Uint8, "uint8"), (MNN.Halide_Type_Double, "float64")):
        if kind == halide:
            return name
    return "float32"


def input_specs(path: Path) -> InputSpecs:
    """pymnn reads the whole file into memory first: one larger than the reader's memory limit is
    refused before it is read (a sparse 20 GB file took a minute of reading to fail)."""
    from layerdiff.analyzer.formats.limits import human_bytes
    from layerdiff.collector.engines.readlimits import read_memory_limit

    size, limit = path.stat().st_size, read_memory_limit()
    if size > limit:
        raise ModelFormatError(f"{path}: {human_bytes(size)}, over the {human_bytes(limit)} memory limit for reading a "
                               ".mnn model's inputs; check the file, or raise LAYERDIFF_MODEL_READ_MEMORY")
    with quiet_stdout():
        import MNN

        try:
            interpreter = MNN.Interpreter(str(path))
            session = interpreter.createSession({"backend": "CPU"})
        except Exception:  # noqa: BLE001 - pymnn raises a bare Exception for unparsable files
            session = None
        if session is None:
            raise ModelFormatError(f"{path}: MNN could not load this model (not a valid .mnn file?)")
        inputs = interpreter.getSessionInputAll(session)
        return {name: (tuple(int(d) for d in tensor.getShape()), mnn_dtype(MNN, tensor))
                for name, tensor in inputs.items()}
