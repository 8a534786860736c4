"""ggml's part of `collect repro` (its ProgramRecipe, `recipe()`): a node as a bundle whose runner is `repro.cpp`,
built against a ggml source tree (`cmake -DGGML_DIR=<llama.cpp>/ggml`); the node is described by reprograph.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from layerdiff.collector.engines.ggml.reprograph import CMAKE_LISTS, cpp_source, graph_document, read_node
from layerdiff.collector.engines.reprorecipe import ProgramRecipe
from layerdiff.errors import UsageError


def recipe() -> ProgramRecipe:
    return ProgramRecipe("a ggml bundle holds one op; name the ops one by one", read_node, graph_document, program,
                         readme, source_tree, lambda tree: [f"-DGGML_DIR={tree}"])


def program(graph: dict, reference_bin: str, recorded: dict) -> dict[str, str]:
    """repro.cpp with the node written in, and the CMakeLists.txt that builds it against a ggml tree."""
    return {"repro.cpp": cpp_source(graph, reference_bin, recorded), "CMakeLists.txt": CMAKE_LISTS}


def source_tree(given: Path | None) -> Path:
    """The ggml tree a bundle is built against: `given`, or the one layerdiff's ggml harness is built from."""
    if given is None:
        from layerdiff.collector.engines.ggml.build import source_dir

        given = source_dir() / "ggml"
    if not (Path(given) / "include" / "ggml.h").is_file():
        raise UsageError(f"{given}: not a ggml source tree (no include/ggml.h); pass --source-dir <llama.cpp>/ggml, or "
                         "build layerdiff's ggml harness once (`python -m layerdiff.collector.engines.ggml.build`) to fetch one")
    return Path(given)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def readme(spec: dict) -> str:
    """The ggml bundle's README: the node, the types each configuration built it with, how to build and run it."""
    run, ref = spec["configs"]["run"], spec["configs"]["reference"]
    device = spec["fingerprint"]["run"]
    err = spec["outputs"][0]["recorded_error"]
    graph_types = ", ".join(f"`{item['blob']}` {item['shape']} ({item['origin']})" for item in spec["inputs"])
    return f"""# ggml: node `{spec['layer']}` diverges on {run['backend']}/{run['precision']}

**What**: the node `{spec['layer']}` fed with the reference's own source tensors ({graph_types}) gives a wrong
output as built on **{run['backend']}** with precision **{run['precision']}**; the same graph on
{ref['backend']}/{ref['precision']} is the reference. The op, its parameters and each source's type per
configuration are in `model/graph.json` (and written into `repro.cpp`).

**Measured in the failing run** (output `{spec['outputs'][0]['blob']}` against the reference): rel L2 {_fmt(err['rel_l2'])},
max abs {_fmt(err['max_abs'])}, NaN {err['nan']}, +Inf {err['pos_inf']}, -Inf {err['neg_inf']}
(of {int(np.prod(spec['outputs'][0]['shape']))} values).

**Target platform**: {device.get('device_model', '?')} ({device.get('device_manufacturer', '')} {device.get('soc', '')}),
ABI {device.get('abi', '?')}, Android {device.get('android_release') or 'n/a'}, GPU {device.get('gpu') or 'n/a'},
driver {device.get('driver')}; {device.get('engine_version', '?')}; effective precision
{device.get('precision_effective', '?')}. Full fingerprint: `fingerprint.json`.

## Run it

`repro.cpp` needs only ggml: build it against a ggml source tree (llama.cpp's `ggml/` folder or the ggml
repository, at the version above or the one to test):

```
cmake -S . -B build -DGGML_DIR=<llama.cpp>/ggml && cmake --build build --target repro -j
./build/repro                # from inside this folder: both configurations against the reference output
./build/repro run --json
```

It prints, per configuration, rel L2, max abs, NaN/Inf counts and whether the output is bit-identical to the
reference; for the failing configuration `REPRODUCES` when the failure is there again. It computes on ggml's
CPU backend.

## Files

- `model/graph.json`: the node (op, parameters, sources with ggml `ne` and type per configuration)
- `tensors/input*.npy|.bin`: the reference's source tensors; `tensors/reference_output*`: the reference's output;
  `tensors/run_output*`: the failing run's output. `.bin` files are raw little-endian float32, shapes in `tensors.json`
- `repro.json`: the two configurations; `fingerprint.json`: device, GPU, driver, engine version
"""


