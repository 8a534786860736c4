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

bool is_view_op(ggml_op op) {
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
}

std::string shape_text(const int64_t* ne) {
    std::string out = "[";
    for (int d = GGML_MAX_DIMS - 1; d >= 0; --d) out += std::to_string(ne[d]) + (d ? ", " : "]");
    return out;
}

// Why `t` cannot run alone ("" when it can): views and in-place writes compute nothing of their own.
std::string refusal_for(const ggml_tensor* t, const std::string& name) {
    std::string op = ggml_op_desc(t);
    if (t->view_src != nullptr && is_view_op(t->op)) {
        return "node " + name + " (" + op + ") is a view of another tensor and computes nothing; isolate the node that reads it";
    }
    if (t->view_src != nullptr) {
        return "node " + name + " (" + op + ") writes into another tensor in place (" + std::string(t->view_src->name) +
               "); isolate the node that reads what it wrote";
    }
    if (!ggml_is_contiguous(t)) return "node " + name + " (" + op + ") has a strided output that a one-node graph cannot reproduce";
    return "";
}

// The CPU backend's "extra" buffers hold weights rearranged for this CPU and cannot be read back (ggml leaves
// their get_tensor unset): a weight there is taken from the GGUF file instead, anything else is refused.
bool unreadable_buffer(const ggml_backend_buffer_t buffer) {
    std::string name = ggml_backend_buffer_name(buffer);
    for (const char* extra : {"REPACK", "AMX", "KLEIDIAI", "IME"}) {
        if (name.find(extra) != std::string::npos) return true;
    }
    return false;
}

// A src as the isolated graph gets it: a graph node's from the inject dump; a weight's bytes from the GGUF
// (the stored type and layout, whatever buffer the run moved it to); another leaf's bytes as the run held them.
NodeSource source_of(const ggml_tensor* src, int slot, const std::string& edge, bool made_by_node,
                     const GgufTensors& gguf, std::string* refusal) {
    NodeSource s;
    s.slot = slot;
    s.name = edge;
    s.from = made_by_node ? "inject" : "run";
    s.type = src->type;
    std::memcpy(s.ne, src->ne, sizeof s.ne);
    if (made_by_node) {
        if (src->type == GGML_TYPE_I32 || src->type == GGML_TYPE_I64) {
            *refusal = "it reads " + edge + ", an integer tensor another node made, which an inject dump (float32) cannot carry";
        }
        return s;
    }
    if (gguf.read(edge, src->type, ggml_nbytes(src), &s.bytes)) {
        s.from = "gguf";
        s.buft = src->buffer ? ggml_backend_buffer_get_type(src->buffer) : nullptr;
        return s;
    }
    if (src->buffer == nullptr || src->data == nullptr || !ggml_is_contiguous(src) || unreadable_buffer(src->buffer)) {
        *refusal = "its input " + edge + " is neither a graph node, a weight of the GGUF, nor a readable tensor of the run";
        return s;
    }
    s.bytes.resize(ggml_nbytes(src));
    ggml_backend_tensor_get(const_cast<ggml_tensor*>(src), s.bytes.data(), 0, s.bytes.size());
    return s;
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

GgufTensors::GgufTensors(const std::string& path) : path_(path) {
    gguf_init_params params{true, nullptr};
    gguf_ = gguf_init_from_file(path.c_str(), params);
}

GgufTensors::~GgufTensors() {
    if (gguf_) gguf_free(gguf_);
}

bool GgufTensors::read(const std::string& name, ggml_type type, size_t nbytes, std::vector<char>* out) const {
    int64_t id = gguf_ == nullptr ? -1 : gguf_find_tensor(gguf_, name.c_str());
    if (id < 0 || gguf_get_tensor_type(gguf_, id) != type || gguf_get_tensor_size(gguf_, id) != nbytes) return false;
    out->resize(nbytes);
    FILE* file = std::fopen(path_.c_str(), "rb");
    long offset = static_cast<long>(gguf_get_data_offset(gguf_) + gguf_get_tensor_offset(gguf_, id));
    bool ok = file && std::fseek(file, offset, SEEK_SET) == 0 && std::fread(out->data(), 1, nbytes, file) == nbytes;
    if (file) std::fclose(file);
    if (!ok) throw HarnessError(kExitModel, path_ + ": cannot read tensor " + name + " (truncated GGUF?)");
    return true;
}

NodeRecorder::NodeRecorder(const std::vector<std::string>& names, const std::string& model_path) : gguf_(model_path) {
    for (const std::string& name : names) {
        recipes_[name].name = name;
        seen_[name] = false;
    }
}

void NodeRecorder::record(const ggml_tensor* t, const std::string& name, const std::vector<std::string>& edges,
                          const std::vector<bool>& made_by_node) {
    NodeRecipe& r = recipes_[name];
    seen_[name] = true;
    r.op = t->op;
    r.op_desc = ggml_op_desc(t);
    std::memcpy(r.op_params, t->op_params, sizeof r.op_params);
    r.type = t->type;
    std::memcpy(r.ne, t->ne, sizeof r.ne);
    r.refusal = refusal_for(t, name);
    size_t k = 0;
    for (int i = 0; i < GGML_MAX_SRC && r.refusal.empty(); ++i) {
        if (t->src[i] == nullptr) continue;
        std::string why;
        r.srcs.push_back(source_of(t->src[i], i, edges[k], made_by_node[k], gguf_, &why));
        ++k;
        if (!why.empty()) r.refusal = "node " + name + " (" + ggml_op_desc(t) + ") cannot run alone: " + why;
    }
}

const NodeRecipe& NodeRecorder::recipe(const std::string& name) const {
    auto found = recipes_.find(name);
    if (found == recipes_.end() || !seen_.at(name)) {
        throw HarnessError(kExitBadArgs, "--target " + name + ": no node of that name in this model's graph on this input; "
                                         "`analyze inspect` on the reference lists the node names");
    }
    if (!found->second.refusal.empty()) throw HarnessError(kExitBadArgs, "--target " + name + ": " + found->second.refusal);
    return found->second;
}

IsolatedNode run_isolated(const NodeRecipe& r, const InjectSource& source, const std::string& backend, int threads) {
    Backends backends(backend, threads);
    ggml_init_params ip{ggml_tensor_overhead() * (GGML_MAX_SRC + 2) + ggml_graph_overhead(), nullptr, true};
    std::map<ggml_backend_buffer_type_t, Context> leaves;  // by buffer type: the weights where the run held them
    Context nodes(ggml_init(ip), ggml_free);  // the node: the scheduler places it on the backend that can run it
    ggml_tensor* dst = ggml_new_tensor(nodes.get(), r.type, GGML_MAX_DIMS, r.ne);
    IsolatedNode out;
    std::vector<std::pair<ggml_tensor*, std::vector<char>>> fills;
    for (const NodeSource& s : r.srcs) {
        ggml_backend_buffer_type_t buft = s.buft ? s.buft : ggml_backend_get_default_buffer_type(backends.list.front());
        if (!leaves.count(buft)) leaves.emplace(buft, Context(ggml_init(ip), ggml_free));
        ggml_tensor* leaf = ggml_new_tensor(leaves.at(buft).get(), s.type, GGML_MAX_DIMS, s.ne);
        ggml_set_name(leaf, s.name.c_str());
        ggml_set_input(leaf);
        dst->src[s.slot] = leaf;
        FedSource fed;
        fed.name = s.name;
        fed.from = s.from;
        fed.type = ggml_type_name(s.type);
        fed.buffer = ggml_backend_buft_name(buft);
        fed.values = elements(s.ne);
        fills.emplace_back(leaf, s.from == "inject" ? injected(s, source, r.name, &fed) : s.bytes);
        out.inputs.push_back(s.name);
        out.fed.push_back(fed);
    }
    dst->op = r.op;
    std::memcpy(dst->op_params, r.op_params, sizeof r.op_params);
    ggml_set_name(dst, r.name.c_str());
    ggml_set_output(dst);
    ggml_cgraph* graph = ggml_new_graph(nodes.get());
    ggml_build_forward_expand(graph, dst);
    std::vector<ggml_backend_buffer_t> buffers;
    for (const auto& entry : leaves) buffers.push_back(ggml_backend_alloc_ctx_tensors_from_buft(entry.second.get(), entry.first));
    for (const auto& fill : fills) ggml_backend_tensor_set(fill.first, fill.second.data(), 0, fill.second.size());
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends.list.data(), nullptr, static_cast<int>(backends.list.size()),
                                                        GGML_DEFAULT_GRAPH_SIZE, false, true);
    double start = monotonic_ms();
    ggml_status status = ggml_backend_sched_graph_compute(sched, graph);
    out.ms = monotonic_ms() - start;
    bool read = status == GGML_STATUS_SUCCESS && read_node(dst, &out.bytes, &out.shape, &out.dtype);
    out.type = ggml_type_name(r.type);
    out.buffer = dst->buffer ? ggml_backend_buffer_name(dst->buffer) : "none";
    ggml_backend_sched_free(sched);
    for (ggml_backend_buffer_t buffer : buffers) {
        if (buffer) ggml_backend_buffer_free(buffer);
    }
    if (!read) {
        throw HarnessError(kExitRun, "--target " + r.name + ": ggml could not compute " + ggml_op_name(r.op) + " alone on --backend " +
                                         backend + " (status " + std::to_string(static_cast<int>(status)) + ")");
    }
    return out;
}

std::string isolation_json(const std::vector<IsolatedNode>& nodes, const std::vector<std::string>& names) {
    JsonObject fed;
    for (size_t i = 0; i < nodes.size(); ++i) {
        std::vector<std::string> items;
        for (const FedSource& s : nodes[i].fed) {
            JsonObject item;
            item.add("src", s.name).add("from", s.from).add("type", s.type).add("buffer", s.buffer).add("values", s.values);
            if (s.from == "inject") {
                item.add("overflow", s.overflow).add("flushed", s.flushed).add("reference_peak", s.reference_peak);
            }
            items.push_back(item.str());
        }
        fed.add_raw(names[i], json_array(items));
    }
    return JsonObject()
        .add("how", std::string("one-node graph rebuilt from the run's own graph on the reference's input (op, op_params, "
                                "types, shapes); inputs made by graph nodes from the inject dump, converted to the type "
                                "the node reads at this precision; weights from the GGUF, other leaves as the run held them"))
        .add_raw("fed", fed.str())
        .str();
}

}  // namespace ld
