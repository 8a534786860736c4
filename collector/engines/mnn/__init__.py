"""collector/engines/mnn: MNN `.mnn` models; pymnn on the host and under arm64 emulation, the C++ harness on phones."""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.base import Engine, InputSpecs


def _input_specs(path: Path) -> InputSpecs:
    ENGINE.require_installed()  # reading the model's inputs takes the engine's own library
    from layerdiff.collector.engines.mnn.modelfile import input_specs

    return input_specs(path)


# Each op's outputs are copied in MNN's after-callback, right after the op ran (on a GPU backend, downloaded from
# the device memory the op wrote), before a later op can reuse that memory.
WRITES = (("*", "each op's outputs are copied to host tensors inside MNN's after-callback, right after that op ran "
                "and before a later op can reuse its memory (on a GPU backend, downloaded from the memory the op wrote)"),)
ENGINE = Engine("mnn", (".mnn",), _input_specs, on_phones=True, writes=WRITES, arm64_wheels=("MNN==3.6.1",), library="MNN", extra="mnn",
                bisect_refusal="mnn: the MNN pip wheel and the phone harness run a whole model at one precision and backend, so no layer can be moved alone; collect bisect cannot run (collect fix gives a what-if instead)")
