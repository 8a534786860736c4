"""collector/engines/ggml: GGUF models through ggml (llama.cpp's graph builders), run by the C++ program
layerdiff-ggml (device_scripts/ggml) built from llama-cpp-python's sdist; on the host and, as a static
aarch64 binary under qemu, on the `arm64` device, and on ADB phones (the binary for the phone's ABI,
staged and run by the phone path: build.phone_harness)."""
from __future__ import annotations

from pathlib import Path

from layerdiff.analyzer.formats.enginefacts import CpuByDesign, EngineFacts, NameFacts, NameRule
from layerdiff.collector.engines.base import Engine, InputSpecs

# llama.cpp computes its input layer (the token-embedding lookup, node `embd` / `inp_embd`) on the CPU whatever
# backend runs the rest (Vulkan: pinned host memory, `Vulkan_Host`), and with tied embeddings (Gemma) the logits
# `result_output` too, reading `token_embd.weight`; its graph builders name the logits `result_output` in every
# architecture, which says the model is a language model.
FACTS = EngineFacts(
    CpuByDesign(("embd", "inp_embd"), "llama.cpp's input layer",
                "llama.cpp keeps the token-embedding table in CPU memory and computes what reads it there",
                "result_output", "token_embd.weight"),
    (("result_output", "language-model"),),
    # the harness counts a name llama.cpp gives several nodes (`Qcur-0`, `Qcur-0#1`, `Qcur-0#2`); a release that
    # names one more node (the reshape before a ROPE) shifts the count, so `Qcur-0#1` is a ROPE in one release and
    # a RESHAPE in the next
    names=NameFacts(counted=(NameRule(r"#[0-9]+$", "", "layerdiff-ggml counts a name llama.cpp gives several nodes "
                                      "(#1, #2); a release that names one more node shifts the count"),)))


def _input_specs(path: Path) -> InputSpecs:
    from layerdiff.collector.engines.ggml.models import input_specs

    return input_specs(path)


def _bisect():
    from layerdiff.collector.engines.ggml.keep import recipe

    return recipe()


def _repro_program():
    from layerdiff.collector.engines.ggml.reprobundle import recipe

    return recipe()


def _prebuild(devices: list) -> None:
    from layerdiff.collector.engines.ggml.build import prebuild

    prebuild(devices)


def _arm64_harness(device):
    from layerdiff.collector.engines.ggml.build import arm64_harness

    return arm64_harness(device)


def _source_release():
    from layerdiff.collector.engines.ggml.releases import recipe

    return recipe()


def _phone_harness(abi: str, backend: str) -> Path:
    from layerdiff.collector.engines.ggml.build import phone_harness

    return phone_harness(abi, backend)


# The eval callback asks for every node, so each node ends a split of its own and is read right after the
# scheduler computed it; views compute nothing and are read as the bytes they view at that moment.
WRITES = (("*", "the eval callback asks for every node, so the scheduler computes each node as a split of its own "
                "and the node is read right after it is computed; a view (VIEW, RESHAPE, PERMUTE, TRANSPOSE) computes "
                "nothing and is read as the bytes of the tensor it views at that moment, a store into the KV cache "
                "(SET_ROWS, CPY) as the cache region it wrote"),)
ENGINE = Engine("ggml", (".gguf",), _input_specs, backends=("cpu", "opencl", "vulkan"), prebuild=_prebuild,
                arm64_harness=_arm64_harness, prompt_input="prompt", on_phones=True, phone_harness=_phone_harness,
                isolate_rebuilds_graph=True, facts=FACTS,
                model_help=".gguf (ggml: llama.cpp; local and arm64)",
                not_isolatable=("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "SET_ROWS", "CPY"),
                bisect=_bisect,
                repro_program=_repro_program,
                source_release=_source_release,  # `--engine ggml==RELEASE`: llama-cpp-python RELEASE's sdist, built here
                release_help="a llama-cpp-python release on PyPI, whose sdist's llama.cpp is built here "
                             "(local, arm64, phones)",
                # device_scripts/ggml/src/backends.cpp: on the CPU, high keeps the K/V cache in f32 (normal: f16,
                # written by SET_ROWS) and rebuilds a convolution's IM2COL in f32 (normal: f16); nothing else
                # changes, so a graph with neither (an encoder without a cache: BERT) computes the same bytes
                # at both. Vulkan's high also turns fp16 arithmetic off everywhere: not declared.
                precision_reach=(("cpu", "high", "normal", ("IM2COL", "SET_ROWS")),), writes=WRITES)
