"""MNN's half of a repro bundle's runner (copied into the bundle as engine_runner.py): the cut `.mnn` in a session
with the configuration's backend, precision and threads. Needs only the MNN wheel and numpy."""
import numpy as np


def run(MNN, spec, config, here):
    interpreter = MNN.Interpreter(str(here / spec["model"]["mnn"]))
    session = interpreter.createSession({"backend": config["backend"].upper(), "precision": config["precision"],
                                         "numThread": int(config.get("threads", 1))})
    if session is None:
        return None, "MNN could not create a session"
    arrays = {item["blob"]: np.load(here / item["npy"]).astype(np.float32) for item in spec["inputs"]}
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
