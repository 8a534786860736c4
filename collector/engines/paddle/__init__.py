"""collector/engines/paddle: Paddle inference models (`.pdmodel` + `.pdiparams`) on paddlepaddle's CPU executor."""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.base import Engine, InputSpecs


def _model_files(path: Path) -> list[Path]:
    from layerdiff.collector.engines.paddle.modelfile import model_files

    return model_files(path)


def _input_specs(path: Path) -> InputSpecs:
    from layerdiff.collector.engines.paddle.modelfile import input_specs

    return input_specs(path)


ENGINE = Engine("paddle", (".pdmodel", ".pdiparams"), _input_specs, model_files=_model_files, library="paddle", extra="paddle",
                distribution="paddlepaddle")
