"""ncnn's part of `collect repro` (collector/engines/reprorecipe.py): layers cut out of the `.param`/`.bin`, run by
the ncnn wheel (`reprorun.py`) and by a C++ file against ncnn's headers for phones (`repro.cpp.in`)."""
from __future__ import annotations

import json
from pathlib import Path

from layerdiff.collector.engines.ncnn.options import ncnn_precision_flags
from layerdiff.collector.engines.reprorecipe import CutPiece, ReproRecipe

MODEL_STEM = "repro"
CPP_TEMPLATE = Path(__file__).with_name("repro.cpp.in")
CMAKE_LISTS = """cmake_minimum_required(VERSION 3.10)
project(ncnn_repro CXX)
# -Dncnn_DIR=<ncnn install or release>/lib/cmake/ncnn (Android release: <abi>/lib/cmake/ncnn)
find_package(ncnn REQUIRED)
add_executable(repro repro.cpp)
target_link_libraries(repro ncnn)
"""
CPP_README = """
## C++ (phones)

`repro.cpp` does the same against ncnn's C++ API, with the options written in:

```
cmake -S . -B build -Dncnn_DIR=<ncnn>/lib/cmake/ncnn && cmake --build build
./build/repro run && ./build/repro reference
```

For a phone add `-DCMAKE_TOOLCHAIN_FILE=$ANDROID_NDK/build/cmake/android.toolchain.cmake -DANDROID_ABI=arm64-v8a
-DANDROID_PLATFORM=android-24` with ncnn's Android release as `ncnn_DIR`, `adb push` this folder and the binary,
and run it from inside the folder.
"""
# ncnn::Option fields the C++ file may set (src/option.h of ncnn 1.0.20261020); others stay ncnn's defaults.
CPP_OPTION_FIELDS = frozenset("""use_winograd_convolution use_sgemm_convolution use_int8_inference use_vulkan_compute
use_bf16_storage use_fp16_packed use_fp16_storage use_fp16_arithmetic use_int8_packed use_int8_storage
use_int8_arithmetic use_packing_layout use_subgroup_ops use_tensor_storage use_winograd23_convolution
use_winograd43_convolution use_winograd63_convolution use_bf16_packed use_fp16_uniform""".split())


def cut_piece(files: list[Path], first: str, last: str, shapes: dict, scratch: Path) -> CutPiece:
    from layerdiff.collector.engines.ncnn.cut import cut

    param = next(f for f in files if f.suffix == ".param")
    weights = next((f for f in files if f.suffix == ".bin"), param.with_suffix(".bin"))
    cut_model = cut(param, weights, str(first), str(last), shapes)
    names = {"param": f"model/{MODEL_STEM}.param", "bin": f"model/{MODEL_STEM}.bin"}
    return CutPiece({names["param"]: cut_model.param_text.encode(), names["bin"]: cut_model.weights}, names,
                    cut_model.inputs, cut_model.outputs, cut_model.layers)


def options(recorded: dict, attrs: dict, backend: str, precision: str) -> tuple[dict, bool]:
    """The Option flags the run used: as recorded, else as layerdiff sets them for its backend and precision."""
    flags = {k: bool(v) for k, v in recorded.items() if k.startswith("use_")}
    if not flags:
        fp16 = backend == "vulkan" or str(attrs.get("abi", "")).startswith("arm64")
        flags = {"use_vulkan_compute": backend == "vulkan", **ncnn_precision_flags(precision, fp16=fp16)}
    return flags, bool(recorded)


def options_text(config: dict) -> str:
    flags = ", ".join(f"{k}={int(v)}" for k, v in sorted(config["options"].items()))
    return f"num_threads={config['threads']}, lightmode=1, {flags}"


def extra_files(spec: dict) -> dict[str, str]:
    return {"repro.cpp": cpp_source(spec), "CMakeLists.txt": CMAKE_LISTS}


def cpp_source(spec: dict) -> str:
    """`repro.cpp`: the runner against ncnn's C++ API, the bundle's names, shapes and options written in."""
    def option_lines(config: dict) -> str:
        lines = [f"        opt.num_threads = {config['threads']};", "        opt.lightmode = true;"]
        lines += [f"        opt.{flag} = {'true' if value else 'false'};" for flag, value in sorted(config["options"].items())
                  if flag in CPP_OPTION_FIELDS]
        return "\n".join(lines)

    def c_string(text: str) -> str:
        return json.dumps(text)

    feeds = "\n".join(f"    feed(ex, {c_string(item['blob'])}, {c_string(item['npy'][:-4] + '.bin')}, "
                      f"{{{', '.join(str(d) for d in mat_dims(item['shape']))}}});" for item in spec["inputs"])
    checks = "\n".join(f"    check(ex, {c_string(item['blob'])}, {c_string(item['reference_npy'][:-4] + '.bin')});"
                       for item in spec["outputs"])
    text = CPP_TEMPLATE.read_text()
    return (text.replace("@RUN_OPTIONS@", option_lines(spec["configs"]["run"]))
            .replace("@REFERENCE_OPTIONS@", option_lines(spec["configs"]["reference"]))
            .replace("@FEEDS@", feeds).replace("@CHECKS@", checks)
            .replace("@LAYER@", spec["layer"].replace("*/", "* /")))


def mat_dims(shape: list[int]) -> list[int]:
    """w, h, [d,] c as ncnn::Mat's constructor takes them, from the recorded NCHW shape."""
    dims = shape[1:] if len(shape) in (2, 4, 5) and shape[0] == 1 else shape
    return list(reversed(dims))


RECIPE = ReproRecipe("ncnn", cut_piece, Path(__file__).with_name("reprorun.py"), cuts_by="op", options=options,
                     options_text=options_text, extra_files=extra_files, extra_readme=CPP_README)
