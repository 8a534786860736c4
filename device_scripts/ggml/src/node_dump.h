// Dumps every node of a ggml graph as the scheduler computes it (ggml_backend_sched_eval_callback).
// Why the scheduler's callback: it sees each node right after the backend that owns it computed it,
// on every backend (a GPU node's output is copied back with ggml_backend_tensor_get), in execution order.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "dump_writer.h"

struct ggml_tensor;

namespace ld {

class NodeRecorder;

class NodeDumper {
public:
    // writer nullptr: a placement pass (every node asked for, its buffer recorded, nothing copied).
    explicit NodeDumper(DumpWriter* writer) : writer_(writer) {}
    // The callback ggml calls (user_data = this NodeDumper).
    static bool callback(ggml_tensor* t, bool ask, void* user_data);

    // Buffer names the dumped nodes lived in ("CPU", "Vulkan0", ...): the backends that really ran them.
    const std::set<std::string>& buffers() const { return buffers_; }
    const std::map<std::string, int64_t>& nodes_per_buffer() const { return per_buffer_; }
    // ggml types of the dumped outputs and how many nodes had each ("f32": 40, "f16": 4).
    const std::map<std::string, int64_t>& output_types() const { return types_; }
    int64_t nodes_seen() const { return seen_; }
    // Before each graph: names restart (the next graph reuses tensor memory), counters stay.
    void start(DumpWriter* writer) {
        writer_ = writer;
        plain_ = false;
        fed_done_ = false;
        names_.clear(); name_uses_.clear(); ggml_names_.clear(); last_writer_.clear();
        rotated_.clear(); rotated_by_name_.clear(); rotated_roots_.clear(); transposed_v_roots_.clear();
    }
    // The plain run (docs/fidelity.md): no node asked for, so the scheduler computes the graph whole, as an
    // app's graph runs (fusion across nodes allowed); nothing is recorded.
    void start_plain() {
        start(nullptr);
        plain_ = true;
    }
    bool plain() const { return plain_; }
    // --inject: while the graph runs (placement pass), hand the target nodes to `recorder` as they are computed.
    void set_recorder(NodeRecorder* recorder) { recorder_ = recorder; }
    // The model input to read back (FORMATS.md `input_fed`): the graph's input tensor named `tensor` ("inp_tokens",
    // "x"), recorded as input `name` right after its first consumer ran (the values that node computed on, from the
    // backend's own copy). `given_shape`: the input file's shape, used when it holds the same elements (leading
    // 1s); `layout_words`: what the values are when the input was given as something else ("token ids of the
    // prompt"). Once per observed run, never in the plain run.
    void read_back_input(const std::string& tensor, const std::string& name, const std::vector<int64_t>& given_shape,
                         const std::string& layout_words = "") {
        fed_tensor_ = tensor; fed_name_ = name; fed_shape_ = given_shape; fed_words_ = layout_words;
    }

private:
    bool ask(ggml_tensor* t);
    void dump(ggml_tensor* t);
    std::string unique_name(const ggml_tensor* t);
    std::string given_name(const ggml_tensor* t);
    std::string edge_name(const ggml_tensor* src);
    // Which representation a node's values are in (see representation()), settled as nodes are asked for.
    void track_representation(const ggml_tensor* t);
    bool rotated(const ggml_tensor* t) const;
    std::string representation(const ggml_tensor* t) const;
    bool made_by_node(const ggml_tensor* src) const;
    void record(const ggml_tensor* t, const std::string& name);
    const ggml_tensor* fed_source(const ggml_tensor* t) const;  // t's src that is the input to read back, if any
    void write_fed(const ggml_tensor* src);

    DumpWriter* writer_;
    bool plain_ = false;
    NodeRecorder* recorder_ = nullptr;
    std::string fed_tensor_, fed_name_, fed_words_;
    std::vector<int64_t> fed_shape_;
    bool fed_done_ = false;
    std::map<const ggml_tensor*, std::string> names_;  // node -> its unique dump name
    std::map<std::string, int> name_uses_;             // llama.cpp reuses names (Qcur-0 thrice)
    std::map<std::string, std::string> ggml_names_;    // ggml's name of a node -> its dump name (copies)
    std::map<const ggml_tensor*, bool> rotated_;       // node -> holds its values in a rotated basis
    std::map<std::string, bool> rotated_by_name_;      // the same by ggml's name (the scheduler's copies)
    std::set<const ggml_tensor*> rotated_roots_;       // KV caches whose content is stored rotated
    std::set<const ggml_tensor*> transposed_v_roots_;  // V caches stored transposed (no flash attention)
    std::map<const ggml_tensor*, std::string> last_writer_;  // a KV cache tensor -> the node that last wrote into it
    std::set<std::string> buffers_;
    std::map<std::string, int64_t> per_buffer_;
    std::map<std::string, int64_t> types_;
    int64_t seen_ = 0;
};

// The node's output as float32 (or int32 for I32 nodes) in C order of its shape; shape = ne reversed.
// Returns false for types it cannot widen (the node is then skipped and counted).
bool read_node(const ggml_tensor* t, std::vector<char>* bytes, std::vector<int64_t>* shape, std::string* dtype);

// llama.cpp's scheduler names the copies it makes for another backend "<backend>#<name>#<n>".
std::string strip_copy_name(const std::string& name);

}  // namespace ld
