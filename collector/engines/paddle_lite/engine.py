"""The paddle-lite engine on the `local` device: the C++ harness's Paddle-Lite engine, built for the host.

Paddle-Lite's Python wheel (PyPI `paddlelite`, cp310 at newest) exposes no GetTensor, so it cannot
dump every variable; its C++ library can. So this module speaks the harness command line by handing
it to the host build of device_scripts/harness with the Paddle-Lite engine, made once against
PADDLE_LITE_ROOT (cached like every harness build). Without PADDLE_LITE_ROOT it says, in one line,
why Paddle-Lite is unavailable here and what to install.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from layerdiff.collector.engines.harness_cli import (EXIT_ARGS, EXIT_BACKEND, HARNESS_VERSION, HarnessExit, harness_main,
                                                     native_argv)

UNAVAILABLE = ("Paddle-Lite unavailable here: PADDLE_LITE_ROOT is not set, and PyPI's paddlelite (no Python 3.11 wheel; "
               "its library ships without the C++ headers) cannot dump every variable; set PADDLE_LITE_ROOT to a Paddle-Lite "
               "inference library for the host (cxx/include/paddle_api.h, cxx/lib/libpaddle_light_api_shared.so; "
               "README: Paddle-Lite) and install cmake and g++")


def harness_binary():
    """The host harness with the Paddle-Lite engine (built on first use), or HarnessExit saying what is missing."""
    if not os.environ.get("PADDLE_LITE_ROOT"):
        raise HarnessExit(EXIT_BACKEND, UNAVAILABLE)
    from layerdiff.collector.engines.phoneharness import harness_for
    from layerdiff.vocabulary import host_abi
    from layerdiff.errors import HarnessError

    try:
        return harness_for(host_abi(), "paddle-lite")
    except HarnessError as err:
        raise HarnessExit(EXIT_BACKEND, f"Paddle-Lite unavailable here: {err}") from None


def engine_version() -> str:
    line = subprocess.run([str(harness_binary()), "--version"], capture_output=True, text=True, check=False).stdout
    return line.split("paddle-lite ", 1)[-1].split(",", 1)[0].strip() if "paddle-lite" in line else "unknown"


def probe() -> dict:
    try:
        out = subprocess.run([str(harness_binary()), "--probe"], capture_output=True, text=True, check=False).stdout
        return json.loads(out)
    except HarnessExit as err:
        reason = str(err)
        backends = {b: {"ok": False, "reason": reason} for b in ("cpu", "opencl", "vulkan")}
        return {"harness": "layerdiff-local-paddle-lite", "version": HARNESS_VERSION,
                "engines": {"paddle-lite": {"version": "", "backends": backends}}}


def run(args) -> None:
    """The run, through the C++ harness: the same command line, its raw dump, its exit code and message."""
    if args.inject is not None:
        raise HarnessExit(EXIT_ARGS, "--inject is not supported by the paddle-lite engine")
    argv = native_argv("paddle-lite", args)
    sys.stdout.flush()  # the harness's progress lines go straight to the collector
    proc = subprocess.run([str(harness_binary()), *argv], stdout=None, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode:
        ours = [line for line in proc.stderr.splitlines() if line.startswith("layerdiff-harness: ")]
        last = proc.stderr.strip().splitlines()[-1:] or [f"the harness ended with exit code {proc.returncode}"]
        raise HarnessExit(proc.returncode, (ours or last)[-1].removeprefix("layerdiff-harness: "))


def main() -> int:
    return harness_main("paddle-lite", run, probe, engine_version)


if __name__ == "__main__":
    sys.exit(main())
