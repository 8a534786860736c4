"""What a Paddle inference model is before any run: `.pdmodel` (+ `.pdiparams`), and its feed variables."""
from __future__ import annotations

from pathlib import Path

from layerdiff.errors import InputError
from layerdiff.collector.engines.base import InputSpecs


def model_files(path: Path) -> list[Path]:
    """`m.pdmodel` and its `m.pdiparams` (a program without parameters travels alone)."""
    program = path.with_suffix(".pdmodel") if path.suffix.lower() == ".pdiparams" else path
    if not program.is_file():
        raise InputError(f"{program}: a Paddle model needs its program (.pdmodel) beside {path.name}")
    params = program.with_suffix(".pdiparams")
    return [program, params] if params.is_file() else [program]


def input_specs(path: Path) -> InputSpecs:
    """The program's feed variables, read without Paddle; -1 dimensions are dynamic."""
    from layerdiff.collector.engines.paddle.program import read_program

    program = read_program(path)
    return {name: (program.vars[name].dims or None, program.vars[name].dtype or "float32") for name in program.feeds()}
