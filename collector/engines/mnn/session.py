"""MNN's runtime as the host engine sees it: the module (with its CPU report), the session, and
what MNN says it really ran on (backend and precision), for the dump header.

Split from the engine so that isolation (collector/engines/mnn/isolate.py) creates sessions the same way.
"""
from __future__ import annotations

import re

from layerdiff.analyzer.importers.mnncodes import MNN_FORWARD_CPU_EXTENSION, MNN_FORWARD_TYPES
from layerdiff.collector.engines.harness_cli import EXIT_MODEL, HarnessArgs, HarnessExit
from layerdiff.collector.engines.mnn.modelfile import quiet_stdout

BACKEND_NAMES = {"cpu": "CPU", "opencl": "OPENCL", "vulkan": "VULKAN"}
FORWARD_TYPES = MNN_FORWARD_TYPES  # MNNForwardType code -> backend name (analyzer/importers/mnncodes.py)
SESSION_INFO_BACKENDS = 2

FORWARD_CPU_EXTENSION = MNN_FORWARD_CPU_EXTENSION  # Arm82 (fp16 at low on fp16 cores) or x86 AVX: see effective_precision
FEATURES: dict[str, int] = {}


def mnn_module():
    with quiet_stdout() as printed:
        import MNN
    if printed and printed[0]:
        FEATURES.update(cpu_features(printed[0]))
    return MNN


def cpu_features(banner: str) -> dict[str, int]:
    """MNN's own CPU report, "The device supports: i8sdot:1, fp16:1, ..." → {"i8sdot": 1, "fp16": 1, ...}."""
    match = re.search(r"device supports:(.*)", banner)
    if match is None:
        return {}
    return {name: int(value) for name, value in re.findall(r"(\w+):\s*(\d+)", match.group(1))}


def engine_version() -> str:
    return str(mnn_module().version())


def effective_precision(backend_code: int, precision: str, features: dict[str, int] | None = None) -> str:
    """What MNN computed in, from the backend MNN says the session runs on and MNN's own rule for it.

    Forward type 13 (MNN_FORWARD_CPU_EXTENSION) is not one backend: MNN 3.6 (CPURuntime::onCreate)
    gives it to its Arm82 backend, which computes in fp16, only when the core reports fp16
    arithmetic ("fp16:1" in MNN's CPU report) and the precision is low; on x86 the same code is its
    AVX2/AVX512 backend, which computes in fp32 at every precision (measured: high and low dumps are
    bit-identical there). Forward type 0 is its plain fp32 CPU backend (an ARM core without fp16,
    such as the cortex-a53). MNN reports no precision for GPU backends (the PyPI wheel has none).
    """
    features = FEATURES if features is None else features
    if backend_code == FORWARD_CPU_EXTENSION:
        return "fp16" if precision == "low" and features.get("fp16") == 1 else "fp32"
    if backend_code == 0:
        return "fp32"
    return "unknown (MNN reports no precision for this backend)"


def session_backend(interpreter, session) -> tuple[int, str]:
    """(MNN forward type code, our backend name) of a created session."""
    code = int(interpreter.getSessionInfo(session, SESSION_INFO_BACKENDS))
    return code, FORWARD_TYPES.get(code, f"type{code}")


def engine_options(code: int, args: HarnessArgs) -> dict:
    """What the dump header records about how MNN ran: its backend code and its CPU feature report."""
    return {"forward_type_code": code, "session_config": BACKEND_NAMES[args.backend],
            "precision_config": args.precision, "cpu_features": dict(FEATURES)}


def create_session(MNN, args: HarnessArgs):
    model = args.models[0]
    try:
        with quiet_stdout():
            interpreter = MNN.Interpreter(str(model))
    except Exception:  # noqa: BLE001 - pymnn raises a bare Exception for unparsable files
        raise HarnessExit(EXIT_MODEL, f"{model}: MNN could not load this model (not a valid .mnn file?)") from None
    config = {"backend": BACKEND_NAMES[args.backend], "precision": args.precision, "numThread": args.threads}
    with quiet_stdout():
        session = interpreter.createSession(config)
    if session is None:
        raise HarnessExit(EXIT_MODEL, f"{model}: MNN could not create a session for this model")
    return interpreter, session
