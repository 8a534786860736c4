"""Paddle (PyPI `paddlepaddle`) on the host, speaking the harness command line: the Paddle golden.

`collect --device local --model m.pdmodel --engine paddle` runs a Paddle inference model on Paddle's
CPU executor with every variable fetched: the reference Paddle-Lite users compare against (Paddle-Lite's
own model_debug_tool compares with Paddle CPU). The model file is not edited: the program is run with
a fetch list naming every op output, so each variable keeps the name it has in the program, which is
the name Paddle-Lite gives the same variable (`op` = `name` = the variable, `output_index` 0): a
Paddle-Lite run or an imported Paddle-Lite dump aligns with this one by name.

Variables are fetched in groups whose total size stays under a budget (each group one run of the
program), so a large model's activations never all sit in memory at once.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np

from layerdiff.vocabulary import host_abi
from layerdiff.collector.engines import plainrun
from layerdiff.collector.engines.harness_cli import (
    HARNESS_VERSION,
    EXIT_ARGS,
    EXIT_BACKEND,
    EXIT_MODEL,
    EXIT_RUN,
    DumpSink,
    HarnessArgs,
    HarnessExit,
    base_header,
    harness_main,
    load_inputs,
    now_ms,
    repeat_dirs,
)
from layerdiff.collector.engines.paddle.program import ProgramError, Variable, dumped_variables, read_program

INSTALL = "pip install 'layerdiff[paddle]' (paddlepaddle 3.3.1, CPU)"
GROUP_BYTES = 32 << 20  # bytes of variables fetched per run of the program (memory bound)


def _paddle():
    """Paddle, imported quietly: its C++ log lines and import warnings would read as run problems."""
    os.environ.setdefault("GLOG_minloglevel", "2")
    os.environ.setdefault("FLAGS_enable_pir_api", "0")  # .pdmodel programs run on the legacy executor
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import paddle
    except ImportError:
        raise HarnessExit(EXIT_BACKEND, f"Paddle is not installed here: {INSTALL}") from None
    return paddle


def engine_version() -> str:
    return _paddle().__version__


def probe() -> dict:
    reason = "the paddle engine runs on the CPU only"
    backends = {"cpu": {"ok": True}, "opencl": {"ok": False, "reason": reason}, "vulkan": {"ok": False, "reason": reason}}
    abi = host_abi()
    return {"harness": "layerdiff-local-paddle", "version": HARNESS_VERSION, "abi": abi,
            "engines": {"paddle": {"version": engine_version(), "backends": backends}}}


def model_files(args: HarnessArgs) -> tuple[Path, Path | None]:
    """The program and its parameters: `--model m.pdmodel [--model m.pdiparams]`."""
    programs = [m for m in args.models if m.suffix.lower() != ".pdiparams"]
    params = [m for m in args.models if m.suffix.lower() == ".pdiparams"]
    if len(programs) != 1 or len(params) > 1:
        raise HarnessExit(EXIT_ARGS, "the paddle engine takes --model M.pdmodel and optionally --model M.pdiparams")
    return programs[0], (params[0] if params else None)


def load(paddle, program_file: Path, params_file: Path | None):
    """The program and an executor whose scope holds its parameters."""
    paddle.enable_static()
    executor = paddle.static.Executor(paddle.CPUPlace())
    try:
        program = paddle.static.deserialize_program(program_file.read_bytes())
        if params_file is not None:
            paddle.static.deserialize_persistables(program, params_file.read_bytes(), executor)
    except Exception as err:  # noqa: BLE001 - Paddle raises its own enforce errors
        raise HarnessExit(EXIT_MODEL, f"{program_file}: Paddle cannot load this model ({_first_line(err)})") from None
    return program, executor


def feeds_for(program, inputs: dict[str, np.ndarray], feed_names: list[str]) -> dict[str, np.ndarray]:
    """Each input in the element type the program declares (a float32 file for an int64 input is cast)."""
    block = program.global_block()
    feeds = {}
    for name, array in inputs.items():
        if name not in feed_names:
            raise HarnessExit(EXIT_RUN, f"model has no input {name!r}; its inputs are {', '.join(feed_names)}")
        dtype = str(block.var(name).dtype).rsplit(".", 1)[-1].lower()
        dtype = {"fp32": "float32", "fp64": "float64", "fp16": "float16"}.get(dtype, dtype)
        feeds[name] = np.asarray(array, dtype=np.dtype(dtype) if dtype in np.sctypeDict else array.dtype, order="C")
    missing = [n for n in feed_names if n not in feeds]
    if missing:
        raise HarnessExit(EXIT_RUN, f"no --input for model input(s) {', '.join(missing)}")
    return feeds


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip() and not line.startswith("---")]
    text = next((line for line in lines if "Error" in line), lines[0] if lines else type(err).__name__)
    return text[:300]


def run_once(executor, program, feeds: dict, variables: list[Variable], sink: DumpSink, budget: int) -> float:
    """Fetch every variable a group at a time and dump them in program order.

    The first group is one variable; each next one is sized from the bytes the last returned, so a
    group holds about `budget` bytes.
    """
    total, start, count = 0.0, 0, 1
    while start < len(variables):
        group = variables[start : start + count]
        begin = now_ms()
        try:
            values = executor.run(program, feed=feeds, fetch_list=[v.name for v in group], return_numpy=True)
        except Exception as err:  # noqa: BLE001 - Paddle raises its own enforce errors
            raise HarnessExit(EXIT_RUN, f"Paddle failed to run the model ({_first_line(err)})") from None
        elapsed = now_ms() - begin
        total += elapsed
        fetched = sum(int(np.asarray(v).nbytes) for v in values)
        for index, variable in enumerate(group):
            array = np.asarray(values[index])
            values[index] = None  # dumped: let it go
            if array.dtype == np.bool_:
                array = array.astype(np.uint8)  # masks: compared as 0/1 values
            sink.add(op=variable.name, op_type=variable.op_type, array=array, output_index=0, name=variable.name,
                     inputs=variable.inputs, layout="NCHW" if array.ndim == 4 else "", memory="host",
                     time_ms=elapsed / len(group))
        start += len(group)
        count = max(1, int(len(group) * budget / max(fetched, 1)))
    return total


# What observing does differently here (plainrun.py; shown when the plain run disagrees).
OBSERVING = ("every op output is fetched, in groups, each group one run of the program; the plain run fetches only "
             "the program's own fetch targets, as an app does")


def run_plain(executor, program, feeds: dict, fetches: list[str]) -> dict[str, np.ndarray]:
    """One run as an app runs it: the program's own fetch targets only."""
    try:
        values = executor.run(program, feed=feeds, fetch_list=fetches, return_numpy=True)
    except Exception as err:  # noqa: BLE001 - Paddle raises its own enforce errors
        raise HarnessExit(EXIT_RUN, f"Paddle failed to run the model plainly ({_first_line(err)})") from None
    return dict(zip(fetches, (np.asarray(v) for v in values)))


def run(args: HarnessArgs) -> None:
    if args.backend != "cpu":
        raise HarnessExit(EXIT_BACKEND, f"the paddle engine runs on the CPU only; use --backend cpu, not {args.backend}")
    if args.inject is not None:
        raise HarnessExit(EXIT_ARGS, "the paddle engine does not isolate ops (--inject); it is the golden")
    program_file, params_file = model_files(args)
    try:
        described = read_program(program_file)
    except ProgramError as err:
        raise HarnessExit(EXIT_MODEL, str(err)) from None
    variables = dumped_variables(described)
    inputs = load_inputs(args.inputs)
    paddle = _paddle()
    paddle.set_flags({"FLAGS_use_mkldnn": False})  # Paddle's plain CPU kernels: the reference, not oneDNN's
    program, executor = load(paddle, program_file, params_file)
    feeds = feeds_for(program, inputs, described.feeds())
    header = base_header(args, paddle.__version__, inputs)
    header.update({"backends_actual": ["cpu"], "precision_effective": "fp32",
                   "options": {"executor": "paddle.static.Executor(CPUPlace)", "onednn": False,
                               "variables": len(variables)}})
    fetches = described.fetches()
    for k, out in enumerate(repeat_dirs(args)):
        sink = DumpSink(args, out, {**header, "repeat": k}, total_ops=len(variables))
        for name, array in feeds.items():  # the arrays handed to Executor.run: what Paddle reads (`input_fed`)
            sink.fed(name, array, "NCHW" if array.ndim == 4 else "")
        sink.watch(fetches)
        elapsed = run_once(executor, program, feeds, variables, sink, GROUP_BYTES)
        check = plainrun.check(out, {**header, "repeat": k}, sink.observed,
                               lambda: run_plain(executor, program, feeds, fetches), OBSERVING, now_ms) if fetches else None
        sink.close(elapsed, check)


def main() -> int:
    return harness_main("paddle", run, probe, engine_version)


if __name__ == "__main__":
    sys.exit(main())
