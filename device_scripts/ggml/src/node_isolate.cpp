#include "node_isolate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "backends.h"
#include "errors.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "json.h"
#include "node_dump.h"
#include "sysutil.h"

namespace ld {
namespace {

std::string shape_text(const int64_t* ne) {
    std::string out = "[";
    for (int d = GGML_MAX_DIMS - 1; d >= 0; --d) out += std::to_string(ne[d]) + (d ? ", " : "]");
    return out;
}

int64_t elements(const int64_t* ne) {
    int64_t n = 1;
    for (int d = 0; d < GGML_MAX_DIMS; ++d) n *= ne[d];
    return n;
}

// The reference's values in the type the node reads (f16, bf16, a quantized type), counting what that type
// could not hold: finite values that became +-Inf, non-zero values that became 0.
std::vector<char> convert(const std::vector<float>& values, ggml_type type, const std::string& where, FedSource* fed) {
    std::vector<char> bytes;
    for (float v : values) {
        if (std::isfinite(v)) fed->reference_peak = std::max(fed->reference_peak, static_cast<double>(std::fabs(v)));
    }
    if (type == GGML_TYPE_F32) {
        bytes.resize(values.size() * 4);
        std::memcpy(bytes.data(), values.data(), bytes.size());
        return bytes;
    }
    const ggml_type_traits* traits = ggml_get_type_traits(type);
    int64_t n = static_cast<int64_t>(values.size());
    if (traits->from_float_ref == nullptr || traits->to_float == nullptr || n % ggml_blck_size(type) != 0) {
        throw HarnessError(kExitBadArgs, where + ": cannot convert the reference's float32 values to " + ggml_type_name(type));
    }
    bytes.resize(ggml_row_size(type, n));
    traits->from_float_ref(values.data(), bytes.data(), n);
    std::vector<float> back(values.size());
    traits->to_float(bytes.data(), back.data(), n);
    for (size_t i = 0; i < values.size(); ++i) {
        if (std::isfinite(values[i]) && !std::isfinite(back[i])) ++fed->overflow;
        if (values[i] != 0.0f && back[i] == 0.0f) ++fed->flushed;
    }
    return bytes;
}

std::vector<char> injected(const NodeSource& s, const InjectSource& source, const std::string& target, FedSource* fed) {
    std::string where = "--target " + target + ": its input " + s.name;
    if (!source.has(s.name)) {
        throw HarnessError(kExitBadArgs, where + " is not in the inject dump " + source.dir() +
                                             "; isolate against the reference run that dumped it");
    }
    std::vector<float> values = source.read(s.name);
    if (static_cast<int64_t>(values.size()) != elements(s.ne)) {
        throw HarnessError(kExitBadArgs, where + " has " + std::to_string(values.size()) + " values in the inject dump, the node reads " +
                                             shape_text(s.ne) + ": a reference of another graph or input size");
    }
    return convert(values, s.type, where, fed);
}

struct Backends {  // the requested backend first, the CPU last (the scheduler's fallback)
    std::vector<ggml_backend_t> list;
    Backends(const std::string& backend, int threads) {
        ggml_backend_dev_t device = device_for(backend);
        if (device != nullptr) list.push_back(ggml_backend_dev_init(device, nullptr));
        ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
        ggml_backend_cpu_set_n_threads(cpu, threads);
        list.push_back(cpu);
    }
    ~Backends() { for (ggml_backend_t b : list) ggml_backend_free(b); }
};

using Context = std::unique_ptr<ggml_context, void (*)(ggml_context*)>;

}  // namespace

namespace {

// The outside sources of a target, each once, as leaves (weights in the buffer type the run held them in).
class Leaves {
public:
    Leaves(ggml_backend_buffer_type_t fallback, size_t bytes) : fallback_(fallback), bytes_(bytes) {}
    ~Leaves() { for (ggml_backend_buffer_t b : buffers_) ggml_backend_buffer_free(b); }
    ggml_tensor* get(const NodeSource& s, const InjectSource& source, const std::string& key, IsolatedNode* out) {
        auto found = by_name_.find(s.name);
        if (found != by_name_.end()) return found->second;
        ggml_backend_buffer_type_t buft = s.buft ? s.buft : fallback_;
        if (!contexts_.count(buft)) contexts_.emplace(buft, Context(ggml_init({bytes_, nullptr, true}), ggml_free));
        ggml_tensor* leaf = ggml_new_tensor(contexts_.at(buft).get(), s.type, GGML_MAX_DIMS, s.ne);
        ggml_set_name(leaf, s.name.c_str());
        ggml_set_input(leaf);
        FedSource fed;
        fed.name = s.name;
        fed.from = s.from;
        fed.type = ggml_type_name(s.type);
        fed.buffer = ggml_backend_buft_name(buft);
        fed.values = elements(s.ne);
        fills_.emplace_back(leaf, s.from == "inject" ? injected(s, source, key, &fed) : s.bytes);
        out->inputs.push_back(s.name);
        out->fed.push_back(fed);
        by_name_[s.name] = leaf;
        return leaf;
    }
    void allocate_and_fill() {
        for (const auto& entry : contexts_) buffers_.push_back(ggml_backend_alloc_ctx_tensors_from_buft(entry.second.get(), entry.first));
        for (const auto& fill : fills_) ggml_backend_tensor_set(fill.first, fill.second.data(), 0, fill.second.size());
    }

private:
    ggml_backend_buffer_type_t fallback_;
    size_t bytes_;
    std::map<ggml_backend_buffer_type_t, Context> contexts_;
    std::map<std::string, ggml_tensor*> by_name_;
    std::vector<std::pair<ggml_tensor*, std::vector<char>>> fills_;
    std::vector<ggml_backend_buffer_t> buffers_;
};

// One recorded node in `ctx`: a view of its (rebuilt) src[0] with the run's strides, or a new tensor; then the
// run's op, op_params and srcs.
ggml_tensor* rebuild(ggml_context* ctx, const NodeRecipe& r, const std::vector<ggml_tensor*>& srcs) {
    ggml_tensor* t = r.view ? ggml_view_4d(ctx, srcs[0], r.ne[0], r.ne[1], r.ne[2], r.ne[3], r.nb[1], r.nb[2], r.nb[3], r.offset)
                            : ggml_new_tensor(ctx, r.type, GGML_MAX_DIMS, r.ne);
    t->op = r.op;
    std::memcpy(t->op_params, r.op_params, sizeof r.op_params);
    for (int i = 0; i < GGML_MAX_SRC; ++i) t->src[i] = nullptr;
    for (size_t i = 0; i < r.srcs.size(); ++i) t->src[r.srcs[i].slot] = srcs[i];
    ggml_set_name(t, r.name.c_str());
    return t;
}

}  // namespace

IsolatedNode run_isolated(const IsolationTarget& target, const InjectSource& source, const std::string& backend, int threads) {
    Backends backends(backend, threads);
    size_t bytes = ggml_tensor_overhead() * (target.nodes.size() * (GGML_MAX_SRC + 1) + 2) + ggml_graph_overhead();
    Leaves leaves(ggml_backend_get_default_buffer_type(backends.list.front()), bytes);
    Context nodes(ggml_init({bytes, nullptr, true}), ggml_free);  // the scheduler places them on the backend that can run them
    IsolatedNode out;
    std::vector<ggml_tensor*> built;
    for (const NodeRecipe& r : target.nodes) {
        std::vector<ggml_tensor*> srcs;
        for (const NodeSource& s : r.srcs) srcs.push_back(s.from == "graph" ? built.at(s.node) : leaves.get(s, source, target.key, &out));
        built.push_back(rebuild(nodes.get(), r, srcs));
        out.range.push_back(r.name);
    }
    ggml_tensor* dst = built.back();
    ggml_set_output(dst);
    ggml_cgraph* graph = ggml_new_graph(nodes.get());
    ggml_build_forward_expand(graph, dst);
    leaves.allocate_and_fill();
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends.list.data(), nullptr, static_cast<int>(backends.list.size()),
                                                        GGML_DEFAULT_GRAPH_SIZE, false, true);
    double start = monotonic_ms();
    ggml_status status = ggml_backend_sched_graph_compute(sched, graph);
    out.ms = monotonic_ms() - start;
    bool read = status == GGML_STATUS_SUCCESS && read_node(dst, &out.bytes, &out.shape, &out.dtype);
    out.name = target.nodes.back().name;
    out.op_desc = target.nodes.back().op_desc;
    out.type = ggml_type_name(dst->type);
    out.buffer = dst->buffer ? ggml_backend_buffer_name(dst->buffer) : "none";
    ggml_backend_sched_free(sched);
    if (!read) {
        throw HarnessError(kExitRun, "--target " + target.key + ": ggml could not compute it alone on --backend " + backend +
                                         " (status " + std::to_string(static_cast<int>(status)) + ")");
    }
    return out;
}

std::string isolation_json(const std::vector<IsolatedNode>& nodes) {
    JsonObject fed, ranges;
    for (const IsolatedNode& node : nodes) {
        std::vector<std::string> items;
        for (const FedSource& s : node.fed) {
            JsonObject item;
            item.add("src", s.name).add("from", s.from).add("type", s.type).add("buffer", s.buffer).add("values", s.values);
            if (s.from == "inject") {
                item.add("overflow", s.overflow).add("flushed", s.flushed).add("reference_peak", s.reference_peak);
            }
            items.push_back(item.str());
        }
        fed.add_raw(node.name, json_array(items));
        if (node.range.size() > 1) ranges.add(node.name, node.range);
    }
    return JsonObject()
        .add("how", std::string("the target's nodes rebuilt from the run's own graph on the reference's input (op, op_params, "
                                "types, shapes, view strides); inputs made by other graph nodes from the inject dump, "
                                "converted to the type the node reads at this precision; weights from the GGUF in the "
                                "buffer type the run used, other leaves as the run held them"))
        .add_raw("fed", fed.str())
        .add_raw("ranges", ranges.str())
        .str();
}

}  // namespace ld
