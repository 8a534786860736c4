// Recording the targets of an isolation while the whole graph runs (node_isolate.h says why).
#include <cstdio>
#include <cstring>

#include "engine.h"
#include "errors.h"
#include "gguf.h"
#include "node_isolate.h"

namespace ld {
namespace {

bool is_view_op(ggml_op op) {
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
}

std::string node_words(const ggml_tensor* t, const std::string& name) {
    return "node " + name + " (" + ggml_op_desc(t) + ")";
}

// Why `t` cannot be rebuilt ("" when it can): a lone view computes nothing, an in-place write needs the
// tensor it writes into, a strided non-view output has no one-node equivalent.
std::string refusal_for(const ggml_tensor* t, const std::string& name, bool alone) {
    if (t->view_src != nullptr && is_view_op(t->op)) {
        if (!alone) return "";
        return node_words(t, name) + " is a view of another tensor and computes nothing; isolate the node that reads it";
    }
    if (t->view_src != nullptr) {
        return node_words(t, name) + " writes into another tensor in place (" + std::string(t->view_src->name) +
               "); isolate the node that reads what it wrote";
    }
    if (!ggml_is_contiguous(t)) return node_words(t, name) + " has a strided output that a rebuilt graph cannot reproduce";
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

// A src from outside the target: a graph node's from the inject dump; a weight's bytes from the GGUF (the
// stored type and layout, whatever buffer the run moved it to); another leaf's bytes as the run held them.
NodeSource outside_source(const ggml_tensor* src, const std::string& edge, bool made_by_node, const GgufTensors& gguf,
                          std::string* refusal) {
    NodeSource s;
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

// A view inside a range keeps its strides and its offset into src[0]'s memory; src[0] must be laid out as the
// rebuilt graph lays it out (a node of the range, or a contiguous tensor from outside).
std::string view_layout(const ggml_tensor* t, const ggml_tensor* src0, bool inside, NodeRecipe* r) {
    const ggml_tensor* root = src0->view_src ? src0->view_src : src0;
    if (t->view_src != root) return "its view does not start from its src[0]'s memory";
    if (!inside && !ggml_is_contiguous(src0)) return "it views " + std::string(src0->name) + ", a strided tensor from outside the range";
    r->view = true;
    std::memcpy(r->nb, t->nb, sizeof r->nb);
    r->offset = t->view_offs - (src0->view_src ? src0->view_offs : 0);
    return "";
}

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

IsolationTarget parse_target(const std::string& key) {
    IsolationTarget target;
    target.key = key;
    size_t dots = key.find("..");
    std::string sides[2] = {key.substr(0, dots), dots == std::string::npos ? key : key.substr(dots + 2)};
    std::string* names[2] = {&target.first, &target.last};
    for (int i = 0; i < 2; ++i) {
        int index = 0;
        split_tensor_key(sides[i], names[i], &index);
        if (index != 0) throw HarnessError(kExitBadArgs, "--target " + key + ": a ggml node has one output (:0)");
    }
    return target;
}

NodeRecorder::NodeRecorder(const std::vector<IsolationTarget>& targets, const std::string& model_path)
    : targets_(targets), made_(targets.size()), gguf_(model_path) {}

bool NodeRecorder::wants(const std::string& name) const {
    for (const IsolationTarget& t : targets_) {
        if ((t.started && !t.finished) || (!t.started && name == t.first)) return true;
    }
    return false;
}

void NodeRecorder::record(const ggml_tensor* t, const std::string& name, const std::vector<std::string>& edges,
                          const std::vector<bool>& made_by_node) {
    for (size_t i = 0; i < targets_.size(); ++i) {
        IsolationTarget& target = targets_[i];
        if (!target.started && name == target.first) target.started = true;
        if (!target.started || target.finished) continue;
        target.finished = name == target.last;
        if (!target.refusal.empty()) continue;
        NodeRecipe r;
        r.name = name;
        r.op = t->op;
        r.op_desc = ggml_op_desc(t);
        std::memcpy(r.op_params, t->op_params, sizeof r.op_params);
        r.type = t->type;
        std::memcpy(r.ne, t->ne, sizeof r.ne);
        std::string why = refusal_for(t, name, !target.range());
        for (int slot = 0, k = 0; slot < GGML_MAX_SRC && why.empty(); ++slot) {
            const ggml_tensor* src = t->src[slot];
            if (src == nullptr) continue;
            auto inside = made_[i].find(src);
            NodeSource s;
            if (inside != made_[i].end()) {
                s.from = "graph";
                s.node = inside->second;
                s.name = edges[k];
            } else {
                s = outside_source(src, edges[k], made_by_node[k], gguf_, &why);
            }
            s.slot = slot;
            if (why.empty() && slot == 0 && t->view_src != nullptr) why = view_layout(t, src, inside != made_[i].end(), &r);
            if (!why.empty()) why = node_words(t, name) + " cannot run alone: " + why;
            r.srcs.push_back(s);
            ++k;
        }
        target.refusal = why;
        made_[i][t] = static_cast<int>(target.nodes.size());
        target.nodes.push_back(std::move(r));
        if (target.finished) made_[i].clear();  // the graph's pointers die with it
    }
}

const IsolationTarget& NodeRecorder::target(size_t i) const {
    const IsolationTarget& t = targets_.at(i);
    if (!t.started) {
        throw HarnessError(kExitBadArgs, "--target " + t.key + ": no node " + t.first + " in this model's graph on this input; "
                                         "`analyze inspect` on the reference lists the node names");
    }
    if (!t.refusal.empty()) throw HarnessError(kExitBadArgs, "--target " + t.key + ": " + t.refusal);
    if (!t.finished) {
        throw HarnessError(kExitBadArgs, "--target " + t.key + ": no node " + t.last + " after " + t.first +
                                         " in this graph; name the range in execution order");
    }
    return t;
}

}  // namespace ld
