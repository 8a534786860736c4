"""One ggml node as a repro bundle: the op rebuilt alone by a short C++ program against ggml's headers.

ggml graphs exist only in code (llama.cpp's graph builders, layerdiff's convolution graph), so there is no
model file to cut. The bundle instead describes the node the way llama.cpp's exported test cases do: the op,
its parameters, each source's shape and type (as the failing and as the reference configuration built it),
in `model/graph.json`; `repro.cpp` has the same written in and builds the one op with ggml's public API, fed
the reference's tensors (converted to the type each configuration reads them in), and prints the error
against the reference's output. It is built against a ggml source tree the maintainer has
(`cmake -DGGML_DIR=<llama.cpp>/ggml`): no ggml source is shipped.

The ops it rebuilds are the plausible culprits of the graphs layerdiff runs: IM2COL (its parameters are
recorded for layerdiff's convolution graph) and MUL_MAT (sources taken from the reference dump, or a weight
read from the GGUF file: f32, f16, bf16). Any other op is refused in one line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from layerdiff.analyzer.formats.dumpfile import DumpFile
from layerdiff.errors import InputError, ModelFormatError, UsageError

SUPPORTED_OPS = ("IM2COL", "MUL_MAT")
PLAIN_TYPES = ("f32", "f16", "bf16")
CPP_TEMPLATE = Path(__file__).with_name("repro.cpp.in")
CMAKE_LISTS = """cmake_minimum_required(VERSION 3.14)
project(ggml_repro C CXX)
# -DGGML_DIR=<a ggml source tree>: llama.cpp's ggml/ folder, or the ggml repository itself
set(GGML_DIR "" CACHE PATH "ggml source tree (with CMakeLists.txt, include/ggml.h)")
if(NOT EXISTS "${GGML_DIR}/include/ggml.h")
    message(FATAL_ERROR "GGML_DIR=${GGML_DIR} is not a ggml source tree (no include/ggml.h); pass -DGGML_DIR=<llama.cpp>/ggml")
endif()
set(CMAKE_CXX_STANDARD 17)
set(BUILD_SHARED_LIBS OFF CACHE BOOL "" FORCE)
foreach(off GGML_BUILD_TESTS GGML_BUILD_EXAMPLES GGML_OPENMP GGML_CCACHE)
    set(${off} OFF CACHE BOOL "" FORCE)
endforeach()
add_subdirectory("${GGML_DIR}" ggml EXCLUDE_FROM_ALL)
add_executable(repro repro.cpp)
target_link_libraries(repro PRIVATE ggml)
"""


@dataclass(frozen=True)
class Source:
    """One source of the node: where its values come from and the type each configuration reads it in."""

    name: str
    ne: tuple[int, int, int, int]
    values: np.ndarray  # float32, numpy order (ne reversed)
    types: dict[str, str]  # config ("run", "reference") -> ggml type name
    origin: str  # "node" (the reference dump), "input" (the model input), "weight" (the GGUF file)


@dataclass(frozen=True)
class GgmlNode:
    """The node as the bundle rebuilds it."""

    name: str
    op: str
    sources: list[Source]
    params: dict
    out_types: dict[str, str]
    reference: np.ndarray
    failing: np.ndarray


def node_type(layout: str) -> str:
    """`ggml/f16@CPU` (or `rotated basis (ggml/q8_0@CPU)`) -> `f16`."""
    inner = layout[layout.rfind("(") + 1:].rstrip(")") if "(" in layout else layout
    return inner.split("/", 1)[-1].split("@", 1)[0] if inner.startswith("ggml/") else ""


def _ne(shape) -> tuple[int, int, int, int]:
    """numpy shape -> ggml ne (fastest axis first), padded to four axes."""
    dims = [int(d) for d in reversed(list(shape))] or [1]
    if len(dims) > 4:
        raise UsageError(f"a tensor of {len(dims)} axes: ggml has four")
    return tuple(dims + [1] * (4 - len(dims)))  # type: ignore[return-value]


def _rows_by_name(dump: DumpFile) -> dict:
    return {str(row.name): row for row in dump.layers.itertuples()}


def _options(dump: DumpFile) -> dict:
    header = dump.provenance.get("raw_header")
    options = header.get("options") if isinstance(header, dict) else None
    return options if isinstance(options, dict) else {}


def _gguf_tensor(model: Path, name: str) -> tuple[np.ndarray, str]:
    """A weight's values (float32) and stored type from the GGUF file; quantized types are refused."""
    try:
        import gguf
    except ImportError:
        raise UsageError("a ggml bundle reads the node's weights with the `gguf` package: pip install 'layerdiff[ggml]'") from None
    try:
        reader = gguf.GGUFReader(model)
    except (OSError, ValueError) as err:
        raise ModelFormatError(f"{model}: not a readable GGUF model ({err})") from None
    for tensor in reader.tensors:
        if tensor.name != name:
            continue
        kind = tensor.tensor_type.name.lower()
        if kind not in PLAIN_TYPES:
            raise UsageError(f"{model.name}: weight {name!r} is {kind}; a ggml bundle carries f32/f16/bf16 weights only")
        shape = [int(d) for d in reversed(list(tensor.shape))]
        data = np.asarray(tensor.data)
        if kind == "bf16":
            data = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return np.asarray(data, dtype=np.float32).reshape(shape), kind
    raise InputError(f"{model.name}: no tensor {name!r}, which the node reads; bundle against the model the runs used")


def read_node(model, ref: DumpFile, run: DumpFile, key: str) -> GgmlNode:
    """The node `key` of the reference dump, its sources and parameters, as both configurations built it."""
    rows, run_rows = _rows_by_name(ref), _rows_by_name(run)
    matches = [row for row in rows.values() if key in (row.key, row.op, row.name)]
    if not matches:
        raise InputError(f"{ref.path}: no node {key!r} in the reference; `analyze inspect {ref.path}` lists them")
    row = matches[0]
    name, op = str(row.name), str(row.op_type)
    if op not in SUPPORTED_OPS:
        raise UsageError(f"{name} is a {op} node: a ggml bundle rebuilds {' and '.join(SUPPORTED_OPS)} nodes; "
                         "`collect isolate` re-runs any node")
    if name not in run_rows:
        raise InputError(f"{run.path}: the failing run has no node {name!r}; it may have stopped before it")
    ref_options, run_options = _options(ref), _options(run)
    inputs = dict(ref.inputs())
    inputs_list = json.loads(row.inputs) if isinstance(row.inputs, str) else list(row.inputs)
    sources = [_source(str(src), rows, run_rows, inputs, model, ref_options, run_options, ref, run)
               for src in inputs_list]
    out_types = {"run": node_type(str(run_rows[name].layout)), "reference": node_type(str(row.layout))}
    if any(t not in PLAIN_TYPES for t in out_types.values()):
        raise UsageError(f"{name}: its output is {out_types['run']} / {out_types['reference']}; a ggml bundle "
                         "compares f32/f16/bf16 outputs only")
    params = _params(op, name, ref_options, sources)
    return GgmlNode(name, op, sources, params, out_types, np.asarray(ref.tensor(int(row.order)), dtype=np.float32),
                    np.asarray(run.tensor(int(run_rows[name].order)), dtype=np.float32))


def _source(src: str, rows: dict, run_rows: dict, inputs: dict, model, ref_options: dict,
            run_options: dict, ref: DumpFile, run: DumpFile) -> Source:
    if src in rows:  # made by a node: the reference's tensor, read in each configuration's type of that node
        row = rows[src]
        if src not in run_rows:
            raise InputError(f"{run.path}: the failing run has no node {src!r}, which the node reads")
        types = {"reference": node_type(str(row.layout)), "run": node_type(str(run_rows[src].layout))}
        values = np.asarray(ref.tensor(int(row.order)), dtype=np.float32)
        origin = "node"
    elif src in inputs:
        values, types, origin = np.asarray(inputs[src], dtype=np.float32), {"reference": "f32", "run": "f32"}, "input"
    else:
        values, stored = _gguf_tensor(model.files[0], src)
        # the convolution graph's harness converts its kernel to the precision's kernel type
        kernel = src == "conv.weight"
        types = {"reference": str(ref_options.get("kernel_type", stored)) if kernel else stored,
                 "run": str(run_options.get("kernel_type", stored)) if kernel else stored}
        origin = "weight"
    for config, kind in types.items():
        if kind not in PLAIN_TYPES:
            raise UsageError(f"{src}: the {config} configuration read it as {kind or 'an unknown type'}; a ggml bundle "
                             "feeds f32/f16/bf16 sources only")
    if origin == "input" and values.ndim == 4 and values.shape[0] == 1:
        pass  # NCHW with N = 1: ggml's ne (W, H, C, 1)
    return Source(src, _ne(values.shape), values, types, origin)


def _params(op: str, name: str, options: dict, sources: list[Source]) -> dict:
    if op == "MUL_MAT":
        if len(sources) != 2:
            raise UsageError(f"{name}: a MUL_MAT with {len(sources)} sources")
        return {}
    if len(sources) != 2 or not all(key in options for key in ("stride", "padding", "dilation")):
        raise UsageError(f"{name}: IM2COL's parameters are recorded for layerdiff's convolution graph only "
                         "(options stride, padding, dilation)")
    s, p, d = (int(options[key]) for key in ("stride", "padding", "dilation"))
    return {"s0": s, "s1": s, "p0": p, "p1": p, "d0": d, "d1": d, "is_2D": True}


def graph_document(node: GgmlNode, files: dict[str, str], configs: dict) -> dict:
    """model/graph.json: the node as repro.cpp rebuilds it (op, parameters, sources with ne and types)."""
    return {"format": "layerdiff-ggml-node", "format_version": 1, "node": node.name, "op": node.op,
            "params": node.params, "output": {"ne": list(_ne(node.reference.shape)), "types": node.out_types},
            "sources": [{"name": s.name, "origin": s.origin, "ne": list(s.ne), "types": s.types, "bin": files[s.name]}
                        for s in node.sources],
            "configs": {k: {f: v[f] for f in ("backend", "precision", "threads")} for k, v in configs.items()}}


GGML_TYPES = {"f32": "GGML_TYPE_F32", "f16": "GGML_TYPE_F16", "bf16": "GGML_TYPE_BF16"}


def cpp_source(graph: dict, reference_bin: str, recorded: dict) -> str:
    """repro.cpp: the one op with everything written in (names, ne, types per configuration, parameters)."""
    def config(name: str) -> str:
        cfg = graph["configs"][name]
        srcs = ", ".join(f"{{{json.dumps(s['name'])}, {json.dumps(s['bin'])}, {{{', '.join(str(n) for n in s['ne'])}}}, "
                         f"{GGML_TYPES[s['types'][name]]}}}" for s in graph["sources"])
        return (f"{{{json.dumps(name)}, {json.dumps(cfg['backend'])}, {json.dumps(cfg['precision'])}, "
                f"{int(cfg['threads'])}, {GGML_TYPES[graph['output']['types'][name]]}, {{{srcs}}}}}")

    if graph["op"] == "IM2COL":
        p = graph["params"]
        build = (f"    return ggml_im2col(ctx, s[0], s[1], {p['s0']}, {p['s1']}, {p['p0']}, {p['p1']}, {p['d0']}, "
                 f"{p['d1']}, {'true' if p['is_2D'] else 'false'}, out_type);")
    else:
        build = "    (void) out_type;  // MUL_MAT writes f32\n    return ggml_mul_mat(ctx, s[0], s[1]);"
    recorded_text = ", ".join(str(int(recorded[k])) for k in ("nan", "pos_inf", "neg_inf"))
    rel = recorded["rel_l2"]
    return (CPP_TEMPLATE.read_text().replace("@NODE@", graph["node"].replace("*/", "* /")).replace("@OP@", graph["op"])
            .replace("@BUILD@", build).replace("@RUN_CONFIG@", config("run"))
            .replace("@REFERENCE_CONFIG@", config("reference")).replace("@REFERENCE_BIN@", json.dumps(reference_bin))
            .replace("@OUTPUT_NAME@", json.dumps(graph["node"])).replace("@RECORDED_COUNTS@", recorded_text)
            .replace("@RECORDED_REL_L2@", "-1.0" if rel is None else repr(float(rel))))
