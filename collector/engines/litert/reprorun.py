"""LiteRT's half of a repro bundle's runner (copied into the bundle as engine_runner.py): the cut `.tflite` on the
CPU kernels or the GPU accelerator the run used. Needs only the ai-edge-litert wheel and numpy."""
import os
from pathlib import Path

import numpy as np


def run(litert, spec, config, here):
    """CPU: LiteRT's interpreter with the kernels the run used (builtin or XNNPACK); GPU: the compiled model
    on the GPU accelerator with CPU fallback, fp32 enforced at precision high, as layerdiff runs them."""
    path = str(here / spec["model"]["tflite"])
    arrays = {item["blob"]: np.load(here / item["npy"]) for item in spec["inputs"]}
    if config["backend"] == "gpu":
        return run_gpu(path, spec, config, arrays)
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


def run_gpu(path, spec, config, arrays):
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
