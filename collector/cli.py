"""`collect`: parse the command line, call the collector library, print. Nothing else lives here."""
from __future__ import annotations

if __name__ == "__main__":  # `python -m layerdiff.collector.cli`: the command's own process, as the console script
    from layerdiff.console import fewer_collections

    fewer_collections()

import functools
import json
import re
import sys
from pathlib import Path
from typing import Annotated, Callable, List, Optional

import typer
from rich.console import Console

from layerdiff.vocabulary import RunStatus
from layerdiff.clioptions import choices
from layerdiff.collector.engines import ENGINE_BACKEND_NOTES, ENGINE_BACKENDS, PHONE_ENGINES, PREPARED_BY_DEFAULT
from layerdiff.vocabulary import PRECISIONS, backends_help
from layerdiff.safetext import terminal_lines
from layerdiff.errors import EXIT_INTERRUPTED, EXIT_SOME_SKIPPED, DeviceError, InputError, Interrupted, LayerdiffError, StorageError, os_error_line
from layerdiff.collector.inputs.inputset import resolve_inputs
from layerdiff.collector.inputs.modelfiles import ENGINES, input_shapes, resolve_model
from layerdiff.collector.run.isolate import failing_layers, isolatable, isolate
from layerdiff.collector.inputs.preprocess import parse_preprocess
from layerdiff.collector.sweep.prepare import prepare_devices
from layerdiff.collector.sweep.plan import parse_configs, resolve_devices, split_list
from layerdiff.collector.sweep.progress import SweepProgress, step_progress
from layerdiff.progress import Steps
from layerdiff.analyzer.formats.diskspace import exit_now_if_hdf5_failed
from layerdiff.collector.sweep.collect import build_plan, prepare
from layerdiff.collector.sweep.execute import run_sweep

BACKENDS = ENGINE_BACKENDS  # every backend some registered engine knows (layerdiff/vocabulary.py order)

# Help texts the registry writes (collector/engines/): every engine's model files, the inputs a text prompt goes
# to, the engines that isolate a sub-graph.
_MODEL_HELP = ", ".join(e.model_text for e in ENGINES.values()) + " (default: bundled sample)"
_INPUT_HELP = ".npy, .npz, image, dir, glob, name=FILE, " + "".join(
    f"{e.prompt_input}=TEXT.txt ({e.name}), " for e in ENGINES.values() if e.prompt_input) + "or random[:SEED]; repeatable"
_LAYER_HELP = "layer key to isolate, e.g. block3/conv:0" + "".join(
    f"; {e.name} also FIRST..LAST, those layers as one sub-graph" for e in ENGINES.values()
    if e.isolate_rebuilds_graph) + " (repeatable)"

# Options the single-configuration commands share: one definition each, so a flag reads and checks the same in
# every command.
OneDevice = Annotated[str, typer.Option("--device", "-d", help="local or a serial")]
ModelFile = Annotated[Path, typer.Option("--model", "-m")]
EngineChoice = Annotated[str, typer.Option("--engine", callback=choices(("auto", *ENGINES), "engine"))]
OneBackend = Annotated[str, typer.Option("--backend", "-b", callback=choices(BACKENDS, "backend"))]
Preprocess = Annotated[Optional[str], typer.Option("--preprocess")]
AdbServers = Annotated[Optional[List[str]], typer.Option("--adb-server", help="host:port of an adb server (repeatable)")]
DeviceDeadline = Annotated[float, typer.Option("--deadline", help="seconds a run may take on the device")]

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=False, rich_markup_mode=None,
                  help="Run a model on devices with every layer dumped; one HDF5 file per run.")
console = Console(stderr=True)
_SAID_INTERRUPTED: list[bool] = []  # an interrupted sweep's summary already said it in one line


def _ctrl_c_is_one_line(command: Callable) -> Callable:
    """Typer turns Ctrl-C into a silent exit 130; say what happened (runs already written stay)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            raise Interrupted("interrupted; runs already written are kept, re-run the same command to resume") from None

    return wrapper


def _config_pairs(values: list[str] | None) -> list[str] | None:
    """`--config` checked like --backend/--precision: a usage error (exit 2) names the bad pair."""
    try:
        parse_configs(split_list(values), BACKENDS, PRECISIONS)
    except LayerdiffError as err:
        raise typer.BadParameter(str(err).removeprefix("--config ")) from None
    return values


def _task_option(value: str | None) -> str | None:
    """`--task` checked before any device is touched (a usage error, exit 2); returned as analyze reads it."""
    from layerdiff.api import check_task

    try:
        return check_task(value)
    except LayerdiffError as err:
        raise typer.BadParameter(str(err).removeprefix("--task ")) from None


def _engine_release(value: str) -> str:
    """`--engine NAME` or `NAME==VERSION` (engines/versions.py), checked before any device is touched."""
    from layerdiff.collector.engines.versions import split_engine

    try:
        name, version = split_engine(value)
    except LayerdiffError as err:
        raise typer.BadParameter(str(err).removeprefix("--engine ")) from None
    choices(("auto", *ENGINES), "engine")(name)
    if version and name == "auto":
        raise typer.BadParameter("name the engine a release belongs to, e.g. NAME==VERSION with NAME one of: "
                                 + ", ".join(ENGINES))
    return value


def _say_sketched(sketched) -> None:
    """One line on what the sketch-first runs pulled, and one per run that could not be refined; after a
    Ctrl-C, one line on the runs whose refinement waits for the same command to run again."""
    if sketched is not None and sketched.waiting:
        print(f"collect: {sketched.waiting} sketch-first runs are not refined yet: their dumps stay on the device "
              "and their summaries in .sketch/ beside them; run the same command again to pull what their "
              "analysis needs (then both are removed)", file=sys.stderr)
    if sketched is None or not sketched.runs:
        return
    share = sketched.bytes_pulled / sketched.dump_bytes if sketched.dump_bytes else 0.0
    print(f"collect: {sketched.runs} runs pulled sketch-first: {sketched.bytes_pulled / 1e6:.1f} MB of "
          f"{sketched.dump_bytes / 1e6:.1f} MB ({share:.1%}) in {sketched.rounds} rounds; layers left on the "
          "device are estimates (the report marks them)", file=sys.stderr)
    for problem in sketched.problems:
        print(terminal_lines(f"collect: {problem}"), file=sys.stderr)


@app.callback(invoke_without_command=True)
@_ctrl_c_is_one_line
def collect(
    ctx: typer.Context,
    device: List[str] = typer.Option(None, "--device", "-d", help="local, arm64[:CPU] (emulated ARM core), a serial, all, or a comma list"),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help=_MODEL_HELP),
    engine: str = typer.Option("auto", "--engine", help="auto (from the file name), or one of: " + ", ".join(ENGINES)
                               + "; NAME==VERSION runs that release from its own cached environment (local device)"
                               + "".join(f"; {e.name}==VERSION: {e.release_help}" for e in ENGINES.values() if e.release_help),
                               callback=_engine_release),
    backend: List[str] = typer.Option(None, "--backend", "-b", help=f"{backends_help(BACKENDS, ENGINE_BACKEND_NOTES)} (comma list or repeated)",
                                      callback=choices(BACKENDS, "backend")),
    precision: List[str] = typer.Option(None, "--precision", "-p", help=f"{', '.join(PRECISIONS)} (comma list or repeated)",
                                        callback=choices(PRECISIONS, "precision")),
    config: List[str] = typer.Option(None, "--config", help="backend/precision pairs to run instead of every --backend "
                                     "× --precision, e.g. cpu/high,vulkan/low", callback=_config_pairs),
    input: List[str] = typer.Option(None, "--input", "-i", help=_INPUT_HELP),
    shape: List[str] = typer.Option(None, "--shape", help="NAME=1x3x640x640: an input's shape where the model declares none (repeatable)"),
    preprocess: Optional[str] = typer.Option(None, "--preprocess", help="image recipe: resize=224x224,crop=center,... or a .json/.toml file"),
    out: Path = typer.Option(Path("runs"), "--out", "-o", help="output directory for the .h5 files"),
    threads: int = typer.Option(1, "--threads"),
    repeat: int = typer.Option(1, "--repeat", help="dump each configuration N times (nondeterminism)"),
    fresh_process: bool = typer.Option(False, "--fresh-process", help="with --repeat N: run each repeat in a new harness "
                                       "process (faults that change between processes, not within one)"),
    deadline: DeviceDeadline = 900.0,
    layers: Optional[str] = typer.Option(None, "--layers", help="dump only ops whose name matches this regex"),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", help="stop dumping past this many bytes"),
    exclude: List[str] = typer.Option(None, "--exclude", help="serials to leave out of --device all"),
    adb_server: AdbServers = None,
    connect: List[str] = typer.Option(None, "--connect", help="host:port of a device-lab phone to `adb connect` "
                                      "through the (first) adb server and run on too (repeatable)"),
    keep: bool = typer.Option(False, "--keep", help="keep the run's files on the device"),
    sketch: bool = typer.Option(False, "--sketch", help="pull a phone's dump sketch-first (summaries, then only the "
                                "layers the analysis needs; automatic past 100 MB): docs/sketch.md"),
    full: bool = typer.Option(False, "--full", help="pull every phone dump whole, however large"),
    force: bool = typer.Option(False, "--force", help="re-run and overwrite runs already collected"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="re-run runs the index records as failed"),
    report: Optional[bool] = typer.Option(None, "--report/--no-report",
                                          help="analyze the runs into OUTDIR/report (default: on when several runs)"),
    task: Optional[str] = typer.Option(None, "--task", callback=_task_option,
                                       help="what the outputs are, recorded in every run for analyze: classification, "
                                            "yolov5, yolox, yolov8, picodet, ssd, text-det, segmentation, landmarks, embedding, "
                                            "language-model, regression (NAME[:OUTPUT][,key=value,...])"),
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    configs = parse_configs(split_list(config), BACKENDS, PRECISIONS)
    if sketch and full:
        raise typer.BadParameter("choose one way to pull the dumps", param_hint="--sketch/--full")
    if configs and (backend or precision):
        raise typer.BadParameter("it names each run's backend and precision; drop --backend/--precision",
                                 param_hint="--config")
    plan, input_errors = build_plan(
        devices=split_list(device) or ["local"], model=model, engine=engine, preprocess=preprocess,
        backends=split_list(backend) or ["cpu"], precisions=split_list(precision) or ["high"],
        inputs=input or [], shapes=shape or [], out=out, threads=threads, repeat=repeat, deadline=deadline, layers=layers,
        max_bytes=max_bytes, exclude=split_list(exclude), adb_servers=adb_server or [], keep=keep, force=force,
        retry_failed=retry_failed, configs=configs, fresh_process=fresh_process, connect=split_list(connect),
        pull="sketch" if sketch else "full" if full else "auto",
    )
    if task:
        plan.extra_attrs["task"] = task
    for error in input_errors:
        print(terminal_lines(f"collect: {error}"), file=sys.stderr)
    prepare(plan, lambda title: step_progress(console, title))
    with SweepProgress(console) as progress:
        result = run_sweep(plan, observer=progress, on_planned=progress.planned)
    progress.summary(result.runs, plan.out_dir, result.interrupted)
    _say_sketched(result.sketched)
    if result.interrupted:  # the summary said so in one line
        _SAID_INTERRUPTED.append(True)
        raise typer.Exit(EXIT_INTERRUPTED)
    report_written = True
    if report if report is not None else len(result.runs) > 1:
        report_written = _sweep_report(plan.out_dir)
    if result.index.write_error is not None and not result.failed:  # a failed run's line already says why
        print(terminal_lines(f"collect: {result.index.write_error}"), file=sys.stderr)
    if result.failed or input_errors or not report_written or result.index.write_error is not None:
        raise typer.Exit(1)
    if any(run.row.status == RunStatus.SKIPPED for run in result.runs):
        raise typer.Exit(EXIT_SOME_SKIPPED)


def _sweep_report(out_dir: Path, **options) -> bool:
    """The matrix report of everything in OUTDIR, its verdict printed before the plots are drawn.

    Returns False when the report could not be written (a full disk, `OUTDIR/report` a file): the
    command then exits 1 (README: exit codes). Runs that cannot be compared (nothing to compare,
    unusable dumps) are said in one line and fail nothing: the runs themselves are collected."""
    from layerdiff.api import report_directory

    try:
        report_directory(out_dir, out_dir / "report", steps=Steps("collect"), **options)
    except Interrupted:
        raise  # Ctrl-C while the report is drawn: 130, like anywhere else
    except StorageError as err:
        print(f"collect: no report: {err}", file=sys.stderr)
        return False
    except OSError as err:
        print(f"collect: no report: {os_error_line(err)}", file=sys.stderr)
        return False
    except LayerdiffError as err:
        print(terminal_lines(f"collect: no report: {err}"), file=sys.stderr)
        return True
    print(terminal_lines(f"report: {out_dir / 'report' / 'index.html'}"), file=sys.stderr)
    return True


@app.command("devices")
def devices_command(
    adb_server: AdbServers = None,
    connect: List[str] = typer.Option(None, "--connect", help="host:port of a device-lab phone to `adb connect` "
                                      "through the (first) adb server first (repeatable)"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable output on stdout"),
    probe: bool = typer.Option(True, "--probe/--no-probe", help="ask a built harness which backends work"),
) -> None:
    """The host (`local`, `arm64`) and every device the adb server(s) know, with what it can run."""
    from layerdiff.collector.transport.adbinfo import devices_json, devices_table, list_adb_devices, machine_reports
    from layerdiff.collector.transport.devices import DeviceError

    reports = machine_reports(probe=probe)
    try:
        reports += list_adb_devices(adb_server or None, probe=probe, connect=split_list(connect))
    except DeviceError as err:
        if adb_server or connect:
            raise
        print(terminal_lines(f"collect: no phones listed: {err}"), file=sys.stderr)
    if json_out:
        print(json.dumps(devices_json(reports), indent=2))
    else:
        console = Console()
        if not console.is_terminal:  # piped: every column in full (a terminal's width truncated them to 3 letters)
            console = Console(width=100_000)
        console.print(devices_table(reports))


@app.command("prepare")
def prepare_command(
    device: List[str] = typer.Option(None, "--device", "-d", help="serials, all, or a comma list (default: all)"),
    engine: List[str] = typer.Option(None, "--engine", help=f"{', '.join(PHONE_ENGINES)} (comma list; default {', '.join(PREPARED_BY_DEFAULT)})",
                                     callback=choices(ENGINES, "engine")),
    backend: List[str] = typer.Option(None, "--backend", "-b", help="cpu, opencl, vulkan (default cpu)",
                                      callback=choices(BACKENDS, "backend")),
    adb_server: AdbServers = None,
    exclude: List[str] = typer.Option(None, "--exclude", help="serials to leave out of --device all"),
) -> None:
    """Build and stage the harness on phones ahead of time (the first build takes minutes)."""
    devices = resolve_devices(split_list(device) or ["all"], adb_server or [], split_list(exclude))
    results = prepare_devices(devices, split_list(engine) or list(PREPARED_BY_DEFAULT), split_list(backend) or ["cpu"])
    for r in results:
        print(terminal_lines(f"{'ready' if r.ok else 'failed':8s}{r.serial} {r.engine}/{r.backend}: {r.detail}"), file=sys.stderr)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command("isolate")
@_ctrl_c_is_one_line
def isolate_command(
    device: OneDevice = "local",
    model: ModelFile = ...,
    engine: EngineChoice = "auto",
    backend: OneBackend = ...,
    precision: str = typer.Option(..., "--precision", "-p", callback=choices(PRECISIONS, "precision")),
    ref: Path = typer.Option(..., "--ref", help="the reference run's HDF5 (its tensors feed the layers)"),
    layer: List[str] = typer.Option(None, "--layer", "-l", help=_LAYER_HELP),
    failing_from: Optional[Path] = typer.Option(None, "--failing-from", help="a report dir: isolate every layer it flagged"),
    out: Path = typer.Option(Path("runs"), "--out", "-o"),
    adb_server: AdbServers = None,
    deadline: DeviceDeadline = 900.0,
    force: bool = typer.Option(False, "--force"),
) -> None:
    """Re-run single layers on a backend, fed with the reference run's own input tensors."""
    keys = list(layer or [])
    files = resolve_model(model, engine)
    if failing_from is not None:
        flagged, dropped = isolatable(ref, failing_layers(failing_from, backend, precision),
                                      ENGINES[files.engine].not_isolatable)
        if dropped:
            print(terminal_lines(f"isolate: leaving out {', '.join(dropped)}: {files.engine} cannot run these alone (a view "
                                 "computes nothing, a store writes in place); their consumers show the same error"),
                  file=sys.stderr)
        keys += [k for k in flagged if k not in keys]
    target = resolve_devices([device], adb_server or [])[0]
    outcome = isolate(target, files, backend, precision, ref, keys, out, force=force, deadline_s=deadline)
    paths = ", ".join(str(p) for p in outcome.paths)
    if outcome.status == RunStatus.FAILED:
        raise DeviceError(f"{target.serial}: isolation failed: {outcome.message}")
    print(terminal_lines(f"{outcome.status:8s}{target.serial} {outcome.spec.stem} -> {paths} ({len(keys)} layer(s))"),
          file=sys.stderr)


def _model_and_inputs(model: Path, engine: str, inputs: list[str] | None, preprocess: str | None, out: Path,
                      check=None):
    """The model files and input sets a search over trial runs (`fix`, `bisect`) uses, checked before any
    device is touched: -o is a directory, the model resolves, every input is usable (`check`: the caller's
    own refusal, given the model files, before the inputs are read)."""
    if out.exists() and not out.is_dir():
        raise StorageError(f"output {out} is a file; pass a directory to -o")
    files = resolve_model(model, engine)
    if check is not None:
        check(files)
    sets, errors = resolve_inputs(inputs or [], input_shapes(files), parse_preprocess(preprocess),
                                  ENGINES[files.engine].prompt_input)
    if errors:
        raise InputError(errors[0])
    return files, sets


@app.command("fix")
def fix_command(
    device: OneDevice = "local",
    model: ModelFile = ...,
    engine: EngineChoice = "auto",
    backend: OneBackend = ...,
    precision: str = typer.Option("low", "--precision", "-p", help="the precision to fix (low or normal)",
                                  callback=choices(PRECISIONS, "precision")),
    input: List[str] = typer.Option(None, "--input", "-i", help="as for collect; the fix must hold on every input"),
    preprocess: Preprocess = None,
    out: Path = typer.Option(Path("fix"), "--out", "-o"),
    tolerance: float = typer.Option(1e-2, "--tolerance", help="max relative L2 of every output vs precision high"),
    adb_server: AdbServers = None,
    deadline: DeviceDeadline = 900.0,
) -> None:
    """Find the fewest layers to keep at high precision; write the patched ncnn model (MNN: a what-if)."""
    from layerdiff.collector.fix.search import fix
    from layerdiff.collector.fix.fixjson import fix_document, summary_lines, write_fix_json

    from layerdiff.clioptions import check_number

    check_number("--tolerance", tolerance, 0.0, above_minimum=True)
    files, inputs = _model_and_inputs(model, engine, input, preprocess, out)
    target = resolve_devices([device], adb_server or [])[0]
    result = fix(target, files, backend, precision, inputs, out, tolerance=tolerance, deadline_s=deadline)
    doc = fix_document(result, device=target.serial, model=files.name, engine=files.engine, backend=backend,
                       precision=precision, tolerance=tolerance)
    print(terminal_lines(f"fix: {write_fix_json(doc, out)}"), file=sys.stderr)
    for line in summary_lines(doc):
        print(terminal_lines(line), file=sys.stderr)
    _sweep_report(out, ref=next(iter(result.references.values())))
    if result.status in ("unfixable", "unverified"):
        raise typer.Exit(1)


@app.command("bisect")
def bisect_command(
    device: OneDevice = "local",
    model: ModelFile = ...,
    engine: EngineChoice = "auto",
    backend: OneBackend = ...,
    precision: str = typer.Option("low", "--precision", "-p", help="the failing precision",
                                  callback=choices(PRECISIONS, "precision")),
    input: List[str] = typer.Option(None, "--input", "-i", help="as for collect; the outputs must hold on every input"),
    preprocess: Preprocess = None,
    ref_config: Optional[str] = typer.Option(None, "--ref-config", help="BACKEND/PRECISION of the reference (default: the same backend, high)"),
    out: Path = typer.Option(Path("bisect"), "--out", "-o"),
    tolerance: float = typer.Option(1e-2, "--tolerance", help="max relative L2 of every output vs the reference"),
    adb_server: AdbServers = None,
    deadline: DeviceDeadline = 900.0,
) -> None:
    """Find the layer(s) whose move to the failing backend/precision breaks the outputs; only outputs are observed."""
    from layerdiff.collector.fix.bisect import bisect, bisect_document, bisectable, parse_ref_config, summary_lines

    reference = parse_ref_config(ref_config, backend, BACKENDS, PRECISIONS)
    # an engine without a per-layer switch refuses before any input is read or device touched
    files, inputs = _model_and_inputs(model, engine, input, preprocess, out, check=lambda f: bisectable(f, backend))
    target = resolve_devices([device], adb_server or [])[0]
    result = bisect(target, files, backend, precision, inputs, out, tolerance=tolerance, ref_config=reference,
                    deadline_s=deadline)
    doc = bisect_document(result, device=target.serial, model=files.name, backend=backend, precision=precision,
                          ref_config=reference)
    (out / "bisect.json").write_text(json.dumps(doc, indent=1) + "\n")
    for line in summary_lines(doc):
        print(terminal_lines(line), file=sys.stderr)
    if result.status == "not_layerwise":
        raise typer.Exit(1)


@app.command("repro")
def repro_command(
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="the model the run ran (its other files beside it)"),
    engine: EngineChoice = "auto",
    run: Optional[Path] = typer.Option(None, "--run", help="the failing run's HDF5"),
    ref: Optional[Path] = typer.Option(None, "--ref", help="the reference run's HDF5 (its tensors feed the layer)"),
    layer: List[str] = typer.Option(None, "--layer", "-l", help="layer key, or FIRST..LAST (file order) as one piece; "
                                    "repeatable: one bundle each under -o"),
    from_report: Optional[Path] = typer.Option(None, "--from-report", help="a report dir: bundle the failure source it "
                                               "names, with its run and reference"),
    backend: Optional[str] = typer.Option(None, "--backend", "-b", help="with --from-report: the run's backend",
                                          callback=choices(BACKENDS, "backend")),
    precision: Optional[str] = typer.Option(None, "--precision", "-p", help="with --from-report: the run's precision",
                                            callback=choices(PRECISIONS, "precision")),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="the bundle directory (a .zip of it is written beside)"),
    check: Optional[Path] = typer.Option(None, "--check", help="a bundle directory: re-run its runner, say whether it "
                                         "still reproduces"),
    device: str = typer.Option("local", "--device", "-d", help="with --check: where to run it (local)"),
    source_dir: Optional[Path] = typer.Option(None, "--source-dir", help="with --check on a bundle whose runner is a "
                                              "C++ program: the engine source tree it is built against (default: the "
                                              "one layerdiff's harness of that engine is built from)"),
) -> None:
    """A failing layer as a bundle an engine maintainer runs without layerdiff (ncnn, MNN, LiteRT, ONNX Runtime, ggml), or --check one."""
    if check is not None:
        from layerdiff.collector.repro.check import check_bundle

        result = check_bundle(check, device, source_dir=source_dir)
        for line in result.lines():
            print(terminal_lines(f"repro: {line}"), file=sys.stderr)
        if not (result.reproduces and result.reference_bit_identical is not False):
            raise typer.Exit(1)
        return
    from layerdiff.collector.repro.bundle import report_failure, write_bundle

    if model is None or out is None:
        raise typer.BadParameter("writing a bundle needs --model and -o (or pass --check BUNDLE)")
    keys = list(layer or [])
    if from_report is not None:
        run, ref, flagged = report_failure(from_report, backend, precision)
        keys = keys or [flagged]
    if run is None or ref is None or not keys:
        raise typer.BadParameter("name --run, --ref and --layer, or --from-report REPORT_DIR")
    files = resolve_model(model, engine)
    for key in keys:
        target = out if len(keys) == 1 else out / re.sub(r"[^A-Za-z0-9_.-]+", "_", key)
        bundle = write_bundle(files, run, ref, key, target)
        error = bundle.recorded_error
        rel = "n/a (non-finite)" if error["rel_l2"] is None else f"{error['rel_l2']:.3g}"
        print(terminal_lines(f"repro: {bundle.layer} -> {bundle.directory} and {bundle.archive} (failing run: rel L2 "
                             f"{rel}, NaN {error['nan']}, Inf {error['pos_inf'] + error['neg_inf']})"), file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`_main`); a process whose HDF5 library met a failed write (a disk that
    filled under it) ends here without the library's exit clean-up, which would crash it."""
    try:
        _main(argv)
    except SystemExit as done:
        code = done.code
        exit_now_if_hdf5_failed(code if isinstance(code, int) else int(code is not None))
        raise


def _main(argv: list[str] | None) -> None:
    """Console entry point.

    Usage mistakes (unknown option, bad type, missing value, bad choice) are typer's own business:
    standalone mode prints the conventional "Usage: ... Error: ..." text and exits 2, whatever
    click typer ships with. What is left to us: a LayerdiffError (a user mistake in content: a
    file, a device, a model) becomes one line and its exit code; an OS error names its path.
    """
    try:
        app(args=argv, prog_name="collect", standalone_mode=True)
    except SystemExit as done:
        if done.code == EXIT_INTERRUPTED and not _SAID_INTERRUPTED:  # typer's own Ctrl-C exit says nothing
            print("collect: interrupted; runs already written are kept", file=sys.stderr)
        raise
    except LayerdiffError as err:
        print(terminal_lines(f"collect: {err}"), file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("collect: interrupted; runs already written are kept", file=sys.stderr)
        sys.exit(130)
    except OSError as err:
        print(terminal_lines(f"collect: {os_error_line(err)}"), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
