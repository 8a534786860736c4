"""collector/engines/ncnn: ncnn `.param` + `.bin` models; the pip wheel on the host and under arm64 emulation, the C++ harness on phones."""
from __future__ import annotations

from pathlib import Path

from layerdiff.collector.engines.base import Engine, InputSpecs


def _model_files(path: Path) -> list[Path]:
    from layerdiff.collector.engines.ncnn.modelfile import model_files

    return model_files(path)


def _input_specs(path: Path) -> InputSpecs:
    from layerdiff.collector.engines.ncnn.modelfile import input_specs

    return input_specs(path)


ENGINE = Engine("ncnn", (".param", ".bin"), _input_specs, model_files=_model_files, on_phones=True,
                arm64_wheels=("ncnn==1.0.20250503",), library="ncnn", extra="ncnn", distribution="ncnn", bisect_mechanism="feature-mask")
