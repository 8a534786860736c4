"""The harness command line (device_scripts/HARNESS_CLI.md) for the Python host engines.

The `local` device runs these engines in a child process with exactly the arguments a phone's C++
harness gets, and they answer with the same exit codes and the same raw dump. Keeping the contract in
one module means an engine only has to implement "load, run, dump".
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NoReturn

import numpy as np

from layerdiff.analyzer.formats.rawdump import RawDumpWriter, sha256_file
from layerdiff.errors import HarnessExit
from layerdiff.collector.engines.base import HOST_BACKENDS
from layerdiff.vocabulary import PRECISIONS

HARNESS_VERSION = "0.1.0"
EXIT_OK, EXIT_ARGS, EXIT_MODEL, EXIT_BACKEND, EXIT_RUN, EXIT_WRITE = 0, 2, 3, 4, 5, 6
BACKENDS = HOST_BACKENDS  # an engine whose harness knows other names passes them to harness_main


@dataclass
class HarnessArgs:
    engine: str
    models: list[Path]
    inputs: dict[str, Path]
    backend: str
    precision: str
    out: Path
    threads: int = 1
    layers: re.Pattern | None = None
    max_bytes: int | None = None
    repeat: int = 1
    abort_after: int | None = None
    inject: Path | None = None
    targets: list[str] = field(default_factory=list)
    replace: list[str] = field(default_factory=list)  # with --inject: whole run, these outputs overwritten
    keep: str | None = None  # ggml: nodes kept in the reference configuration (collect bisect), a node-name regex


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise HarnessExit(EXIT_ARGS, f"bad arguments: {message}")


def _parser() -> _Parser:
    p = _Parser(prog="layerdiff-harness", add_help=True)
    p.add_argument("--engine")
    p.add_argument("--model", action="append", default=[])
    p.add_argument("--input", action="append", default=[])
    p.add_argument("--backend", default="cpu")
    p.add_argument("--precision", default="high")
    p.add_argument("--out")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers")
    p.add_argument("--max-bytes", type=int)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--abort-after", type=int)
    p.add_argument("--inject")
    p.add_argument("--target", action="append", default=[])
    p.add_argument("--replace", action="append", default=[])
    p.add_argument("--each")
    p.add_argument("--keep")
    p.add_argument("--version", action="store_true")
    p.add_argument("--probe", action="store_true")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    return _parser().parse_args(argv)


def validate(ns: argparse.Namespace, engine_name: str, backends: tuple[str, ...] = BACKENDS) -> HarnessArgs:
    """Turn parsed flags into a run description, refusing anything a phone harness would refuse.

    `backends`: the backend names this engine knows (LiteRT's host engine says `gpu`, not a GPU API)."""
    if ns.engine not in (None, engine_name):
        raise HarnessExit(EXIT_ARGS, f"this harness runs engine {engine_name!r}, not {ns.engine!r}")
    if ns.backend not in backends:
        raise HarnessExit(EXIT_ARGS, f"unknown backend {ns.backend!r} for {engine_name}; use one of {', '.join(backends)}")
    if ns.precision not in PRECISIONS:
        raise HarnessExit(EXIT_ARGS, f"unknown precision {ns.precision!r}; use one of {', '.join(PRECISIONS)}")
    if not ns.model:
        raise HarnessExit(EXIT_ARGS, "no --model given")
    if not ns.out:
        raise HarnessExit(EXIT_ARGS, "no --out directory given")
    if ns.repeat < 1 or ns.threads < 1:
        raise HarnessExit(EXIT_ARGS, "--repeat and --threads must be at least 1")
    if ns.replace and (not ns.inject or ns.target):
        raise HarnessExit(EXIT_ARGS, "--replace KEY needs --inject DIR (the tensors) and no --target")
    models = [Path(m) for m in ns.model]
    for model in models:
        if not model.is_file():
            raise HarnessExit(EXIT_MODEL, f"model file {model} does not exist")
    try:
        layers = re.compile(ns.layers) if ns.layers else None
    except re.error as err:
        raise HarnessExit(EXIT_ARGS, f"--layers {ns.layers!r} is not a valid regex ({err})") from None
    return HarnessArgs(
        engine=engine_name,
        models=models,
        inputs=_input_files(ns.input),
        backend=ns.backend,
        precision=ns.precision,
        out=Path(ns.out),
        threads=ns.threads,
        layers=layers,
        max_bytes=ns.max_bytes,
        repeat=ns.repeat,
        abort_after=ns.abort_after,
        inject=Path(ns.inject) if ns.inject else None,
        targets=list(ns.target),
        keep=ns.keep,
        replace=list(ns.replace),
    )


def _input_files(specs: list[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise HarnessExit(EXIT_ARGS, f"--input {spec!r} must be NAME=FILE.npy")
        if not Path(file).is_file():
            raise HarnessExit(EXIT_ARGS, f"input file {file} does not exist")
        out[name] = Path(file)
    return out


INPUT_DTYPES = ("float32", "int32", "int64", "uint8", "bool")


def load_inputs(files: dict[str, Path]) -> dict[str, np.ndarray]:
    """Input arrays as the files hold them: float32, or int32/int64/uint8/bool for models that take those.

    The Python host engines feed each in the dtype its model input takes; the C++ harness reads `<f4` only.
    """
    arrays = {}
    for name, path in files.items():
        try:
            array = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise HarnessExit(EXIT_ARGS, f"input file {path} is not a readable .npy ({err})") from None
        if array.dtype.name not in INPUT_DTYPES:
            raise HarnessExit(EXIT_ARGS, f"input file {path} holds {array.dtype}; use one of {', '.join(INPUT_DTYPES)}")
        arrays[name] = np.asarray(array, order="C")  # a 0-d scalar stays 0-d
    return arrays


def base_header(args: HarnessArgs, engine_version: str, inputs: dict[str, np.ndarray]) -> dict:
    """Header fields every engine fills the same way (FORMATS.md §1)."""
    return {
        "engine": args.engine,
        "engine_version": engine_version,
        "backend_requested": args.backend,
        "precision_requested": args.precision,
        "threads": args.threads,
        "model": [{"file": m.name, "sha256": sha256_file(m), "bytes": m.stat().st_size} for m in args.models],
        "inputs": [
            {
                "name": name,
                "file": args.inputs[name].name,
                "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
                "shape": list(arr.shape),
                "dtype": arr.dtype.name,
            }
            for name, arr in inputs.items()
        ],
        "harness": f"layerdiff-local-{args.engine} {HARNESS_VERSION}",
    }


class DumpSink:
    """Applies the layer filter, byte budget, progress lines and --abort-after to one raw dump."""

    def __init__(self, args: HarnessArgs, out: Path, header: dict, total_ops: int) -> None:
        try:
            self.writer = RawDumpWriter(out, header)
        except Exception as err:  # noqa: BLE001 - any failure to create the dump is an I/O exit
            raise HarnessExit(EXIT_WRITE if not isinstance(err, ValueError) else EXIT_ARGS, str(err)) from None
        self.args = args
        self.total_ops = total_ops
        self.dumped_bytes = 0
        self.count = 0
        self.budget_hit = False
        self.watched: set[str] = set()
        self.observed: dict = {}  # name -> plainrun.Observed: the model outputs as this run computed them

    def watch(self, names) -> None:
        """Keep a copy of these tensors (the model's outputs) as they are added, dumped or not, for the
        comparison with the plain run (collector/engines/plainrun.py)."""
        self.watched = set(names)

    def add(self, *, op: str, array: np.ndarray, **fields) -> None:
        name = fields.get("name", op)
        if name in self.watched and name not in self.observed:
            from layerdiff.collector.engines.plainrun import Observed

            self.observed[name] = Observed(name, op, int(fields.get("output_index", 0)), str(fields.get("op_type", "")),
                                           str(fields.get("layout", "")), np.array(array, copy=True))
        if self.args.layers is not None and not self.args.layers.search(op):
            return
        if self.args.max_bytes is not None and self.dumped_bytes + array.nbytes > self.args.max_bytes:
            self.budget_hit = True
            return
        try:
            self.writer.add(op=op, array=array, **fields)
        except OSError as err:
            raise HarnessExit(EXIT_WRITE, f"writing the dump failed ({err})") from None
        self.dumped_bytes += array.nbytes
        self.count += 1
        progress = {"event": "tensor", "k": self.count, "n": self.total_ops, "op": op}
        print("@@ld " + json.dumps(progress), flush=True)
        _PROCESS["dumped"] += 1
        counted = _PROCESS["dumped"] if _PROCESS["each"] else self.count  # --each: the process's tensors
        if self.args.abort_after is not None and counted >= self.args.abort_after:
            sys.stdout.flush()
            import os

            os.abort()

    def fed(self, name: str, array: np.ndarray, layout: str, axes: tuple[int, ...] | None = None) -> None:
        """Record input `name` as the engine received it, read back from the engine's own input tensor
        after feeding (FORMATS.md `input_fed`): the collector checks it against the input given.
        Not filtered by --layers nor counted against --max-bytes: it is the run's input, not a layer."""
        try:
            self.writer.add_fed(name=name, array=array, layout=layout, axes=axes)
        except OSError as err:
            raise HarnessExit(EXIT_WRITE, f"writing the dump failed ({err})") from None

    def close(self, infer_ms: float, plain_run: dict | None = None, observability: dict | None = None,
              not_observable: list[dict] | None = None) -> None:
        """End the dump; `plain_run` (plainrun.check) and what this run's own check found about tensors it never
        wrote (`observability`, `not_observable`: unwritten.py) go into the footer, known only once the run is over."""
        status = f"byte budget of {self.args.max_bytes} exhausted" if self.budget_hit else "ok"
        extra = {"plain_run": plain_run} if plain_run else {}
        if observability is not None:
            extra.update({"observability": observability, "not_observable": not_observable or []})
        self.writer.close(infer_ms=infer_ms, status=status, extra=extra or None)


def native_argv(engine: str, args: HarnessArgs) -> list[str]:
    """The checked arguments as a native harness's command line (device_scripts/HARNESS_CLI.md): what an
    engine whose runs are a compiled program (ggml, the C++ paddle-lite engine) hands that program."""
    argv = ["--engine", engine, "--backend", args.backend, "--precision", args.precision, "--out", str(args.out),
            "--threads", str(args.threads), "--repeat", str(args.repeat)]
    argv += [a for model in args.models for a in ("--model", str(model))]
    argv += [a for name, path in args.inputs.items() for a in ("--input", f"{name}={path}")]
    if args.layers is not None:
        argv += ["--layers", args.layers.pattern]
    if args.max_bytes is not None:
        argv += ["--max-bytes", str(args.max_bytes)]
    if args.abort_after is not None:
        argv += ["--abort-after", str(args.abort_after)]
    if args.keep is not None:
        argv += ["--keep", args.keep]
    if args.inject is not None:
        argv += ["--inject", str(args.inject), *[a for t in args.targets for a in ("--target", t)],
                 *[a for k in args.replace for a in ("--replace", k)]]
    return argv


def repeat_dirs(args: HarnessArgs) -> list[Path]:
    if args.repeat == 1:
        return [args.out]
    return [args.out / f"r{k}" for k in range(args.repeat)]


def harness_main(engine_name: str, run: Callable[[HarnessArgs], None], probe: Callable[[], dict], version: Callable[[], str],
                 backends: tuple[str, ...] = BACKENDS) -> int:
    """Entry point shared by the host engines: parse, dispatch, map errors to exit codes."""
    try:
        ns = parse_args(sys.argv[1:])
        if ns.version:
            print(f"layerdiff-harness {HARNESS_VERSION} ({engine_name} {version()}, Python host engine)")
            return EXIT_OK
        if ns.probe:
            print(json.dumps(probe()))
            return EXIT_OK
        if ns.each:
            return run_each(ns, engine_name, run, backends)
        run(validate(ns, engine_name, backends))
        return EXIT_OK
    except HarnessExit as exc:
        print(f"layerdiff-harness: {exc}", file=sys.stderr)
        return exc.code


CASE_EVENT = "case"


# Bounds of an `--each` file, the C++ harness's own (device_scripts/harness/src/each_cases.cpp): the file is
# untrusted text, refused whole before the model loads.
EACH_FILE_BYTES, EACH_LINE_BYTES, EACH_RUNS = 64 << 20, 64 << 10, 1_000_000
EACH_INPUTS, EACH_PATH_BYTES, EACH_NAME_BYTES = 256, 4096, 1024


def read_cases(path: str) -> list[dict]:
    """`--each FILE`: one JSON object a line, `{"out": DIR, "inputs": {NAME: FILE.npy}}`, one run each; a
    relative path is relative to FILE's own directory (the collector writes FILE beside the run's dumps).
    Anything else stops the process before the model loads, with one line naming the file and line."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(EACH_FILE_BYTES + 1)
        if len(data) > EACH_FILE_BYTES:
            raise HarnessExit(EXIT_ARGS, f"--each {path}: larger than {EACH_FILE_BYTES >> 20} MiB; split the inputs "
                                         "over several files")
        lines = data.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise HarnessExit(EXIT_ARGS, f"--each {path}: not readable ({err})") from None
    base = Path(path).parent
    cases = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        if len(line.encode()) > EACH_LINE_BYTES:
            raise HarnessExit(EXIT_ARGS, f"--each {where}: longer than {EACH_LINE_BYTES} bytes")
        if len(cases) >= EACH_RUNS:
            raise HarnessExit(EXIT_ARGS, f"--each {path}: more than {EACH_RUNS} runs")
        out, inputs = _one_case(line, where)
        cases.append({"out": str(base / out), "inputs": {name: str(base / file) for name, file in inputs}})
    if not cases:
        raise HarnessExit(EXIT_ARGS, f"--each {path}: names no run (one {{\"out\", \"inputs\"}} object a line)")
    return cases


def _one_case(line: str, where: str) -> tuple[str, list[tuple[str, str]]]:
    """One line's `out` and `(name, file)` inputs, each bounded, no NUL, no input named twice."""
    def bad(why: str) -> HarnessExit:
        return HarnessExit(EXIT_ARGS, f"--each {where}: {why}")

    try:
        case = json.loads(line, object_pairs_hook=list)
    except (ValueError, RecursionError) as err:
        raise bad(f"invalid JSON ({str(err)[:80]})") from None
    if not isinstance(case, list) or not all(isinstance(m, tuple) for m in case):
        raise bad('not an {"out", "inputs"} object')
    members = dict(case)
    if "out" not in members or "inputs" not in members:
        raise bad('not an {"out", "inputs"} object (both are required)')
    out = _case_text(members["out"], '"out"', bad)
    inputs = members["inputs"]
    if not isinstance(inputs, list) or not all(isinstance(m, tuple) for m in inputs):
        raise bad('"inputs" is not an object of NAME: FILE.npy')
    if not inputs:
        raise bad('"inputs" names no input')
    if len(inputs) > EACH_INPUTS:
        raise bad(f"more than {EACH_INPUTS} inputs")
    names = [name for name, _ in inputs]
    for name in names:
        if not name or len(name.encode()) > EACH_NAME_BYTES or "\0" in name:
            raise bad(f"an input name is empty, longer than {EACH_NAME_BYTES} bytes or holds NUL")
        if names.count(name) > 1:
            raise bad(f"input '{name}' is named twice")
    return out, [(name, _case_text(file, f"input '{name}'", bad)) for name, file in inputs]


def _case_text(value: object, what: str, bad: Callable[[str], HarnessExit]) -> str:
    """A path member of a case: a non-empty string of at most EACH_PATH_BYTES, no NUL."""
    if not isinstance(value, str):
        raise bad(f"{what} is not a string")
    if not value:
        raise bad(f"{what} is empty")
    if len(value.encode()) > EACH_PATH_BYTES:
        raise bad(f"{what} is longer than {EACH_PATH_BYTES} bytes")
    if "\0" in value:
        raise bad(f"{what} holds a NUL character")
    return value


def run_each(ns: argparse.Namespace, engine_name: str, run: Callable[[HarnessArgs], None],
             backends: tuple[str, ...]) -> int:
    """`--each FILE`: one run per line of FILE in this one process (the model loaded once where the engine
    keeps it: `reuse`), each its own raw dump with its own header, written and closed before the next
    starts. A case that fails says so on stdout (`@@ld {"event": "case", ...}`, with its exit code and
    line) and the next one runs; one that crashes the process leaves the ones before it complete."""
    if ns.repeat != 1 or ns.inject or ns.input:
        raise HarnessExit(EXIT_ARGS, "--each takes each run's inputs from its file: no --input, --repeat or --inject")
    cases = read_cases(ns.each)
    _PROCESS["each"] = True
    for k, case in enumerate(cases):
        _event(k, "start")
        ns.input = [f"{name}={file}" for name, file in case["inputs"].items()]
        ns.out = case["out"]
        try:
            run(validate(ns, engine_name, backends))
        except HarnessExit as exc:
            print(f"layerdiff-harness: {exc}", file=sys.stderr, flush=True)
            _event(k, "failed", code=exc.code, message=str(exc))
            continue
        _event(k, "done")
    return EXIT_OK


def _event(k: int, state: str, **fields) -> None:
    import os

    print("@@ld " + json.dumps({"event": CASE_EVENT, "case": k, "state": state, "pid": os.getpid(), **fields}), flush=True)


_REUSED: dict = {}
_PROCESS = {"each": False, "dumped": 0}  # tensors this process dumped: --abort-after counts them under --each


def reuse(key: tuple, make: Callable[[], object]) -> object:
    """What an engine loads once per process (its model, session or net, keyed by everything that
    shapes it) and then runs every `--each` input on: the engine-process-per-configuration floor."""
    if key not in _REUSED:
        _REUSED.clear()  # one configuration per process: never two models' memory at once
        _REUSED[key] = make()
    return _REUSED[key]


def now_ms() -> float:
    return time.perf_counter() * 1000.0


def load_inject(path: Path) -> dict[str, np.ndarray]:
    """The reference tensors an isolation run feeds, by tensor name (a raw dump directory)."""
    from layerdiff.errors import LayerdiffError
    from layerdiff.analyzer.formats.rawdump import read_raw_dump

    try:
        dump = read_raw_dump(path)
        return {tensor.name: array for tensor, array in dump.iter_arrays()}
    except LayerdiffError as err:
        raise HarnessExit(EXIT_ARGS, f"--inject {path}: {err}") from None


def split_key(key: str) -> tuple[str, int]:
    """`block3/conv:0` → ("block3/conv", 0); a key without an index means output 0."""
    op, sep, index = key.rpartition(":")
    if sep and index.isdigit():
        return op, int(index)
    return key, 0
