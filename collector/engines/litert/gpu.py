"""LiteRT's GPU accelerator on the host: WebGPU (Dawn) over Vulkan, every activation made observable.

The `ai-edge-litert` wheel's only GPU accelerator on Linux is `libLiteRtWebGpuAccelerator.so`; it
needs a Vulkan driver Dawn accepts. Lavapipe (Mesa 22.3) is refused; SwiftShader, the Vulkan ICD
in Debian's `chromium-common`, runs it. The engine selects it with `VK_ICD_FILENAMES` unless the
user set that variable (to use another driver). The accelerator computes fp16 unless `enforce_f32`
(precision high) where the device offers WebGPU's shader-f16; the engine reads that from the driver
(`vulkaninfo`: `shaderFloat16`, `storageBuffer16BitAccess`) and records it as the run's effective
precision. SwiftShader has neither: every precision runs fp32 there, and the dump says so.

Observing activations: the accelerator only hands back model outputs, so the model is rewritten
with every activation appended to its outputs (graph.with_outputs). Each output buffer is filled
with a sentinel before a run (collector/engines/unwritten.py, shared by every engine); a tensor whose
buffer still holds the sentinel after two runs with two different sentinels was never written (the GPU
fused it into the next op, e.g. a PAD), and is listed in the header as `not_observable` (state
`never_written`, evidence `sentinel`), never dumped as values.

Placement: the accelerator prints which operator types it rejects and how many operators run on
the GPU and on the CPU; that log (captured from the native stderr, then passed on) is parsed into
the header's `placement`. `backends_actual` is ["gpu", "cpu"] when the graph is split.

The model as an app runs it (no activation made an output) is compiled too and run beside the observed
graph (collector/engines/plainrun.py): making every activation observable changes how the accelerator
partitions and fuses the graph, so the dumped values are trusted only as far as its outputs agree.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from layerdiff.collector.engines import unwritten
from layerdiff.collector.engines.harness_cli import EXIT_BACKEND, EXIT_RUN, HarnessExit, now_ms
from layerdiff.collector.engines.litert.graph import Graph, with_outputs
from layerdiff.collector.engines.litert.placement import per_op

SWIFTSHADER_ICDS = ("/usr/lib/chromium/vk_swiftshader_icd.json", "/usr/lib/chromium-browser/vk_swiftshader_icd.json",
                    "/usr/lib64/chromium-browser/vk_swiftshader_icd.json")
ACCELERATOR = "libLiteRtWebGpuAccelerator.so"
SPLIT_LINE = re.compile(r"(\d+) operations will run on the GPU, and the remaining (\d+) operations will run on the CPU")
ADAPTER_LINE = re.compile(r"Selected adapter: ([^\n]*)")


def vulkan_icd() -> tuple[str | None, str]:
    """The Vulkan driver the WebGPU accelerator is given, and where that choice came from."""
    if os.environ.get("VK_ICD_FILENAMES"):
        return os.environ["VK_ICD_FILENAMES"], "VK_ICD_FILENAMES set by the user"
    for path in SWIFTSHADER_ICDS:
        if Path(path).is_file():
            return path, "SwiftShader (chromium-common), selected by layerdiff"
    return None, ""


def accelerator_path() -> Path:
    import ai_edge_litert

    return Path(ai_edge_litert.__file__).parent / ACCELERATOR


def availability() -> dict:
    """The probe's answer for `gpu`: ok when the wheel has the accelerator and a Vulkan driver is chosen."""
    if not accelerator_path().is_file():
        return {"ok": False, "reason": f"this ai-edge-litert wheel has no {ACCELERATOR}"}
    icd, why = vulkan_icd()
    if icd is None:
        return {"ok": False, "reason": "no Vulkan driver for WebGPU: install chromium-common (SwiftShader, "
                                       "device_scripts/setup_host.sh) or set VK_ICD_FILENAMES"}
    return {"ok": True, "api": "WebGPU over Vulkan", "vulkan_icd": icd, "why": why}


@dataclass
class Placement:
    """What the accelerator said about where the operators run."""

    adapter: str = ""
    gpu_ops: int | None = None
    cpu_ops: int | None = None
    rejected: list[dict] = field(default_factory=list)  # [{op_type, reason}]
    fully_accelerated: bool | None = None

    def split(self) -> bool:
        return self.fully_accelerated is False or bool(self.cpu_ops)

    def cpu_op_indices(self, graph: Graph) -> set[int]:
        """The operators the CPU ran (empty when the graph is whole on the GPU or no per-op list holds)."""
        if not self.split():
            return set()
        derived = per_op(graph, {r["op_type"] for r in self.rejected}, self.gpu_ops, self.cpu_ops)
        return set(derived.get("cpu", []))

    def as_dict(self, graph: Graph) -> dict:
        return {"adapter": self.adapter, "gpu_ops": self.gpu_ops, "cpu_ops": self.cpu_ops, "ops": len(graph.ops),
                "weight_ops": len(graph.ops) - len(graph.computing_ops()), "rejected": self.rejected,
                "fully_accelerated": self.fully_accelerated, "split": self.split(), "per_op": self._per_op(graph)}

    def _per_op(self, graph: Graph) -> dict:
        """Every CPU operator by name (derived from TFLite's partition rule and checked against the counts)."""
        if not self.split():
            return {"derived": True, "cpu": [], "rule": "fully accelerated: every operator on the GPU"}
        derived = per_op(graph, {r["op_type"] for r in self.rejected}, self.gpu_ops, self.cpu_ops)
        if derived.get("derived"):
            computing = {op.index for op in graph.computing_ops()}
            derived["cpu"] = [{"index": i, "name": graph.name(graph.ops[i].outputs[0]) if graph.ops[i].outputs else "",
                               "op_type": graph.ops[i].op_type, "weight": i not in computing} for i in derived["cpu"]]
        return derived


def parse_log(text: str) -> Placement:
    """The accelerator's own words: the adapter, rejected operator types with reasons, the op counts."""
    placement = Placement()
    adapter = ADAPTER_LINE.search(text)
    placement.adapter = adapter.group(1).strip() if adapter else ""
    split = SPLIT_LINE.search(text)
    if split:
        placement.gpu_ops, placement.cpu_ops = int(split.group(1)), int(split.group(2))
    listing = text.partition("operations are not supported by GPU delegate:")[2]
    reasons: dict[str, list[str]] = {}
    for line in listing.splitlines()[1:]:
        if SPLIT_LINE.search(line) or not re.match(r"^[A-Z0-9_]+:", line):
            break
        op_type, _, reason = line.partition(":")
        found = reasons.setdefault(op_type.strip(), [])
        if reason.strip() and reason.strip() not in found:
            found.append(reason.strip())
    placement.rejected = [{"op_type": op, "reason": "; ".join(why) or "rejected"} for op, why in reasons.items()]
    return placement


@contextlib.contextmanager
def native_stderr(sink: list[str]) -> Iterator[None]:
    """Capture what native code writes to fd 2 (the accelerator's log), then pass it on unchanged."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read()
            os.write(2, data)
            sink.append(data.decode("utf-8", "replace"))


@functools.lru_cache(maxsize=4)
def device_fp16(icd: str | None) -> dict:
    """The Vulkan device's 16-bit features as its driver reports them (`vulkaninfo` under the driver the
    accelerator is given): WebGPU exposes `shader-f16`, which the accelerator needs to compute in fp16, only
    on a device with both `shaderFloat16` and `storageBuffer16BitAccess`. {} when vulkaninfo cannot answer."""
    env = {**os.environ, **({"VK_ICD_FILENAMES": icd} if icd else {})}
    try:
        text = subprocess.run(["vulkaninfo"], capture_output=True, text=True, timeout=30, check=False, env=env).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    flags = {}
    for name in ("shaderFloat16", "storageBuffer16BitAccess"):
        match = re.search(rf"\b{name}\s*=\s*(true|false)", text)
        if match:
            flags[name] = match.group(1) == "true"
    device = re.search(r"deviceName\s*=\s*([^\n]*)", text)
    return {**flags, "device": device.group(1).strip() if device else "", "source": "vulkaninfo"} if flags else {}


def effective_precision(features: dict, enforce_f32: bool) -> tuple[str, str]:
    """(precision_effective, why), from the facts: `enforce_f32` (precision high) makes the accelerator compute
    fp32; otherwise it computes fp16 exactly when the device offers WebGPU's shader-f16 (`device_fp16`)."""
    device = features.get("device") or "the Vulkan device"
    has_fp16 = bool(features.get("shaderFloat16") and features.get("storageBuffer16BitAccess"))
    if features and not has_fp16:
        return "fp32", (f"{device} has no fp16 (shaderFloat16 = {str(features.get('shaderFloat16')).lower()}, "
                        f"storageBuffer16BitAccess = {str(features.get('storageBuffer16BitAccess')).lower()}): "
                        "fp32 at every precision")
    if enforce_f32:
        return "fp32", "enforce_f32 set (precision high): the accelerator computes fp32"
    if not features:
        return "fp16", ("fp16 allowed (precision normal/low); the device's 16-bit features could not be read "
                        "(vulkaninfo), so fp16 is assumed")
    return "fp16", (f"fp16 allowed (precision normal/low) and {device} has shaderFloat16 and "
                    "storageBuffer16BitAccess (WebGPU shader-f16): activations computed in fp16")


def compile_model(data: bytes, precision: str, threads: int, log: list[str]):
    """The rewritten model compiled for GPU with CPU fallback; high precision enforces fp32."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import CpuOptions, GpuOptions, Options

    options = Options(hardware_accelerators=HardwareAccelerator.GPU | HardwareAccelerator.CPU,
                      cpu_options=CpuOptions(num_threads=threads), gpu_options=GpuOptions(enforce_f32=precision == "high"))
    try:
        with native_stderr(log):
            return CompiledModel.from_buffer(data, options=options)
    except (RuntimeError, ValueError) as err:
        text = "".join(log)
        if "No adapters found" in text or "Failed to initialize WebGPU environment" in text:
            needs = re.search(r"Warning: (Vulkan [^\n]*required)", text)
            raise HarnessExit(EXIT_BACKEND, f"WebGPU found no GPU adapter on the Vulkan driver {vulkan_icd()[0] or '(system default)'}"
                                            f"{' (' + needs.group(1) + ')' if needs else ''}; use SwiftShader "
                                            "(chromium-common) or point VK_ICD_FILENAMES at another driver") from None
        raise HarnessExit(EXIT_BACKEND, f"LiteRT's GPU accelerator cannot compile the model ({refusal(err, text)})") from None


LOCATION_LINE = re.compile(r"^ERROR: \[[^\]]*\]$")  # `ERROR: [./litert/cc/litert_compiled_model.h:1961]`: where, not why
REFUSAL_LIMIT = 600


def refusal(err: BaseException, log: str) -> str:
    """Why LiteRT refused, in one line: the exception's own lines (`Failed to modify graph with
    delegate`) and the ERROR lines its log gave for it (`Encountered unresolved custom op: X`,
    `... dynamic-sized tensors`), source locations and repeats dropped; the first line alone is
    usually a source location."""
    reasons: list[str] = []
    error_lines = [ln for ln in log.splitlines() if ln.startswith("ERROR: ") and "Could not load shared library" not in ln
                   and "compiler_plugin" not in ln]
    for line in str(err).splitlines() + error_lines:
        text = line.strip().lstrip("└").strip()
        if not text or LOCATION_LINE.match(text):
            continue
        text = text.removeprefix("ERROR: ").rstrip(".")
        if text not in reasons:
            reasons.append(text)
    joined = "; ".join(reasons) or _first(err)
    return joined if len(joined) <= REFUSAL_LIMIT else joined[: REFUSAL_LIMIT - 3] + "..."


def _first(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(err).__name__


class GpuRunner:
    """One compiled model with its buffers: feed once, run with a sentinel fill, read every output.

    Outputs and inputs are matched by tensor index (the signature's details carry it), so a model
    whose signature gives its tensors other names (aliases) is read and fed like one without."""

    def __init__(self, model, graph: Graph, inputs: dict[str, np.ndarray]) -> None:
        self.model = model
        signature = model.get_signature_by_index(0)
        self.key = signature["key"]
        self.output_names = list(signature["outputs"])
        self.details = model.get_output_tensor_details(self.key)
        in_details = model.get_input_tensor_details(self.key)
        input_names = list(signature["inputs"])
        by_tensor = {name: graph.name(int(in_details[name]["index"])) for name in input_names}
        given = {alias: inputs.get(alias, inputs.get(by_tensor[alias])) for alias in input_names}
        missing = [by_tensor[a] for a, v in given.items() if v is None]
        known = set(input_names) | set(by_tensor.values())
        unknown = [n for n in inputs if n not in known]
        if unknown or missing:
            raise HarnessExit(EXIT_RUN, f"model inputs are {', '.join(by_tensor.values())}; "
                                        f"{'no --input for ' + ', '.join(missing) if missing else 'no input ' + unknown[0]}")
        self.inputs = model.create_input_buffers(0)
        for buffer, alias in zip(self.inputs, input_names):
            buffer.write(np.asarray(given[alias], dtype=in_details[alias]["dtype"]).reshape(-1))
        self.outputs = model.create_output_buffers(0)
        self.fed_inputs = [(by_tensor[alias], in_details[alias]) for alias in input_names]

    def read_inputs(self) -> list[tuple[str, np.ndarray]]:
        """Each input read back from the accelerator's own input buffer after writing it (`input_fed`)."""
        out = []
        for buffer, (name, detail) in zip(self.inputs, self.fed_inputs):
            shape = [int(d) for d in detail["shape"]]
            count = int(np.prod(shape, dtype=np.int64))
            out.append((name, np.asarray(buffer.read(count, np.dtype(detail["dtype"]))).reshape(shape)))
        return out

    def run(self, fill_index: int, log: list[str]) -> tuple[dict[int, np.ndarray], float]:
        """Every output's values by tensor index, and the run's time in ms."""
        for buffer, name in zip(self.outputs, self.output_names):
            detail = self.details[name]
            buffer.write(unwritten.fill(detail["dtype"], [int(d) for d in detail["shape"]], fill_index).reshape(-1))
        begin = now_ms()
        try:
            with native_stderr(log):
                self.model.run_by_index(0, self.inputs, self.outputs)
        except RuntimeError as err:
            raise HarnessExit(EXIT_RUN, f"LiteRT's GPU accelerator failed to run the model ({refusal(err, ''.join(log))})") from None
        elapsed = now_ms() - begin
        values = {}
        for buffer, name in zip(self.outputs, self.output_names):
            detail = self.details[name]
            count = int(np.prod(detail["shape"], dtype=np.int64))
            array = np.asarray(buffer.read(count, np.dtype(detail["dtype"]))).reshape(detail["shape"])
            values[int(detail["index"])] = array
        return values, elapsed


def prepare(data: bytes, graph: Graph, precision: str, threads: int, inputs: dict[str, np.ndarray]):
    """(runner, placement, indices of the tensors never written, log text, tensors whose values differ
    between the two calibration runs) after two calibration runs."""
    log: list[str] = []
    model = compile_model(with_outputs(data, graph.activations()), precision, threads, log)
    placement = parse_log("".join(log))
    placement.fully_accelerated = bool(model.is_fully_accelerated())
    if not placement.adapter:
        raise HarnessExit(EXIT_BACKEND, "LiteRT's WebGPU accelerator found no GPU adapter (Vulkan driver "
                                        f"{vulkan_icd()[0] or 'none'}); use SwiftShader (chromium-common) or set VK_ICD_FILENAMES")
    runner = GpuRunner(model, graph, inputs)
    first, _ = runner.run(1, log)
    second, _ = runner.run(0, log)
    never = unwritten.never_written(first, second)
    return runner, placement, never, "".join(log), run_to_run(first, second, never)


def run_to_run(first: dict[int, np.ndarray], second: dict[int, np.ndarray], never: set[int]) -> dict[int, dict]:
    """Tensors whose values differ between the two calibration runs of the same input (tensor index ->
    {n_differing, max_abs}): the accelerator is not reproducible there. Elements either run left at its
    sentinel (never written) are no evidence; NaN equals NaN."""
    out = {}
    for t, a in first.items():
        b = second.get(t)
        if t in never or b is None or a.shape != b.shape or a.dtype.kind not in "fiu":
            continue
        written = ~(unwritten.is_fill(a, 1) | unwritten.is_fill(b, 0))
        x, y = a[written], b[written]
        same = (x == y) | (np.isnan(x) & np.isnan(y)) if a.dtype.kind == "f" else x == y
        if not bool(np.all(same)):
            diff = np.abs(x.astype(np.float64) - y.astype(np.float64))[~same]
            finite = diff[np.isfinite(diff)]
            out[t] = {"n_differing": int((~same).sum()), "max_abs": float(finite.max()) if finite.size else float("inf")}
    return out
