"""ONNX Runtime's half of a repro bundle's runner (copied into the bundle as engine_runner.py): the cut `.onnx` in an
InferenceSession. Needs only the onnxruntime wheel and numpy."""
import numpy as np


def run(ort, spec, config, here):
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
    session = ort.InferenceSession(str(here / spec["model"]["onnx"]), options, providers=providers)
    arrays = {item["blob"]: np.load(here / item["npy"]) for item in spec["inputs"]}
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}
    feeds = {i.name: np.asarray(arrays[i.name], dtype=types.get(i.type, np.float32)) for i in session.get_inputs()}
    names = [item["blob"] for item in spec["outputs"]]
    return dict(zip(names, session.run(names, feeds))), ""
