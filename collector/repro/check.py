"""`collect repro --check`: run a bundle's own runner in a child process and read its verdict.

The runner is the thing a maintainer runs, so the check runs exactly it (`run_repro.py --json`), not
layerdiff's code: if the bundle still reproduces here, it reproduces for them. Two answers: does the
failing configuration still fail as recorded, and does the reference configuration compute the
reference's tensor bit for bit (the cut-out layer computes what it computed inside the full graph).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from layerdiff.errors import InputError, UsageError

RUNNER_TIMEOUT_S = 600


@dataclass
class CheckResult:
    """The runner's verdict on one bundle."""

    bundle: Path
    reproduces: bool | None  # None: the failing configuration could not run here (no Vulkan device)
    reference_bit_identical: bool | None
    report: dict = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        run = self.report.get("configs", {}).get("run", {})
        for blob, error in run.get("outputs", {}).items():
            out.append(f"run       {run['backend']}/{run['precision']} {blob}: rel L2 {_num(error['rel_l2'])}, max abs "
                       f"{_num(error['max_abs'])}, NaN {error['nan']}, +Inf {error['pos_inf']}, -Inf {error['neg_inf']}")
        out += self.reasons
        out.append("still reproduces" if self.reproduces else
                   "does not reproduce: fed the reference's inputs, the layer is close to the reference (the failing "
                   "run's error came from upstream, or the engine/driver here differs from the failing device's)"
                   if self.reproduces is False else "not checked: the failing configuration could not run here")
        if self.reference_bit_identical is not None:
            out.append("reference configuration reproduces the reference tensor bit for bit" if self.reference_bit_identical
                       else "reference configuration does NOT reproduce the reference tensor bit for bit")
        return out


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3e}"


def check_bundle(bundle: Path, device: str = "local", python: str | None = None,
                 source_dir: Path | None = None) -> CheckResult:
    """Run `bundle`'s runner with `python` (default: this interpreter) and read its JSON answer; a bundle whose
    runner is a C++ program (collector/repro/program.py) has it built against `source_dir` (default: the engine
    source tree layerdiff's own harness of that engine is built from) in the bundle's `build/`."""
    if device != "local":
        raise UsageError(f"--device {device}: a bundle is checked where collect runs (--device local); on a phone, "
                         "run the bundle's repro.cpp")
    bundle = Path(bundle).resolve()  # the runner runs inside the bundle: a relative path would point past it
    if bundle.suffix == ".zip":
        raise UsageError(f"{bundle}: unpack the .zip and check its folder")
    program = _program_recipe(bundle)
    if program is not None:
        return _verdict(bundle, _run_program(bundle, program, source_dir))
    runner = bundle / "run_repro.py"
    if not runner.is_file() or not (bundle / "repro.json").is_file():
        raise InputError(f"{bundle}: not a repro bundle (no run_repro.py and repro.json); write one with `collect repro`")
    try:
        done = subprocess.run([python or sys.executable, str(runner), "--json"], capture_output=True, text=True,
                              timeout=RUNNER_TIMEOUT_S, cwd=bundle, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"{runner}: did not finish in {RUNNER_TIMEOUT_S} s") from None
    try:
        report = json.loads(done.stdout)
    except ValueError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"{runner}: failed (exit {done.returncode}): {tail}") from None
    return _verdict(bundle, report)


def _verdict(bundle: Path, report: dict) -> CheckResult:
    configs = report.get("configs", {})
    run, ref = configs.get("run", {}), configs.get("reference", {})
    reasons = [f"{name}: not run: {entry.get('reason')}" for name, entry in configs.items() if not entry.get("ran")]
    reproduces = all(e.get("reproduces") for e in run.get("outputs", {}).values()) if run.get("ran") else None
    identical = all(e.get("bit_identical") for e in ref.get("outputs", {}).values()) if ref.get("ran") else None
    return CheckResult(bundle, reproduces, identical, report, reasons)


BUILD_TIMEOUT_S = 1800  # an engine's libraries from source: minutes on two cores


def _program_recipe(bundle: Path):
    """The ProgramRecipe of the engine that wrote `bundle`, when its runner is a program (CMakeLists.txt beside
    model/graph.json); None for a bundle with a Python runner."""
    if not ((bundle / "CMakeLists.txt").is_file() and (bundle / "model" / "graph.json").is_file()):
        return None
    from layerdiff.collector.engines import ENGINES

    try:
        name = json.loads((bundle / "repro.json").read_text()).get("engine")
    except (OSError, ValueError, AttributeError):
        raise InputError(f"{bundle}: not a repro bundle (no readable repro.json); write one with `collect repro`") from None
    engine = ENGINES.get(name) if isinstance(name, str) else None
    if engine is None or engine.repro_program is None:
        raise InputError(f"{bundle}: repro.json names engine {name!r}, which writes no bundle with a program of its own")
    return engine.repro_program()


def _run_program(bundle: Path, recipe, source_dir: Path | None) -> dict:
    """Build the bundle's program with CMake against the engine's source tree (into bundle/build) and run it with
    --json."""
    import shutil

    tree, bundle = recipe.source_tree(source_dir), bundle.resolve()  # the program runs from inside the bundle
    if shutil.which("cmake") is None:
        raise UsageError(f"{bundle}: checking it builds its program with CMake: install cmake and a C++ compiler")
    build = bundle / "build"
    steps = [["cmake", "-S", str(bundle), "-B", str(build), *recipe.configure_args(tree), "-DCMAKE_BUILD_TYPE=Release"],
             ["cmake", "--build", str(build), "--target", recipe.target, "-j", str(os.cpu_count() or 1)]]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise InputError(f"{bundle}: building its program took over {BUILD_TIMEOUT_S} s") from None
        if done.returncode != 0:
            tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
            raise InputError(f"{bundle}: building its program against {tree} failed: {tail[0]}")
    binary = build / recipe.target
    try:
        done = subprocess.run([str(binary), "--json"], capture_output=True, text=True, timeout=RUNNER_TIMEOUT_S,
                              cwd=bundle, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"{binary}: did not finish in {RUNNER_TIMEOUT_S} s") from None
    try:
        return json.loads(done.stdout)
    except ValueError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError(f"{binary}: failed (exit {done.returncode}): {tail}") from None
