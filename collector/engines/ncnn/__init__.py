"""collector/engines/ncnn: ncnn `.param` + `.bin` models; the pip wheel on the host and under arm64 emulation, the C++ harness on phones."""
from __future__ import annotations

from pathlib import Path

from layerdiff.analyzer.formats.enginefacts import EngineFacts, HelperOp, NameFacts, NameRule
from layerdiff.collector.engines.base import Engine, InputSpecs


def _model_files(path: Path) -> list[Path]:
    from layerdiff.collector.engines.ncnn.modelfile import model_files

    return model_files(path)


def _input_specs(path: Path) -> InputSpecs:
    from layerdiff.collector.engines.ncnn.modelfile import input_specs

    return input_specs(path)



def _harness_spec(abi: str, backend: str, test_build: bool):
    from layerdiff.collector.engines.ncnn.harness import harness_spec

    return harness_spec(abi, backend, test_build)


def _source_release():
    from layerdiff.collector.engines.ncnn.releases import recipe

    return recipe()


def _feature_mask():
    from layerdiff.collector.engines.ncnn.patch import FEATURE_MASK

    return FEATURE_MASK


def _bisect():
    from layerdiff.collector.engines.ncnn.bisect import RECIPE

    return RECIPE


def _harness_absent(target: str, vulkan: bool, test_build: bool):
    from layerdiff.collector.engines.ncnn.harness import absent

    return absent(target, vulkan, test_build)


# Each blob is extracted right after its layer ran (extract runs it), from that layer's own output; ncnn fuses
# nothing at run time (its fusions are made offline and are layers of the .param).
WRITES = (("*", "each blob is extracted in layer order, so `extract` runs the layer that produces it and hands back "
                "that layer's output (ncnn fuses nothing at run time: fusions are made offline and are layers of the "
                ".param); on Vulkan the blob is downloaded from the GPU buffer that layer wrote"),)

# How ncnn names what it dumps, for the aligner (recorded in every dump's `engine_facts`): a blob read by several
# layers is copied by a Split layer `splitncnn_<k>` (`splitncnn_input<k>` for a model input) into blobs named
# `<blob>_splitncnn_<j>`, which other engines do not have.
FACTS = EngineFacts(names=NameFacts(
    renames=(NameRule(r"_splitncnn_\d+$", "", "ncnn's Split copies are named <blob>_splitncnn_<k>"),),
    helper_ops=(HelperOp(r"^splitncnn_(input)?\d+$", "ncnn Split layer (copies of one blob)", "copy"),)))


def _repro():
    from layerdiff.collector.engines.ncnn.repro import RECIPE

    return RECIPE


ENGINE = Engine("ncnn", (".param", ".bin"), _input_specs, repro=_repro, facts=FACTS, writes=WRITES, model_files=_model_files, on_phones=True, harness_spec=_harness_spec, harness_absent=_harness_absent,
                arm64_wheels=("ncnn==1.0.20250503",), distribution="ncnn", library="ncnn", extra="ncnn", bisect=_bisect, fix_mechanism="feature-mask", feature_mask=_feature_mask,
                model_help="ncnn .param with its .bin", prepared_by_default=True,
                source_release=_source_release,  # `--engine ncnn==RELEASE` on arm64 and phones: its sdist, built here
                release_help="an ncnn release on PyPI: its wheel on the local device, its sdist built into the C++ "
                             "harness for arm64 and phones")
