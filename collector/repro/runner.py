"""Re-run one layer cut out of a model, as the failing and the reference configuration ran it.

Needs only the engine's wheel (pip install ncnn, MNN, ai-edge-litert or onnxruntime) and numpy. Reads repro.json
beside it: the cut model, the reference's input and output tensors, and each configuration's options. Prints, per
configuration, the output against the reference output (rel L2, max abs, NaN/Inf counts) and whether
the failure reproduces; `--json` prints the same as one JSON document.

    python run_repro.py            # both configurations
    python run_repro.py --config run --json
"""
import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def ncnn_dims(array):
    """ncnn blobs have no batch axis: drop the batch of 1 the recorded NCHW shape put back."""
    if array.ndim in (2, 4, 5) and array.shape[0] == 1:
        return array.reshape(array.shape[1:])
    return array


def engine_version(engine):
    """ncnn has `__version__`; MNN has `version()`."""
    version = getattr(engine, "__version__", None)
    if version is None and callable(getattr(engine, "version", None)):
        version = engine.version()
    return str(version or "unknown")


def gpu_info(ncnn):
    """The Vulkan device ncnn uses: name, vendor/device ids, driver and API version (empty without one)."""
    if ncnn.get_gpu_count() == 0:
        return {}
    info = ncnn.get_gpu_info(ncnn.get_default_gpu_index())
    api = info.api_version()
    return {"device": info.device_name(), "vendor_id": hex(info.vendor_id()), "device_id": hex(info.device_id()),
            "driver_version": info.driver_version(), "api_version": f"{api >> 22}.{(api >> 12) & 0x3FF}.{api & 0xFFF}"}


def configure(opt, config):
    opt.lightmode = True
    opt.num_threads = int(config.get("threads", 1))
    for flag, value in config["options"].items():
        if flag.startswith("use_") and hasattr(opt, flag):
            setattr(opt, flag, bool(value))


# engine name in repro.json -> the module its wheel installs
MODULES = {"ncnn": "ncnn", "mnn": "MNN", "litert": "ai_edge_litert", "onnxruntime": "onnxruntime"}


def run_config(engine, spec, config):
    """The cut model's outputs under one configuration, or the reason it could not run here."""
    runs = {"mnn": run_mnn, "ncnn": run_ncnn, "litert": run_litert, "onnxruntime": run_onnxruntime}
    return runs[spec["engine"]](engine, spec, config)


def input_arrays(spec):
    """The reference's input tensors, by the name the cut model gives them."""
    return {item["blob"]: np.load(HERE / item["npy"]) for item in spec["inputs"]}


def run_litert(litert, spec, config):
    """CPU: LiteRT's interpreter with the kernels the run used (builtin or XNNPACK); GPU: the compiled model
    on the GPU accelerator with CPU fallback, fp32 enforced at precision high, as layerdiff runs them."""
    path = str(HERE / spec["model"]["tflite"])
    arrays = input_arrays(spec)
    if config["backend"] == "gpu":
        return run_litert_gpu(path, spec, config, arrays)
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kernels = config["options"].get("kernels") or ("builtin" if config["precision"] == "high" else "xnnpack")
    resolver = OpResolverType.BUILTIN if kernels == "xnnpack" else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    interpreter = Interpreter(model_path=path, num_threads=int(config.get("threads", 1)),
                              experimental_op_resolver_type=resolver)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], np.asarray(arrays[detail["name"]], dtype=detail["dtype"]))
    interpreter.invoke()
    by_name = {d["name"]: d["index"] for d in interpreter.get_output_details()}
    return {item["blob"]: np.array(interpreter.get_tensor(by_name[item["blob"]]), copy=True)
            for item in spec["outputs"]}, ""


def run_litert_gpu(path, spec, config, arrays):
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import CpuOptions, GpuOptions, Options

    icd = config["options"].get("vulkan_icd")
    if icd and not os.environ.get("VK_ICD_FILENAMES") and Path(icd).is_file():
        os.environ["VK_ICD_FILENAMES"] = icd  # the Vulkan driver the failing run used, when the computer running the bundle has that file
    options = Options(hardware_accelerators=HardwareAccelerator.GPU | HardwareAccelerator.CPU,
                      cpu_options=CpuOptions(num_threads=int(config.get("threads", 1))),
                      gpu_options=GpuOptions(enforce_f32=bool(config["options"].get("enforce_f32",
                                                                                    config["precision"] == "high"))))
    try:
        model = CompiledModel.from_buffer(Path(path).read_bytes(), options=options)
    except (RuntimeError, ValueError) as err:
        return None, f"LiteRT's GPU accelerator could not compile the model ({str(err).strip().splitlines()[0]})"
    key = model.get_signature_by_index(0)["key"]
    in_details, out_details = model.get_input_tensor_details(key), model.get_output_tensor_details(key)
    inputs, outputs = model.create_input_buffers(0), model.create_output_buffers(0)
    for buffer, name in zip(inputs, model.get_signature_by_index(0)["inputs"]):
        buffer.write(np.asarray(arrays[name], dtype=in_details[name]["dtype"]).reshape(-1))
    model.run_by_index(0, inputs, outputs)
    out = {}
    for buffer, name in zip(outputs, model.get_signature_by_index(0)["outputs"]):
        detail = out_details[name]
        count = int(np.prod(detail["shape"], dtype=np.int64))
        out[name] = np.asarray(buffer.read(count, np.dtype(detail["dtype"]))).reshape(detail["shape"])
    return out, ""


def run_onnxruntime(ort, spec, config):
    """The cut ONNX graph in an InferenceSession with the run's providers, optimisation level and threads."""
    options = ort.SessionOptions()
    level = config["options"].get("graph_optimization_level", "ORT_DISABLE_ALL")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.intra_op_num_threads = int(config.get("threads", 1))
    options.inter_op_num_threads = 1
    providers = config["options"].get("providers") or ["CPUExecutionProvider"]
    missing = [p for p in providers if p not in ort.get_available_providers()]
    if missing:
        return None, f"this onnxruntime has no {', '.join(missing)}"
    session = ort.InferenceSession(str(HERE / spec["model"]["onnx"]), options, providers=providers)
    arrays = input_arrays(spec)
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
    feeds = {i.name: np.asarray(arrays[i.name], dtype=types.get(i.type, np.float32)) for i in session.get_inputs()}
    names = [item["blob"] for item in spec["outputs"]]
    return dict(zip(names, session.run(names, feeds))), ""


def run_mnn(MNN, spec, config):
    interpreter = MNN.Interpreter(str(HERE / spec["model"]["mnn"]))
    session = interpreter.createSession({"backend": config["backend"].upper(), "precision": config["precision"],
                                         "numThread": int(config.get("threads", 1))})
    if session is None:
        return None, "MNN could not create a session"
    arrays = {item["blob"]: np.load(HERE / item["npy"]).astype(np.float32) for item in spec["inputs"]}
    for name, array in arrays.items():
        interpreter.resizeTensor(interpreter.getSessionInput(session, name), tuple(array.shape))
    interpreter.resizeSession(session)
    for name, array in arrays.items():
        host = MNN.Tensor(tuple(array.shape), MNN.Halide_Type_Float, np.ascontiguousarray(array),
                          MNN.Tensor_DimensionType_Caffe)
        interpreter.getSessionInput(session, name).copyFrom(host)
    interpreter.runSession(session)
    outputs = {}
    for item in spec["outputs"]:
        tensor = interpreter.getSessionOutput(session, item["blob"])
        host = MNN.Tensor(tuple(item["shape"]), MNN.Halide_Type_Float, MNN.Tensor_DimensionType_Caffe)
        tensor.copyToHostTensor(host)
        outputs[item["blob"]] = np.array(host.getNumpyData(), dtype=np.float32, copy=True).reshape(item["shape"])
    return outputs, ""


def run_ncnn(ncnn, spec, config):
    if config["options"].get("use_vulkan_compute") and ncnn.get_gpu_count() == 0:
        return None, "no Vulkan device here (install a Vulkan driver, or run on the device the bundle names)"
    net = ncnn.Net()
    configure(net.opt, config)
    if net.load_param(str(HERE / spec["model"]["param"])) != 0:
        return None, "ncnn could not parse the .param"
    if net.load_model(str(HERE / spec["model"]["bin"])) != 0:
        return None, "ncnn could not load the .bin"
    ex = net.create_extractor()
    for item in spec["inputs"]:
        array = np.load(HERE / item["npy"]).astype(np.float32)
        ex.input(item["blob"], ncnn.Mat(np.ascontiguousarray(ncnn_dims(array))).clone())
    outputs = {}
    for item in spec["outputs"]:
        status, mat = ex.extract(item["blob"])
        if status != 0:
            return None, f"extracting {item['blob']!r} failed (ncnn status {status})"
        outputs[item["blob"]] = np.array(mat, dtype=np.float32).reshape(item["shape"])
    return outputs, ""


def measure(out, ref):
    """How far `out` is from `ref` (float64), with the non-finite values counted."""
    out, ref = np.asarray(out), np.asarray(ref)
    same = out.shape == ref.shape and out.dtype == ref.dtype and out.tobytes() == ref.tobytes()
    a, b = out.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    both = np.isfinite(a) & np.isfinite(b)
    norm = float(np.linalg.norm(b[both])) if both.any() else 0.0
    diff = a[both] - b[both]
    finite_ok = bool(np.isfinite(a).all())
    return {
        "rel_l2": (float(np.linalg.norm(diff)) / norm if norm else float(np.linalg.norm(diff))) if finite_ok else None,
        "max_abs": float(np.abs(diff).max()) if diff.size and finite_ok else None,
        "nan": int(np.isnan(a).sum()),
        "pos_inf": int(np.isposinf(a).sum()),
        "neg_inf": int(np.isneginf(a).sum()),
        "bit_identical": bool(same),
    }


def reproduces(error, recorded):
    """The failure is there again: non-finite values if the failing run had them, else at least half its error."""
    if recorded["nan"] + recorded["pos_inf"] + recorded["neg_inf"]:
        return error["nan"] + error["pos_inf"] + error["neg_inf"] > 0
    if error["rel_l2"] is None:
        return True
    return error["rel_l2"] >= 0.5 * (recorded["rel_l2"] or 0.0) and error["rel_l2"] > 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="Re-run the cut-out layer and compare it with the reference.")
    parser.add_argument("--config", choices=("run", "reference", "both"), default="both")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--save", metavar="DIR", help="also write each configuration's outputs as .npy into DIR")
    args = parser.parse_args(argv)
    json_out = None
    if args.json:  # engines print to fd 1 from C (MNN: "MNN use low precision"): keep stdout for the JSON alone
        sys.stdout.flush()
        json_out = os.dup(1)
        os.dup2(2, 1)
    spec = json.loads((HERE / "repro.json").read_text())
    engine = __import__(MODULES[spec["engine"]])
    names = ("run", "reference") if args.config == "both" else (args.config,)
    result = {"engine": spec["engine"], "engine_version": engine_version(engine),
              "platform": platform.platform(), "gpu": gpu_info(engine) if spec["engine"] == "ncnn" else {},
              "layer": spec["layer"], "configs": {}}
    for name in names:
        config = spec["configs"][name]
        outputs, reason = run_config(engine, spec, config)
        entry = {"backend": config["backend"], "precision": config["precision"], "ran": outputs is not None,
                 "reason": reason, "outputs": {}}
        for item in spec["outputs"] if outputs is not None else ():
            ref = np.load(HERE / item["reference_npy"])
            error = measure(outputs[item["blob"]], ref)
            if name == "run":
                error["reproduces"] = reproduces(error, item["recorded_error"])
            entry["outputs"][item["blob"]] = error
            if args.save:
                Path(args.save, name).mkdir(parents=True, exist_ok=True)
                np.save(Path(args.save, name, item["npy_name"]), outputs[item["blob"]])
        result["configs"][name] = entry
    if json_out is not None:
        sys.stdout.flush()
        with os.fdopen(json_out, "w") as out:
            out.write(json.dumps(result, indent=2) + "\n")
    else:
        print_text(result, spec)
    return 0


def print_text(result, spec):
    gpu = result["gpu"]
    gpu_text = (f"{gpu['device']} (vendor {gpu['vendor_id']}, device {gpu['device_id']}, driver {gpu['driver_version']}, "
                f"Vulkan {gpu['api_version']})" if gpu else "none")
    print(f"layer {result['layer']}  {result['engine']} {result['engine_version']}  {result['platform']}  GPU: {gpu_text}")
    for name, entry in result["configs"].items():
        head = f"{name:9s} {entry['backend']}/{entry['precision']}"
        if not entry["ran"]:
            print(f"{head}: not run: {entry['reason']}")
            continue
        for blob, e in entry["outputs"].items():
            rel = "n/a" if e["rel_l2"] is None else f"{e['rel_l2']:.3e}"
            peak = "n/a" if e["max_abs"] is None else f"{e['max_abs']:.3e}"
            line = (f"{head} {blob}: rel L2 {rel}, max abs {peak}, NaN {e['nan']}, +Inf {e['pos_inf']}, "
                    f"-Inf {e['neg_inf']}, bit-identical to reference: {'yes' if e['bit_identical'] else 'no'}")
            if "reproduces" in e:
                line += f"  => {'REPRODUCES' if e['reproduces'] else 'does not reproduce'}"
            print(line)
    recorded = spec["outputs"][0]["recorded_error"]
    rel = "n/a" if recorded["rel_l2"] is None else f"{recorded['rel_l2']:.3e}"
    peak = "n/a" if recorded["max_abs"] is None else f"{recorded['max_abs']:.3e}"
    print(f"recorded in the failing run: rel L2 {rel}, max abs {peak}, "
          f"NaN {recorded['nan']}, +Inf {recorded['pos_inf']}, -Inf {recorded['neg_inf']}")


if __name__ == "__main__":
    sys.exit(main())
