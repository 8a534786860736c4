#include "node_dump.h"

#include <cstdio>
#include <cstring>

#include "errors.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "node_isolate.h"

namespace ld {

std::string strip_copy_name(const std::string& name) {
    size_t first = name.find('#');
    size_t last = name.rfind('#');
    if (first == std::string::npos || first == last) return name;
    return name.substr(first + 1, last - first - 1);
}

bool NodeDumper::callback(ggml_tensor* t, bool ask, void* user_data) {
    auto* self = static_cast<NodeDumper*>(user_data);
    if (self->plain_) return false;  // the plain run: no node asked for, none handed back
    if (ask) return self->ask(t);
    self->dump(t);
    return true;  // never stop the graph: every later node still runs
}

bool NodeDumper::ask(ggml_tensor* t) {
    // Asking for a node makes the scheduler compute up to it and stop there; nodes the filter drops are
    // left out so the backend computes them in one go. The scheduler asks for every node in order, so
    // what depends on the graph alone (the name, the representation) is settled here for each of them.
    std::string name = unique_name(t);
    track_representation(t);
    // the input's first consumer is always asked for, so its input is read right after it ran (--layers aside)
    return writer_ == nullptr || writer_->wants(name) || (!fed_done_ && fed_source(t) != nullptr);
}

const ggml_tensor* NodeDumper::fed_source(const ggml_tensor* t) const {
    if (fed_tensor_.empty()) return nullptr;
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        const ggml_tensor* src = t->src[i];
        // the scheduler's copy for another backend ("Vulkan0#x#0") is what that backend computed on
        if (src != nullptr && src->op == GGML_OP_NONE && strip_copy_name(src->name) == fed_tensor_) return src;
    }
    return nullptr;
}

void NodeDumper::write_fed(const ggml_tensor* src) {
    fed_done_ = true;
    std::vector<char> bytes;
    std::vector<int64_t> shape;
    std::string dtype;
    if (!read_node(src, &bytes, &shape, &dtype)) return;  // a type it cannot widen: no read-back, nothing claimed
    int64_t given = 1, held = static_cast<int64_t>(ggml_nelements(src));
    for (int64_t d : fed_shape_) given *= d;
    if (!fed_shape_.empty() && given == held) shape = fed_shape_;  // [n] held, [1, n] given: the same tensor
    std::string buffer = src->buffer ? ggml_backend_buffer_name(src->buffer) : "none";
    std::string layout = std::string("ggml/") + ggml_type_name(src->type) + "@" + buffer;
    if (!fed_words_.empty()) layout = fed_words_ + " (" + layout + ")";
    writer_->write_fed(fed_name_, shape, dtype, layout, bytes.data(), bytes.size());
}

namespace {

// The tensor whose memory a view shares (a KV cache view -> the cache itself).
const ggml_tensor* view_root(const ggml_tensor* t) {
    while (t->view_src != nullptr) t = t->view_src;
    return t;
}

// ggml's own name for a node nobody named: "node_<its index in the graph>" (or "leaf_<n>"). The index
// differs between two graphs of one model (flash attention on or off, a rotated KV cache), so two
// unrelated nodes would share a name and be compared as one.
bool graph_index_name(const std::string& name) {
    for (const char* prefix : {"node_", "leaf_"}) {
        size_t n = std::strlen(prefix);
        if (name.size() > n && name.compare(0, n, prefix) == 0 &&
            name.find_first_not_of("0123456789", n) == std::string::npos) {
            return true;
        }
    }
    return false;
}

// A structural name longer than this becomes the op and a hash of it (still the same in every graph
// where the node has the same inputs).
constexpr size_t kMaxNameLength = 160;

std::string bounded(const std::string& name, const ggml_tensor* t) {
    if (name.size() <= kMaxNameLength) return name;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : name) hash = (hash ^ c) * 1099511628211ull;
    char text[32];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
    return std::string(ggml_op_desc(t)) + "(~" + text + ")";
}

// llama.cpp's quantized KV cache stores K and V multiplied by a rotation (graph inputs attn_inp_k_rot,
// attn_inp_v_rot) and multiplies again where attention is done; these leaves are the rotations.
bool rotation_leaf(const ggml_tensor* t) {
    if (t == nullptr || t->op != GGML_OP_NONE) return false;
    std::string name = strip_copy_name(t->name);  // on a GPU the scheduler's copy: "Vulkan0#attn_inp_k_rot#0"
    return name.size() > 4 && name.compare(name.size() - 4, 4, "_rot") == 0;
}

}  // namespace

std::string NodeDumper::unique_name(const ggml_tensor* t) {
    auto found = names_.find(t);
    if (found != names_.end()) return found->second;
    std::string base = given_name(t);
    int uses = name_uses_[base]++;
    std::string name = uses == 0 ? base : base + "#" + std::to_string(uses);
    names_[t] = name;
    ggml_names_[t->name] = name;
    return name;
}

std::string NodeDumper::given_name(const ggml_tensor* t) {
    std::string base = strip_copy_name(t->name);
    if (base.empty() || graph_index_name(base)) {
        // named by what it computes from what: OP(input, input, ...), the same in every graph that
        // computes it from the same inputs
        std::string text = std::string(ggml_op_desc(t)) + "(";
        bool first = true;
        for (int i = 0; i < GGML_MAX_SRC; ++i) {
            if (t->src[i] == nullptr) continue;
            text += (first ? "" : ",") + edge_name(t->src[i]);
            first = false;
        }
        return bounded(text + ")", t);
    }
    // "%s (reshaped)" of a then unnamed parent: " (reshaped)"; the parent is src[0] of a view/reshape/permute
    if (base[0] == ' ' && t->src[0] != nullptr) return bounded(edge_name(t->src[0]) + base, t);
    return base;
}

bool NodeDumper::rotated(const ggml_tensor* t) const {
    auto found = rotated_.find(t);
    if (found != rotated_.end()) return found->second;
    std::string base = strip_copy_name(t->name);
    if (base != t->name) {  // the scheduler's copy of a node for another backend: as its original
        auto original = rotated_by_name_.find(base);
        if (original != rotated_by_name_.end()) return original->second;
    }
    return rotated_roots_.count(view_root(t)) != 0;  // the KV cache itself, read through a view
}

void NodeDumper::track_representation(const ggml_tensor* t) {
    if (rotated_.count(t)) return;
    auto rot = [&](int i) { return t->src[i] != nullptr && rotated(t->src[i]); };
    bool out = false;
    bool stores = t->view_src != nullptr && (t->op == GGML_OP_SET_ROWS || t->op == GGML_OP_CPY);
    if (stores) {
        const ggml_tensor* root = view_root(t);
        out = rot(0);
        if (out) rotated_roots_.insert(root); else rotated_roots_.erase(root);
        // without flash attention llama.cpp keeps V transposed: one element per row ([TAG_V_CACHE_VARIABLE])
        if (t->op == GGML_OP_SET_ROWS && t->ne[0] == 1 && std::string(root->name).rfind("cache_v", 0) == 0) {
            transposed_v_roots_.insert(root);
        }
    } else if (t->op == GGML_OP_MUL_MAT) {
        if (rotation_leaf(t->src[0])) out = !rot(1);
        else if (rotation_leaf(t->src[1])) out = !rot(0);
        else out = rot(0) != rot(1);  // Q R against K R: the rotation cancels in Q K^T
    } else if (t->op == GGML_OP_FLASH_ATTN_EXT) {
        out = rot(2);  // softmax(Q R (K R)^T) (V R) = (softmax(Q K^T) V) R
    } else {
        for (int i = 0; i < GGML_MAX_SRC; ++i) out = out || rot(i);
    }
    rotated_[t] = out;
    rotated_by_name_[t->name] = out;
}

std::string NodeDumper::representation(const ggml_tensor* t) const {
    std::string tags;
    if (rotated(t)) tags = "rotated basis";
    if (t->view_src != nullptr && transposed_v_roots_.count(view_root(t))) tags += (tags.empty() ? "" : ", ") + std::string("V cache transposed");
    return tags;
}

std::string NodeDumper::edge_name(const ggml_tensor* src) {
    auto found = names_.find(src);
    if (found != names_.end()) return found->second;
    // A node that reads the KV cache reads what SET_ROWS/CPY wrote into it earlier in this graph: ggml's
    // src pointer names the cache tensor, the data flow runs through the writer. The edge names the writer,
    // so the cache stores are not dangling outputs and alignment follows the real data flow.
    auto writer = last_writer_.find(src);
    if (writer != last_writer_.end()) return writer->second;
    std::string name = strip_copy_name(src->name);  // a weight, an input or a copy of a dumped node
    if (graph_index_name(name) || (!name.empty() && name[0] == ' ')) {  // a copy of a node named structurally
        auto original = ggml_names_.find(name);
        if (original != ggml_names_.end()) return original->second;
    }
    return name.empty() ? std::string(ggml_op_desc(src)) : name;
}

void NodeDumper::dump(ggml_tensor* t) {
    ++seen_;
    std::string name = unique_name(t);
    std::string buffer = t->buffer ? ggml_backend_buffer_name(t->buffer) : "none";
    if (recorder_ != nullptr && recorder_->wants(name)) record(t, name);
    bool stores = t->view_src != nullptr && (t->op == GGML_OP_SET_ROWS || t->op == GGML_OP_CPY);
    if (stores && (writer_ == nullptr || writer_->wants(name))) last_writer_[view_root(t)] = name;
    if (writer_ == nullptr) {  // placement pass
        buffers_.insert(buffer);
        per_buffer_[buffer]++;
        return;
    }
    if (!fed_done_) {
        const ggml_tensor* fed = fed_source(t);
        if (fed != nullptr) write_fed(fed);
    }
    if (!writer_->wants(name)) return;
    TensorInfo info;
    info.op = name;
    info.name = name;
    info.op_type = ggml_op_desc(t);
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        if (t->src[i] != nullptr) info.inputs.push_back(edge_name(t->src[i]));
    }
    bool host = t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer);
    info.memory = host ? "host" : "device";
    // layout: "ggml/<type>@<buffer>": the node's own ggml type (widened to the dump dtype) and the buffer
    // (so the backend) that held it; the shape is ggml's ne reversed, so the bytes are C order.
    info.layout = std::string("ggml/") + ggml_type_name(t->type) + "@" + buffer;
    // Values llama.cpp holds in another representation in some configurations (a rotated basis for a
    // quantized KV cache, a transposed V cache without flash attention) say so first: the analyzer
    // compares a node only with one held the same way ("rotated basis (ggml/q8_0@CPU)").
    std::string held = representation(t);
    if (!held.empty()) info.layout = held + " (" + info.layout + ")";
    std::vector<char> bytes;
    if (!read_node(t, &bytes, &info.shape, &info.dtype)) {
        types_[std::string(ggml_type_name(t->type)) + " (not dumped)"]++;
        return;
    }
    types_[ggml_type_name(t->type)]++;
    writer_->write(info, bytes.data(), bytes.size());
}

// A src made by a graph node (its value can come from the reference), not a weight or model input: an op,
// a KV cache some node stored into, or the scheduler's copy of a node for another backend.
bool NodeDumper::made_by_node(const ggml_tensor* src) const {
    if (src->op != GGML_OP_NONE || names_.count(src) || last_writer_.count(src)) return true;
    std::string base = strip_copy_name(src->name);
    return base != src->name && name_uses_.count(base) != 0;
}

void NodeDumper::record(const ggml_tensor* t, const std::string& name) {
    std::vector<std::string> edges;
    std::vector<bool> made;
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        if (t->src[i] == nullptr) continue;
        edges.push_back(edge_name(t->src[i]));
        made.push_back(made_by_node(t->src[i]));
    }
    recorder_->record(t, name, edges, made);
}

namespace {

// Element (i0..i3) of a host copy of `t` as float.
float element(const ggml_tensor* t, const char* base, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const char* p = base + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
    switch (t->type) {
        case GGML_TYPE_F32: { float v; std::memcpy(&v, p, 4); return v; }
        case GGML_TYPE_F16: { ggml_fp16_t v; std::memcpy(&v, p, 2); return ggml_fp16_to_fp32(v); }
        case GGML_TYPE_BF16: { ggml_bf16_t v; std::memcpy(&v, p, 2); return ggml_bf16_to_fp32(v); }
        default: return 0.0f;
    }
}

}  // namespace

bool read_node(const ggml_tensor* t, std::vector<char>* bytes, std::vector<int64_t>* shape, std::string* dtype) {
    if (t->data == nullptr || t->buffer == nullptr) return false;
    int dims = ggml_n_dims(t);
    shape->clear();
    for (int d = dims - 1; d >= 0; --d) shape->push_back(t->ne[d]);
    std::vector<char> raw(ggml_nbytes(t));  // the whole extent of a (possibly strided) view
    ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
    int64_t n = ggml_nelements(t);
    if (t->type == GGML_TYPE_I32) {
        *dtype = "int32";
        bytes->resize(static_cast<size_t>(n) * 4);
        auto* out = reinterpret_cast<int32_t*>(bytes->data());
        for (int64_t i3 = 0; i3 < t->ne[3]; ++i3)
            for (int64_t i2 = 0; i2 < t->ne[2]; ++i2)
                for (int64_t i1 = 0; i1 < t->ne[1]; ++i1)
                    for (int64_t i0 = 0; i0 < t->ne[0]; ++i0)
                        std::memcpy(out++, raw.data() + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], 4);
        return true;
    }
    *dtype = "float32";
    bytes->resize(static_cast<size_t>(n) * 4);
    auto* out = reinterpret_cast<float*>(bytes->data());
    bool plain = t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16;
    if (plain) {
        for (int64_t i3 = 0; i3 < t->ne[3]; ++i3)
            for (int64_t i2 = 0; i2 < t->ne[2]; ++i2)
                for (int64_t i1 = 0; i1 < t->ne[1]; ++i1)
                    for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) *out++ = element(t, raw.data(), i0, i1, i2, i3);
        return true;
    }
    // quantized (a q8_0 KV cache store): rows are whole blocks, widened with the type's own to_float
    const ggml_type_traits* traits = ggml_get_type_traits(t->type);
    if (traits->to_float == nullptr || t->nb[0] != ggml_type_size(t->type) || t->ne[0] % ggml_blck_size(t->type) != 0) {
        return false;
    }
    for (int64_t i3 = 0; i3 < t->ne[3]; ++i3)
        for (int64_t i2 = 0; i2 < t->ne[2]; ++i2)
            for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
                traits->to_float(raw.data() + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], out, t->ne[0]);
                out += t->ne[0];
            }
    return true;
}

}  // namespace ld
