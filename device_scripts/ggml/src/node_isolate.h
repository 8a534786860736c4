// Op isolation for ggml (--inject DIR --target KEY): each target node runs alone, as a one-node graph
// rebuilt from the run's own graph and fed the reference's tensors.
// Why rebuilt from the live graph: ggml's graphs are built in code (llama.cpp's builders, ggml_conv_2d), so
// the harness builds the whole graph once on the reference's input, records each target node as it is
// computed (its op, its 64 bytes of op_params, its type and shape, and each src: type, shape, and whether a
// graph node made it), and then builds a graph of that node alone. Sources made by graph nodes come from the
// inject dump (the reference's values, converted to the type the node reads at this precision); weights and
// model inputs (leaves) keep the bytes the run held. Nothing about the op has to be re-derived, so any op the
// backend computes can be isolated; views and in-place writes compute nothing of their own and are refused.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "inject_source.h"

struct gguf_context;

namespace ld {

struct NodeSource {
    int slot = 0;            // its index in the node's src[]
    std::string name;        // its edge name in the dump: the node that made it, or the weight / input
    std::string from;        // "inject" (a graph node made it), "gguf" (a weight), "run" (an input, mask, position)
    ggml_type type = GGML_TYPE_F32;
    int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
    std::vector<char> bytes;  // a leaf: the weight's bytes from the GGUF, or its data as the run held it
    // a weight: the buffer type the run held it in (the CPU's repacked layout has kernels of its own), so
    // the node alone runs the kernel the run ran; nullptr: the backend's default buffer
    ggml_backend_buffer_type_t buft = nullptr;
};

struct NodeRecipe {
    std::string name;  // the node's name in the dump
    ggml_op op = GGML_OP_NONE;
    std::string op_desc;  // ggml_op_desc: the op type the dump gives it (a UNARY's own name, e.g. SILU)
    int32_t op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)] = {};
    ggml_type type = GGML_TYPE_F32;
    int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
    std::vector<NodeSource> srcs;
    std::string refusal;  // non-empty: why this node cannot run alone
};

// What one src got: how many reference values the node's own input type could not hold.
struct FedSource {
    std::string name;
    std::string from;  // "inject", "gguf" or "run"
    std::string type;  // ggml type name the node reads it as
    std::string buffer;  // the buffer type it was allocated in ("CPU_REPACK": a weight in the CPU's own layout)
    int64_t values = 0;
    int64_t overflow = 0;       // finite in the reference, +-Inf after conversion (f16: |x| > 65504)
    int64_t flushed = 0;        // non-zero in the reference, 0 after conversion
    double reference_peak = 0;  // largest |value| of the finite reference values
};

struct IsolatedNode {
    std::vector<char> bytes;  // the output, as read_node gives it (float32 / int32, C order)
    std::vector<int64_t> shape;
    std::string dtype;
    std::string type;    // the ggml type the node wrote
    std::string buffer;  // the backend buffer that held it
    std::vector<std::string> inputs;
    std::vector<FedSource> fed;
    double ms = 0;
};

// The GGUF's tensors by name, read from the file on demand (a weight the run may hold rearranged).
class GgufTensors {
public:
    explicit GgufTensors(const std::string& path);
    ~GgufTensors();
    GgufTensors(const GgufTensors&) = delete;
    GgufTensors& operator=(const GgufTensors&) = delete;
    // The stored bytes of tensor `name` when the file has it with this type and size; false otherwise.
    bool read(const std::string& name, ggml_type type, size_t nbytes, std::vector<char>* out) const;

private:
    std::string path_;
    gguf_context* gguf_ = nullptr;
};

// Collects the recipes of the target nodes while the whole graph runs (NodeDumper calls record()).
class NodeRecorder {
public:
    NodeRecorder(const std::vector<std::string>& names, const std::string& model_path);
    bool wants(const std::string& name) const { return recipes_.count(name) != 0; }
    // `edges`: each non-null src's edge name; `made_by_node`: whether a graph node wrote it.
    void record(const ggml_tensor* t, const std::string& name, const std::vector<std::string>& edges,
                const std::vector<bool>& made_by_node);
    // The recipe of a target; throws HarnessError(kExitBadArgs) when the graph had no such node or it cannot
    // be rebuilt, naming the node and why.
    const NodeRecipe& recipe(const std::string& name) const;

private:
    std::map<std::string, NodeRecipe> recipes_;
    std::map<std::string, bool> seen_;
    GgufTensors gguf_;
};

// Runs one recorded node alone on `backend` (the CPU as the scheduler's fallback), fed from `source`.
IsolatedNode run_isolated(const NodeRecipe& recipe, const InjectSource& source, const std::string& backend, int threads);

// The `isolation` object of the dump header: how the nodes were rebuilt and what each was fed.
std::string isolation_json(const std::vector<IsolatedNode>& nodes, const std::vector<std::string>& names);

}  // namespace ld
