"""collector/engines/mnn: MNN `.mnn` models; pymnn on the host and under arm64 emulation, the C++ harness on phones."""
from __future__ import annotations

from pathlib import Path

from layerdiff.analyzer.formats.enginefacts import EngineFacts, HelperOp, NameFacts, NameRule
from layerdiff.collector.engines.base import Engine, InputSpecs


def _input_specs(path: Path) -> InputSpecs:
    ENGINE.require_installed()  # reading the model's inputs takes the engine's own library
    from layerdiff.collector.engines.mnn.modelfile import input_specs

    return input_specs(path)



def _harness_spec(abi: str, backend: str, test_build: bool):
    from layerdiff.collector.engines.mnn.harness import harness_spec

    return harness_spec(abi, backend, test_build)


def _harness_absent(target: str, vulkan: bool, test_build: bool):
    from layerdiff.collector.engines.mnn.harness import absent

    return absent(target, vulkan, test_build)


# What MNN offers instead of a per-op precision switch (`collect fix` writes it to fix.json as engine_options).
FIX_ADVICE = (
    "MNN has no per-op precision switch; these numbers are a what-if (the layers' high-precision outputs "
    "injected into the low-precision run). An injected output also erases the error of everything upstream, "
    "so the set is a lower bound: a layer computed at high precision from broken inputs would still be broken.",
    "Per session: ScheduleConfig.backendConfig.precision (Precision_Low / Normal / High / Low_BF16) applies "
    "to a whole session.",
    "Split the model: Interpreter::createMultiPathSession with one ScheduleConfig per path "
    "(ScheduleConfig::Path inputs/outputs), or Express Module::load(inputs, outputs, ...) per sub-graph on "
    "its own RuntimeManager, so the chosen layers run in a sub-graph at precision high.",
    "Keep ops on the CPU: a sub-graph created with backend CPU (ScheduleConfig.type / backupType) runs in fp32 on "
    "CPUs without fp16 arithmetic.",
)


# Each op's outputs are copied in MNN's after-callback, right after the op ran (on a GPU backend, downloaded from
# the device memory the op wrote), before a later op can reuse that memory.
WRITES = (("*", "each op's outputs are copied to host tensors inside MNN's after-callback, right after that op ran "
                "and before a later op can reuse its memory (on a GPU backend, downloaded from the memory the op wrote)"),)

# How MNN names what it dumps, for the aligner (recorded in every dump's `engine_facts`). Checked with MNN 3.6.1's
# converter and session callbacks, and its dump tools (tools/cpp/MNNV2Basic.cpp, ModuleBasic.cpp, ExprDebug.hpp):
# an op is named after its ONNX node's first output tensor (`/blk/conv/Conv_output_0`) and op output k is the
# node's k-th ONNX output; the dump tools write op output i to `<op name, '/' as '_'>_<i>`; the geometry pass
# inserts `Raster` ops named `<consumer>_raster_<k>`, whose set differs between backends.
FACTS = EngineFacts(names=NameFacts(
    renames=(NameRule(r"__matmul_converted$", "",
                      "MNN's converter rewrites MatMul as a convolution named <name>__matmul_converted"),),
    key_rules=(NameRule(r"/", "_", "MNN's dump tools replace '/' in op names by '_' in file names"),
               NameRule(r"^(?P<base>.*_output_)(?P<k>[1-9]\d*):0$", r"\g<base>0:\g<k>",
                        "ONNX tensor '<node>_output_<k>' (k>0) is output k of the MNN op named '<node>_output_0'")),
    helper_ops=(HelperOp(r"_raster_\d+$", "MNN inserts raster (layout) ops that differ between backends", "relayout"),)))


def _repro():
    from layerdiff.collector.engines.mnn.repro import RECIPE

    return RECIPE


# MNN's releases on PyPI are wheels only (no source distribution), so the phone harness's MNN cannot be built at
# another release from the package index; the arm64 core runs the installed aarch64 wheel.
RELEASE_REFUSAL = ("the package index has no MNN source distribution (its releases are wheels only) to build the "
                   "phone harness's MNN from")


ENGINE = Engine("mnn", (".mnn",), _input_specs, repro=_repro, facts=FACTS, on_phones=True, harness_spec=_harness_spec, harness_absent=_harness_absent, writes=WRITES, arm64_wheels=("MNN==3.6.1",), distribution="MNN", library="MNN", extra="mnn", fix_mechanism="what-if", fix_advice=FIX_ADVICE,
                release_refusal=RELEASE_REFUSAL, bisect_refusal="mnn: the MNN pip wheel and the phone harness run a whole model at one precision and backend, so no layer can be moved alone; collect bisect cannot run (collect fix gives a what-if instead)")
