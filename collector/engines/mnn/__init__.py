"""collector/engines/mnn: MNN `.mnn` models; pymnn on the host and under arm64 emulation, the C++ harness on phones."""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.base import Engine, InputSpecs


def _input_specs(path: Path) -> InputSpecs:
    ENGINE.require_installed()  # reading the model's inputs takes the engine's own library
    from layerdiff.collector.engines.mnn.modelfile import input_specs

    return input_specs(path)


ENGINE = Engine("mnn", (".mnn",), _input_specs, on_phones=True, arm64_wheels=("MNN==3.6.1",), library="MNN", extra="mnn", distribution="MNN",
                bisect_refusal="mnn: the MNN pip wheel and the phone harness run a whole model at one precision and backend, so no layer can be moved alone; collect bisect cannot run (collect fix gives a what-if instead)")
