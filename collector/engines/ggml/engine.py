"""The `local` device's ggml engine: the harness command line handed to the layerdiff-ggml binary.

The binary (device_scripts/ggml) runs the model and writes the raw dump itself; this module checks
the arguments like every host engine (harness_cli), finds the binary (building the CPU one into the
cache the first time, progress on stderr; `collect` builds it before a sweep starts) and runs it with
the same arguments, its progress lines and its one error line passed through, its exit code kept.
A Vulkan or OpenCL binary is never built inside a run (long, needs glslc / the NDK): without a cached
one the run exits 4 saying what to build.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from layerdiff.collector.engines.ggml import ENGINE
from layerdiff.collector.engines.harness_cli import EXIT_BACKEND, HarnessArgs, HarnessExit, harness_main, native_argv

GPU_SPECS = {"vulkan": {"vulkan": True}, "opencl": {"opencl": True}}


def release() -> str:
    """The llama-cpp-python release whose build runs: the one `--engine ggml==RELEASE` asked for, else the pinned one."""
    from layerdiff.collector.engines.ggml.build import PINNED_RELEASE, RELEASE_ENV

    return os.environ.get(RELEASE_ENV) or PINNED_RELEASE


def binary_for(backend: str) -> Path:
    """The cached binary that can run `backend` (built here only for the CPU)."""
    from layerdiff.collector.engines.ggml.build import PINNED_RELEASE, GgmlSpec, binary_dir, build_command, ensure_built
    from layerdiff.collector.harness.build import HarnessError
    from layerdiff.collector.harness.buildprogress import PlainReporter

    spec = GgmlSpec(**GPU_SPECS.get(backend, {}), release=release())
    prebuilt = os.environ.get("LAYERDIFF_GGML_BINARY") and spec.release == PINNED_RELEASE
    try:
        if backend in GPU_SPECS and not prebuilt:
            binary = binary_dir(spec) / "layerdiff-ggml"
            if not binary.is_file():
                needs = (" (needs glslc, spirv-headers, libvulkan-dev: apt-get install glslc spirv-headers libvulkan-dev)"
                         if backend == "vulkan" else "")
                also = f" --release {spec.release}" if spec.release != PINNED_RELEASE else ""
                raise HarnessError(f"no ggml build with {backend} here; build it once{needs} with `python -m "
                                   f"layerdiff.collector.engines.ggml.build --{backend}{also}` "
                                   f"({' '.join(build_command(spec, binary.parent))}) or use --backend cpu")
        return ensure_built(spec, PlainReporter(sys.stderr))
    except HarnessError as err:
        raise HarnessExit(EXIT_BACKEND, str(err)) from None


def run(args: HarnessArgs) -> None:
    """Run the binary on the checked arguments; it writes the dump, its stdout/stderr are this process's."""
    binary = binary_for(args.backend)
    sys.stdout.flush()
    code = subprocess.run([str(binary), *native_argv("ggml", args)], check=False).returncode
    if code < 0:  # killed by a signal (--abort-after): die the same way, so the collector sees the signal
        os.kill(os.getpid(), -code)
    if code != 0:  # the binary already said why, in its one `layerdiff-harness:` line
        sys.exit(code)


def _cached_gpu_binary(backend: str) -> Path | None:
    from layerdiff.collector.engines.ggml.build import GgmlSpec, binary_dir

    binary = binary_dir(GgmlSpec(**GPU_SPECS[backend], release=release())) / "layerdiff-ggml"
    return binary if binary.is_file() else None


def probe() -> dict:
    """What runs here: the probe of the Vulkan build when one is cached (it has the CPU too), else the CPU build's."""
    vulkan = None if os.environ.get("LAYERDIFF_GGML_BINARY") else _cached_gpu_binary("vulkan")
    binary = vulkan or binary_for("cpu")
    result = json.loads(subprocess.run([str(binary), "--probe"], capture_output=True, text=True, check=False).stdout)
    backends = result["engines"]["ggml"]["backends"]
    if not vulkan and not backends["vulkan"]["ok"] and not os.environ.get("LAYERDIFF_GGML_BINARY"):
        backends["vulkan"]["reason"] = ("no ggml Vulkan build cached; build it once with `python -m "
                                        "layerdiff.collector.engines.ggml.build --vulkan` (needs glslc, spirv-headers, libvulkan-dev: "
                                        "bash device_scripts/setup_host.sh --ggml-vulkan)")
    return result


def engine_version() -> str:
    out = subprocess.run([str(binary_for("cpu")), "--version"], capture_output=True, text=True, check=False).stdout
    return out.strip()


def main() -> int:
    return harness_main(ENGINE.name, run, probe, engine_version, ENGINE.backends)


if __name__ == "__main__":
    raise SystemExit(main())
