"""ncnn's half of a repro bundle's runner (copied into the bundle as engine_runner.py): the cut `.param`/`.bin`
run by the ncnn wheel with the configuration's Option flags. Needs only the ncnn wheel and numpy."""
import numpy as np


def mat_array(array):
    """ncnn blobs have no batch axis: drop the batch of 1 the recorded NCHW shape put back."""
    if array.ndim in (2, 4, 5) and array.shape[0] == 1:
        return array.reshape(array.shape[1:])
    return array


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


def run(ncnn, spec, config, here):
    if config["options"].get("use_vulkan_compute") and ncnn.get_gpu_count() == 0:
        return None, "no Vulkan device here (install a Vulkan driver, or run on the device the bundle names)"
    net = ncnn.Net()
    configure(net.opt, config)
    if net.load_param(str(here / spec["model"]["param"])) != 0:
        return None, "ncnn could not parse the .param"
    if net.load_model(str(here / spec["model"]["bin"])) != 0:
        return None, "ncnn could not load the .bin"
    ex = net.create_extractor()
    for item in spec["inputs"]:
        array = np.load(here / item["npy"]).astype(np.float32)
        ex.input(item["blob"], ncnn.Mat(np.ascontiguousarray(mat_array(array))).clone())
    outputs = {}
    for item in spec["outputs"]:
        status, mat = ex.extract(item["blob"])
        if status != 0:
            return None, f"extracting {item['blob']!r} failed (ncnn status {status})"
        outputs[item["blob"]] = np.array(mat, dtype=np.float32).reshape(item["shape"])
    return outputs, ""
