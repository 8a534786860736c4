"""collector/engines/paddle: Paddle inference models (`.pdmodel` + `.pdiparams`) on paddlepaddle's CPU executor."""
from __future__ import annotations

from pathlib import Path

from layerdiff.analyzer.formats.enginefacts import EngineFacts
from layerdiff.collector.engines.base import Engine, InputSpecs


def _model_files(path: Path) -> list[Path]:
    from layerdiff.collector.engines.paddle.modelfile import model_files

    return model_files(path)


def _input_specs(path: Path) -> InputSpecs:
    from layerdiff.collector.engines.paddle.modelfile import input_specs

    return input_specs(path)


# Every op output is a fetch target of the run that reads it: Paddle's executor writes each fetched variable.
WRITES = (("*", "every op output is a fetch target of the run that reads it (the program unedited), and Paddle's "
                "executor writes each variable it fetches in that run"),)
# Why `collect repro` writes no Paddle bundle.
REPRO_REFUSAL = ("the paddle engine runs Paddle's CPU executor in one configuration (fp32, no optimisation), so no "
                 "Paddle run fails for a bundle to reproduce, and `collect repro` does not cut Paddle programs; against "
                 "Paddle-Lite, Paddle is the reference (`collect isolate` re-runs Paddle-Lite's layers)")
ENGINE = Engine("paddle", (".pdmodel", ".pdiparams"), _input_specs, writes=WRITES, repro_refusal=REPRO_REFUSAL, model_files=_model_files, distribution="paddlepaddle", library="paddle", extra="paddle",
                model_help=".pdmodel with its .pdiparams (local Paddle golden)",
                facts=EngineFacts(golden=True))
