// Op isolation for ggml (--inject DIR --target KEY): a target node, or a range FIRST..LAST of nodes (the
// convolution built on an IM2COL), runs alone as a graph rebuilt from the run's own graph, fed the
// reference's tensors.
// Why rebuilt from the live graph: ggml's graphs are built in code (llama.cpp's builders, ggml_conv_2d), so
// the harness builds the whole graph once on the reference's input and records each target node as it is
// computed (its op, its 64 bytes of op_params, its type and shape, and each src: type, shape, and whether a
// graph node made it; a view's strides and offset), then builds a graph of those nodes alone. Sources made by
// graph nodes outside the target come from the inject dump (the reference's values, converted to the type the
// node reads at this precision); weights come from the GGUF file, in the buffer type the run held them in
// (the CPU may keep them in a layout of its own, with kernels of its own); other leaves (the model input,
// positions, masks) as the run held them. Nothing about an op is re-derived, so any op the backend computes
// can be isolated; a lone view computes nothing and an in-place write needs its destination: both refused.
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
    std::string from;        // "inject" (a node outside the target), "graph" (a node of the target range),
                             // "gguf" (a weight), "run" (an input, mask, position, a retyped weight)
    int node = -1;           // "graph": the index of the range's node that makes it
    ggml_type type = GGML_TYPE_F32;
    int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
    std::vector<char> bytes;  // "gguf" / "run": its bytes
    ggml_backend_buffer_type_t buft = nullptr;  // "gguf": the buffer type the run held it in; nullptr: default
};

struct NodeRecipe {
    std::string name;  // the node's name in the dump
    ggml_op op = GGML_OP_NONE;
    std::string op_desc;  // ggml_op_desc: the op type the dump gives it (a UNARY's own name, e.g. SILU)
    int32_t op_params[GGML_MAX_OP_PARAMS / sizeof(int32_t)] = {};
    ggml_type type = GGML_TYPE_F32;
    int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
    bool view = false;  // a view of its src[0] (inside a range): strides and offset into src[0]'s memory
    size_t nb[GGML_MAX_DIMS] = {};
    size_t offset = 0;
    std::vector<NodeSource> srcs;
};

// One --target: a node (first == last) or the nodes first..last in execution order, dumped at `last`.
struct IsolationTarget {
    std::string key;
    std::string first, last;
    std::vector<NodeRecipe> nodes;
    std::string refusal;  // non-empty: why it cannot run alone
    bool started = false, finished = false;
    bool range() const { return first != last; }
};

// What one outside src got: how many reference values the node's own input type could not hold.
struct FedSource {
    std::string name;
    std::string from;    // "inject", "gguf" or "run"
    std::string type;    // ggml type name the node reads it as
    std::string buffer;  // the buffer type it was allocated in ("AMX", "CPU_REPACK": a weight in the CPU's layout)
    int64_t values = 0;
    int64_t overflow = 0;       // finite in the reference, +-Inf after conversion (f16: |x| > 65504)
    int64_t flushed = 0;        // non-zero in the reference, 0 after conversion
    double reference_peak = 0;  // largest |value| of the finite reference values
};

struct IsolatedNode {
    std::string name;    // the target's output node
    std::string op_desc;
    std::vector<char> bytes;  // the output, as read_node gives it (float32 / int32, C order)
    std::vector<int64_t> shape;
    std::string dtype;
    std::string type;    // the ggml type the node wrote
    std::string buffer;  // the backend buffer that held it
    std::vector<std::string> inputs;  // the outside sources' names
    std::vector<FedSource> fed;
    std::vector<std::string> range;  // the nodes computed, first..last (one for a node)
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

// Parses --target KEY: NODE, NODE:0 or FIRST..LAST (each side may end in :0). Throws kExitBadArgs.
IsolationTarget parse_target(const std::string& key);

// Collects the targets' recipes while the whole graph runs (NodeDumper calls record() for each node).
class NodeRecorder {
public:
    NodeRecorder(const std::vector<IsolationTarget>& targets, const std::string& model_path);
    bool wants(const std::string& name) const;
    // `edges`: each non-null src's edge name; `made_by_node`: whether a graph node wrote it.
    void record(const ggml_tensor* t, const std::string& name, const std::vector<std::string>& edges,
                const std::vector<bool>& made_by_node);
    size_t size() const { return targets_.size(); }
    // Target i, complete; throws HarnessError(kExitBadArgs) naming it when the graph lacked it or it cannot run alone.
    const IsolationTarget& target(size_t i) const;

private:
    std::vector<IsolationTarget> targets_;
    std::vector<std::map<const ggml_tensor*, int>> made_;  // per target: node pointer -> index (during the pass)
    GgufTensors gguf_;
};

// Runs one target alone on `backend` (the CPU as the scheduler's fallback), fed from `source`.
IsolatedNode run_isolated(const IsolationTarget& target, const InjectSource& source, const std::string& backend, int threads);

// The `isolation` object of the dump header: how the nodes were rebuilt, what each was fed, the ranges.
std::string isolation_json(const std::vector<IsolatedNode>& nodes);

}  // namespace ld
