"""ncnn on the host (pip `ncnn`), speaking the harness command line: the `local` device's ncnn engine.

Every blob is extracted in layer order, so each `extract` runs exactly one more layer and its time
is that layer's time. Light mode is on: ncnn frees a blob once its one consumer ran (Split layers
give every other consumer its own copy), so the engine holds the live activations only, not the
whole dump; each blob is copied out before its consumer runs, so in-place layers change nothing.
On Vulkan, light mode frees only the GPU copy of a consumed blob: the host copy each `extract`
downloads stays in the extractor for its whole life (about the size of the dump). Once written out it
is dropped by feeding an empty Mat under the blob's name, which the consumer then never needs: it
reads the GPU copy, or downloads it again if it runs on the CPU.
Shapes are reported as NCHW with the batch of 1 ncnn drops, so they line up with MNN's and the
ONNX originals'.
"""
from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from layerdiff.driverlibs import mapped_vulkan_drivers
from layerdiff.vocabulary import host_abi
from layerdiff.collector.engines.harness_cli import (
    HARNESS_VERSION,
    reuse,
    EXIT_ARGS,
    EXIT_BACKEND,
    EXIT_MODEL,
    EXIT_RUN,
    DumpSink,
    HarnessArgs,
    HarnessExit,
    base_header,
    load_inject,
    split_key,
    harness_main,
    load_inputs,
    now_ms,
    repeat_dirs,
)
from layerdiff.collector.engines.ncnn.options import ncnn_cpu_has_fp16, ncnn_precision_flags
from layerdiff.collector.engines import plainrun

# What observing does differently here (plainrun.py; shown when the plain run disagrees).
OBSERVING = ("every blob is extracted in layer order, one layer at a time (light mode), and on Vulkan each blob's host "
             "copy is downloaded and dropped; the plain run extracts only the model's outputs, as an app does")

NO_VULKAN = (
    "no Vulkan device found; install a Vulkan driver (Debian: apt-get install mesa-vulkan-drivers "
    "for the lavapipe CPU implementation) or use --backend cpu"
)


def _ncnn():
    import ncnn  # imported lazily: `--version` and argument errors must not pay for Vulkan start-up

    return ncnn


def engine_version() -> str:
    return getattr(_ncnn(), "__version__", "unknown")


def _gpu_info(ncnn, fp16_features: bool = True) -> dict:
    """The Vulkan device; its fp16 features (a `vulkaninfo` process) only when asked: the probe of a
    sweep does not need them, only a Vulkan run deciding its effective precision does."""
    if ncnn.get_gpu_count() == 0:
        return {"ok": False, "reason": NO_VULKAN}
    info = ncnn.get_gpu_info(ncnn.get_default_gpu_index())
    return {"ok": True, "device": info.device_name(), **(vulkan_fp16_features() if fp16_features else {})}


def vulkan_driver(ncnn) -> dict:
    """The driver that computes, as Vulkan reports it (ncnn's GpuInfo) and as the process mapped it
    (the manifest-named library in /proc/self/maps, read after ncnn created its Vulkan device): a GPU
    name alone cannot tell two driver builds apart, nor a loader that picked another driver."""
    info = ncnn.get_gpu_info(ncnn.get_default_gpu_index())
    vendor, raw = int(info.vendor_id()), int(info.driver_version())
    return {"device_name": info.device_name(), "vendor_id": f"0x{vendor:04x}", "device_id": f"0x{int(info.device_id()):04x}",
            "driver_version": decode_driver_version(vendor, raw), "driver_version_raw": raw,
            "api_version": decode_driver_version(0, int(info.api_version())),
            "pipeline_cache_uuid": bytes(info.pipeline_cache_uuid()).hex(),
            "libraries": mapped_vulkan_drivers()}


def decode_driver_version(vendor_id: int, packed: int) -> str:
    """A Vulkan driver version as its vendor packs it: NVIDIA 10.8.8.6 bits, everyone else (and every
    API version) Vulkan's 10.10.12 major.minor.patch."""
    if vendor_id == 0x10DE:
        return f"{packed >> 22 & 0x3FF}.{packed >> 14 & 0xFF}.{packed >> 6 & 0xFF}.{packed & 0x3F}"
    return f"{packed >> 22 & 0x3FF}.{packed >> 12 & 0x3FF}.{packed & 0xFFF}"


@functools.lru_cache(maxsize=1)
def vulkan_fp16_features() -> dict:
    """fp16 storage/arithmetic support of the Vulkan device, read from `vulkaninfo`.

    pyncnn does not expose ncnn's GpuInfo fp16 flags, and ncnn silently ignores fp16 options a
    device lacks, so without this the effective precision of a Vulkan run would be a guess.
    """
    try:
        text = subprocess.run(["vulkaninfo"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    def flag(name: str) -> bool | None:
        match = re.search(rf"\b{name}\s*=\s*(true|false)", text)
        return None if match is None else match.group(1) == "true"
    return {"fp16_storage": flag("storageBuffer16BitAccess"), "fp16_arithmetic": flag("shaderFloat16")}


def _cpu_has_fp16(ncnn) -> bool:
    return bool(ncnn.cpu_support_arm_asimdhp())


def probe() -> dict:
    ncnn = _ncnn()
    backends = {
        "cpu": {"ok": True, "fp16": _cpu_has_fp16(ncnn), "bf16": True},
        "opencl": {"ok": False, "reason": "ncnn has no OpenCL backend"},
        "vulkan": _gpu_info(ncnn, fp16_features=False),
    }
    abi = host_abi()
    return {
        "harness": "layerdiff-local-ncnn",
        "version": HARNESS_VERSION,
        "abi": abi,
        "engines": {"ncnn": {"version": engine_version(), "backends": backends}},
    }


def configure(opt, args: HarnessArgs) -> None:
    """Set ncnn options for backend and precision (see README's precision table)."""
    opt.lightmode = True  # memory: live blobs only (see the module docstring)
    opt.num_threads = args.threads
    opt.use_vulkan_compute = args.backend == "vulkan"
    fp16 = args.backend == "vulkan" or ncnn_cpu_has_fp16(_ncnn())
    for flag, value in ncnn_precision_flags(args.precision, fp16=fp16).items():
        if hasattr(opt, flag):  # the wheels lack use_fp16_uniform; use_bf16_packed is newer than the aarch64 one
            setattr(opt, flag, value)


def effective_precision(opt, args: HarnessArgs, ncnn) -> str:
    """What the arithmetic really is: the net's options after load (ncnn drops what the Vulkan device
    lacks) against what ncnn says this CPU/GPU supports (its CPU kernels ignore fp16 without asimdhp)."""
    if args.backend == "vulkan":
        gpu = _gpu_info(ncnn)
        storage = opt.use_fp16_storage and gpu.get("fp16_storage")
        arith = opt.use_fp16_arithmetic and gpu.get("fp16_arithmetic")
        packed = opt.use_fp16_packed
        if arith:
            return "fp16-storage+arith" if storage else "fp16-arith"
        if storage:
            return "fp16-storage"
        if gpu.get("fp16_storage") is None and (opt.use_fp16_storage or opt.use_fp16_arithmetic):
            return "fp16-requested (device support unknown)"
        return "fp16-packed" if packed else "fp32"
    if _cpu_has_fp16(ncnn) and opt.use_fp16_storage:
        return "fp16-storage+arith" if opt.use_fp16_arithmetic else "fp16-storage"
    if opt.use_bf16_storage:
        return "bf16-storage"
    return "fp32"


def load_net(args: HarnessArgs, ncnn):
    if args.backend == "opencl":
        raise HarnessExit(EXIT_BACKEND, "ncnn has no OpenCL backend; use --backend cpu or vulkan")
    if args.backend == "vulkan" and ncnn.get_gpu_count() == 0:
        raise HarnessExit(EXIT_BACKEND, NO_VULKAN)
    param, weights = _model_pair(args.models)
    if unknown_layer_types(param, ncnn):
        # refused before loading: an ncnn that lacks a layer (an older wheel and pnnx's `Flip`) may only
        # print "layer Flip not exists or registered", load the rest, and crash (SIGSEGV) when it runs
        raise HarnessExit(EXIT_MODEL, param_refusal(param, ncnn))
    net = ncnn.Net()
    configure(net.opt, args)
    if net.load_param(str(param)) != 0:
        raise HarnessExit(EXIT_MODEL, param_refusal(param, ncnn))
    if net.load_model(str(weights)) != 0:
        raise HarnessExit(EXIT_MODEL, f"{weights}: ncnn could not load the weights (does it match {param.name}?)")
    return net, effective_precision(net.opt, args, ncnn)


def unknown_layer_types(param: Path, ncnn) -> list[str]:
    """Layer types the .param lists that this ncnn does not know (`layer_to_index` says -1), in file
    order: what pnnx leaves unconverted (`Tensor.slice`, `torch.where`, `Gather`, ...) shows here."""
    try:
        lines = param.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines[2:]:  # magic, then "layer_count blob_count"
        fields = line.split()
        if len(fields) < 2 or fields[0] in found:
            continue
        if ncnn.layer_to_index(fields[0]) < 0:
            found.append(fields[0])
    return found


def param_refusal(param: Path, ncnn) -> str:
    """Why ncnn refused a .param, in one line: the layer types it does not know, when that is the cause."""
    unknown = unknown_layer_types(param, ncnn)
    if not unknown:
        return f"{param}: ncnn could not parse this .param file"
    shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
    version = str(getattr(ncnn, "__version__", "") or "")
    return (f"{param}: ncnn does not know the layer type(s) {shown}{' (ncnn ' + version + ')' if version else ''}: the "
            "converter left them unconverted (pnnx keeps operators it cannot map to ncnn layers under their "
            "PyTorch names), or they are newer than this ncnn (use the ncnn the converter targets); rewrite the "
            "model around them or run it on an engine that implements them")


def _model_pair(models: list[Path]) -> tuple[Path, Path]:
    param = next((m for m in models if m.suffix == ".param"), None)
    if param is None:
        raise HarnessExit(EXIT_MODEL, f"ncnn needs a .param file; got {', '.join(map(str, models))}")
    weights = next((m for m in models if m.suffix == ".bin"), param.with_suffix(".bin"))
    if not weights.is_file():
        raise HarnessExit(EXIT_MODEL, f"{weights}: the .bin beside {param.name} is missing")
    return param, weights


# The graph's order of an unpacked blob by ncnn's dims, as the C++ harness names it (ncnn_engine.cpp
# blob_shape): ncnn has no batch axis; 1-D and 3-D/4-D blobs get the batch of 1 back.
BLOB_LAYOUTS = {1: "NC", 2: "HW", 3: "NCHW", 4: "NCDHW"}


def nchw_shape(mat_array: np.ndarray) -> tuple[int, ...]:
    """ncnn blobs have no batch axis; put the batch of 1 back (a 2-D h×w blob stays as it is)."""
    if mat_array.ndim in (1, 3, 4):
        return (1, *mat_array.shape)
    return tuple(mat_array.shape)


def feed(ex, net, inputs: dict[str, np.ndarray], ncnn) -> dict[str, object]:
    """Give the extractor every input as an ncnn Mat (no batch axis); returns the Mats fed, by name."""
    names = set(net.input_names())
    mats = {}
    for name, array in inputs.items():
        if name not in names:
            raise HarnessExit(EXIT_RUN, f"model has no input {name!r}; its inputs are {', '.join(sorted(names))}")
        data = array[0] if array.ndim in (2, 4, 5) and array.shape[0] == 1 else array
        # a copy ncnn owns: wrapping the numpy buffer, an in-place first layer (LayerNorm) in light mode
        # wrote into memory ncnn does not own and crashed (SIGSEGV, measured with a pnnx transformer)
        mats[name] = ncnn.Mat(np.ascontiguousarray(data, dtype=np.float32)).clone()
        ex.input(name, mats[name])
    return mats


def record_fed(sink: DumpSink, mats: dict[str, object], inputs: dict[str, np.ndarray]) -> None:
    """Each Mat handed to the extractor, read back (`input_fed`): in the given shape when its elements
    match (ncnn has no batch axis), its ncnn dims in the layout."""
    for name, mat in mats.items():
        array = np.array(mat, dtype=np.float32, copy=True)
        given = inputs[name]
        shaped = array.reshape(given.shape) if array.size == given.size else array.reshape(nchw_shape(array))
        sink.fed(name, shaped, f"{BLOB_LAYOUTS.get(mat.dims, 'flat')} (ncnn dims {mat.dims})")


def dump_layer(ex, layer, blobs, sink: DumpSink, memory: str, failure_hint: str, ncnn=None) -> float:
    """Extract every top of one layer (its bottoms are already in the extractor); returns ms spent.

    With `ncnn` given (a Vulkan run), the host copy of a GPU-computed top is dropped once written
    (see the module docstring); a CPU-fallback layer's tops live only on the host and are kept.
    """
    bottoms = [blobs[i].name for i in layer.bottoms]
    drop_host_copy = ncnn is not None and layer.support_vulkan and layer.type != "Input"
    spent = 0.0
    for index, top in enumerate(layer.tops):
        start = now_ms()
        status, mat = ex.extract(blobs[top].name, 0)
        elapsed = now_ms() - start
        spent += elapsed
        if status != 0:
            raise HarnessExit(EXIT_RUN, f"layer {layer.name!r} ({layer.type}) failed (ncnn status {status}); {failure_hint}")
        if not mat.empty() and (mat.elempack != 1 or mat.elemsize != 4):  # extract type 0 unpacks and converts; never dump packed bytes
            raise HarnessExit(EXIT_RUN, f"layer {layer.name!r} ({layer.type}): ncnn gave elempack {mat.elempack}, "
                                        f"elemsize {mat.elemsize} after unpacking")
        array = np.asarray(mat, dtype=np.float32)  # a view: written out before the next layer runs
        sink.add(op=layer.name, op_type=layer.type, array=array.reshape(nchw_shape(array)), output_index=index,
                 name=blobs[top].name, inputs=bottoms, layout=BLOB_LAYOUTS.get(mat.dims, "flat"), memory=memory,
                 time_ms=elapsed)
        del array, mat  # light mode frees the blob once its consumer ran; hold no reference to it
        if drop_host_copy:
            ex.input(blobs[top].name, ncnn.Mat())
    return spent


def run_once(net, args: HarnessArgs, inputs: dict[str, np.ndarray], sink: DumpSink, ncnn) -> float:
    """Extract every layer's tops in order; returns the total inference time in ms.

    With `--layers`, only the selected layers are extracted: a layer not dumped is not downloaded
    either, so `--layers` matching the output layers runs the model as an app does (what `collect
    bisect` relies on), and a dumped layer's time covers every layer run since the previous one."""
    blobs = net.blobs()
    ex = net.create_extractor()
    record_fed(sink, feed(ex, net, inputs, ncnn), inputs)
    memory = "device" if args.backend == "vulkan" else "host"
    hint = "check the input shape against the model"
    gpu = ncnn if args.backend == "vulkan" else None
    chosen = [layer for layer in net.layers() if args.layers is None or args.layers.search(layer.name)]
    return sum(dump_layer(ex, layer, blobs, sink, memory, hint, gpu) for layer in chosen)


def ncnn_dims(array: np.ndarray) -> np.ndarray:
    """Undo `nchw_shape`: drop the batch of 1 so a dumped tensor can be fed back as an ncnn blob."""
    if array.ndim in (2, 4, 5) and array.shape[0] == 1:
        return array.reshape(array.shape[1:])
    return array


def run_isolated(net, args: HarnessArgs, sink: DumpSink, ncnn) -> float:
    """Each target layer alone: its bottoms come from the reference, only its own kernel runs."""
    injected = load_inject(args.inject)
    layers = {layer.name: layer for layer in net.layers()}
    blobs = net.blobs()
    memory = "device" if args.backend == "vulkan" else "host"
    total = 0.0
    for key in args.targets:
        op, _ = split_key(key)
        layer = layers.get(op)
        if layer is None:
            raise HarnessExit(EXIT_ARGS, f"--target {key!r}: the model has no layer {op!r}")
        bottoms = [blobs[i].name for i in layer.bottoms]
        missing = [b for b in bottoms if b not in injected]
        if missing:
            raise HarnessExit(EXIT_ARGS, f"--target {key!r}: the inject dump lacks input tensor(s) {', '.join(missing)}")
        ex = net.create_extractor()
        for name in bottoms:
            ex.input(name, ncnn.Mat(np.ascontiguousarray(ncnn_dims(injected[name]), dtype=np.float32)).clone())
        total += dump_layer(ex, layer, blobs, sink, memory, "it failed in isolation")
    return total


def run(args: HarnessArgs) -> None:
    ncnn = _ncnn()
    inputs = load_inputs(args.inputs)
    net, precision = reuse(("ncnn", *map(str, args.models), args.backend, args.precision, args.threads),
                           lambda: load_net(args, ncnn))  # once per process for every --each input
    if args.replace:
        raise HarnessExit(EXIT_ARGS, "--replace is MNN's what-if; an ncnn layer is kept at high precision with "
                                     "its feature mask (param key 31) instead")
    if args.inject is not None:
        return isolate(net, args, precision, ncnn)
    if not inputs:
        raise HarnessExit(EXIT_RUN, f"no --input given; the model's inputs are {', '.join(net.input_names())}")
    header = base_header(args, engine_version(), inputs)
    header.update({
        "backends_actual": [args.backend],
        "precision_effective": precision,
        "options": {f: bool(getattr(net.opt, f)) for f in dir(net.opt) if f.startswith("use_")},
    })
    header["options"]["cpu_fp16_arithmetic"] = _cpu_has_fp16(ncnn)  # ncnn's own cpu_support_arm_asimdhp()
    gpu = _gpu_info(ncnn) if args.backend == "vulkan" else {}
    if gpu.get("device"):
        header["options"]["vulkan_device"] = gpu["device"]
        header["options"]["vulkan_driver"] = vulkan_driver(ncnn)
    outputs = list(net.output_names())
    for k, out in enumerate(repeat_dirs(args)):
        sink = DumpSink(args, out, {**header, "repeat": k}, total_ops=sum(len(layer.tops) for layer in net.layers()))
        sink.watch(outputs)
        infer_ms = run_once(net, args, inputs, sink, ncnn)
        check = plainrun.check(out, {**header, "repeat": k}, sink.observed,
                               lambda: run_plain(net, inputs, outputs, ncnn), OBSERVING, now_ms)
        sink.close(infer_ms, check)


def run_plain(net, inputs: dict[str, np.ndarray], outputs: list[str], ncnn) -> dict[str, np.ndarray]:
    """One run as an app runs it: a fresh extractor, the inputs fed, only the model's outputs extracted."""
    ex = net.create_extractor()
    feed(ex, net, inputs, ncnn)
    values = {}
    for name in outputs:
        status, mat = ex.extract(name, 0)
        if status != 0:
            raise HarnessExit(EXIT_RUN, f"ncnn failed to extract output {name!r} in a plain run (status {status})")
        array = np.array(mat, dtype=np.float32, copy=True)
        values[name] = array.reshape(nchw_shape(array))
    return values


def isolate(net, args: HarnessArgs, precision: str, ncnn) -> None:
    if not args.targets:
        raise HarnessExit(EXIT_ARGS, "--inject needs at least one --target KEY")
    header = base_header(args, engine_version(), {})
    header.update({"backends_actual": [args.backend], "precision_effective": precision,
                   "mode": "isolate", "targets": args.targets})
    sink = DumpSink(args, args.out, header, total_ops=len(args.targets))
    sink.close(run_isolated(net, args, sink, ncnn))


def main() -> int:
    return harness_main("ncnn", run, probe, engine_version)


if __name__ == "__main__":
    sys.exit(main())
