"""MNN's own enums as its headers define them and its tools print them: one table for the MNN engine's
sessions (collector/engines/mnn/session.py), the C++ harness (tests/test_vocabulary.py reads the C++
against it) and the reader of MNN's console logs (mnn_log.py)."""
from __future__ import annotations

# MNN's MNNForwardType (include/MNN/MNNForwardType.h, MNN 3.x) -> our backend name. 13 is
# MNN_FORWARD_CPU_EXTENSION: MNN's own CPU extension backend (Arm82 fp16 on ARMv8.2 cores, AVX2/AVX512
# on x86), chosen internally when the user asks for MNN_FORWARD_CPU; the work still runs on the CPU.
# 8-11 (MNN_FORWARD_USER_*) and 12 (MNN_FORWARD_ALL) name no backend: shown as their number.
MNN_FORWARD_CODES = {"MNN_FORWARD_CPU": 0, "MNN_FORWARD_METAL": 1, "MNN_FORWARD_CUDA": 2, "MNN_FORWARD_OPENCL": 3,
                     "MNN_FORWARD_AUTO": 4, "MNN_FORWARD_NN": 5, "MNN_FORWARD_OPENGL": 6, "MNN_FORWARD_VULKAN": 7,
                     "MNN_FORWARD_CPU_EXTENSION": 13}
MNN_FORWARD_TYPES = {0: "cpu", 1: "metal", 2: "cuda", 3: "opencl", 4: "auto", 5: "nn", 6: "opengl", 7: "vulkan",
                     13: "cpu"}
MNN_FORWARD_CPU_EXTENSION = MNN_FORWARD_CODES["MNN_FORWARD_CPU_EXTENSION"]
# MNN's BackendConfig::PrecisionMode as MNN's tools print it (`precision:<p>`).
MNN_PRECISION_MODES = {0: "normal", 1: "high", 2: "low", 3: "low_bf16"}
