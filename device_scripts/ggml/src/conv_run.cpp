#include "conv_run.h"

#include <cstring>
#include <map>
#include <memory>

#include "errors.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "json.h"
#include "node_dump.h"
#include "sysutil.h"

#ifndef LAYERDIFF_GGML_SOURCE
#define LAYERDIFF_GGML_SOURCE "unknown"
#endif

namespace ld {
namespace {

int int_key(gguf_context* gguf, const char* key, int fallback) {
    int64_t id = gguf_find_key(gguf, key);
    return id < 0 ? fallback : static_cast<int>(gguf_get_val_i32(gguf, id));
}

// The kernel's values as float32, whatever type the file stores (f32 or f16).
std::vector<float> kernel_floats(const ggml_tensor* k) {
    std::vector<float> out(static_cast<size_t>(ggml_nelements(k)));
    if (k->type == GGML_TYPE_F32) std::memcpy(out.data(), k->data, out.size() * 4);
    else ggml_fp16_to_fp32_row(static_cast<const ggml_fp16_t*>(k->data), out.data(), static_cast<int64_t>(out.size()));
    return out;
}

// ggml_conv_2d itself when its f16 IM2COL is wanted; otherwise the same graph (ggml.c, ggml_conv_2d)
// with the IM2COL in `im2col_type`, because ggml_conv_2d offers no choice. `columns_type`: the type the
// MUL_MAT reads the columns in (--keep keeps the IM2COL and the MUL_MAT apart: an IM2COL in one type
// feeding a MUL_MAT that reads another gets a CPY between, as an app mixing types would write it).
ggml_tensor* conv2d(ggml_context* ctx, ggml_tensor* a, ggml_tensor* b, ggml_type im2col_type, ggml_type columns_type,
                    int s, int p, int d) {
    if (im2col_type == GGML_TYPE_F16 && columns_type == GGML_TYPE_F16) return ggml_conv_2d(ctx, a, b, s, s, p, p, d, d);
    ggml_tensor* im2col = ggml_im2col(ctx, a, b, s, s, p, p, d, d, true, im2col_type);
    ggml_tensor* columns = columns_type == im2col_type ? im2col : ggml_cast(ctx, im2col, columns_type);
    ggml_tensor* result = ggml_mul_mat(ctx,
        ggml_reshape_2d(ctx, columns, im2col->ne[0], im2col->ne[3] * im2col->ne[2] * im2col->ne[1]),
        ggml_reshape_2d(ctx, a, a->ne[0] * a->ne[1] * a->ne[2], a->ne[3]));
    result = ggml_reshape_4d(ctx, result, im2col->ne[1], im2col->ne[2], im2col->ne[3], a->ne[3]);
    return ggml_cont(ctx, ggml_permute(ctx, result, 0, 1, 3, 2));
}

// Nodes that compute nothing (a view of another node's memory): never kept, never pinned.
bool view_op(const ggml_tensor* t) {
    switch (t->op) {
        case GGML_OP_NONE: case GGML_OP_VIEW: case GGML_OP_RESHAPE: case GGML_OP_PERMUTE: case GGML_OP_TRANSPOSE:
            return true;
        default:
            return false;
    }
}

// The nodes --keep can name and the ones it names. On the CPU a node is kept by the type it is built in,
// which the convolution graph offers for its IM2COL and MUL_MAT; on a GPU (`sched` given) every node that
// computes is pinned: a kept one to the CPU backend, a moved one to the GPU (the scheduler would otherwise
// carry a kept node's CPU placement down to the unpinned nodes after it).
KeepRecord keep_nodes_of(ggml_cgraph* graph, const std::vector<std::string>& names, const KeepNodes& keep,
                         ggml_backend_sched_t sched, ggml_backend_t gpu, ggml_backend_t cpu) {
    KeepRecord record;
    record.how = sched != nullptr ? "pinned to the CPU backend (ggml_backend_sched_set_tensor_backend), in the "
                                    "high precision's types; every other node that computes pinned to the GPU"
                                  : "built in the high precision's types";
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        ggml_tensor* node = ggml_graph_node(graph, i);
        bool movable = sched != nullptr ? !view_op(node) : node->op == GGML_OP_IM2COL || node->op == GGML_OP_MUL_MAT;
        if (!movable) continue;
        record.movable.push_back(names[i]);
        bool kept = keep.wants(names[i]);
        if (kept) record.kept.push_back(names[i]);
        if (sched != nullptr) ggml_backend_sched_set_tensor_backend(sched, node, kept ? cpu : gpu);
    }
    return record;
}

std::string join_words(const std::vector<std::string>& words) {
    std::string out;
    for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
    return out;
}

struct Backends {  // the requested backend first, the CPU last (the scheduler's fallback)
    std::vector<ggml_backend_t> list;
    ~Backends() { for (ggml_backend_t b : list) ggml_backend_free(b); }
};

}  // namespace

ConvRun::~ConvRun() {
    delete dumper_;
    if (gguf_) gguf_free(gguf_);
    if (weights_) ggml_free(weights_);
}

void ConvRun::open(const std::string& model_path, const std::string& backend, const GgmlPrecision& precision,
                   int threads) {
    backend_ = backend;
    precision_ = precision;
    threads_ = threads;
    device_for(backend);  // refuse a backend this build or machine lacks before anything runs
    gguf_init_params params{false, &weights_};
    gguf_ = gguf_init_from_file(model_path.c_str(), params);
    if (gguf_ == nullptr) throw HarnessError(kExitModel, model_path + " is not a readable GGUF file");
    kernel_ = ggml_get_tensor(weights_, "conv.weight");
    if (kernel_ == nullptr || (kernel_->type != GGML_TYPE_F32 && kernel_->type != GGML_TYPE_F16) || ggml_n_dims(kernel_) > 4) {
        throw HarnessError(kExitModel, model_path + ": a layerdiff.conv2d GGUF needs an f32/f16 tensor conv.weight "
                                                    "[out, in, kh, kw]");
    }
    stride_ = int_key(gguf_, "layerdiff.conv2d.stride", 1);
    padding_ = int_key(gguf_, "layerdiff.conv2d.padding", 0);
    dilation_ = int_key(gguf_, "layerdiff.conv2d.dilation", 1);
}

RunFacts ConvRun::prepare(ModelInput* input, NodeRecorder* recorder) {
    if (input->name != "x" || input->values.empty() || input->shape.size() != 4 || input->shape[0] != 1 ||
        input->shape[1] != kernel_->ne[2]) {
        throw HarnessError(kExitRun, "the convolution graph takes one float32 input x of shape [1, " +
                                         std::to_string(kernel_->ne[2]) + ", H, W] (from " + input->file + ")");
    }
    dumper_ = new NodeDumper(nullptr);
    dumper_->set_recorder(recorder);
    dumper_->read_back_input("x", "x", input->shape);  // [1, C, H, W]: ggml's ne (W, H, C, 1) reversed
    compute(*input, nullptr, dumper_);  // placement pass: the backends the scheduler really used
    RunFacts facts;
    facts.engine_version = std::string("ggml ") + ggml_version() + " (" + LAYERDIFF_GGML_SOURCE + ")";
    facts.backends_actual = backend_words(dumper_->nodes_per_buffer());
    facts.nodes = dumper_->nodes_seen();
    std::string type = ggml_type_name(precision_.conv_type);
    std::string im2col = ggml_type_name(im2col_built_ != GGML_TYPE_COUNT ? im2col_built_ : precision_.im2col_type);
    facts.precision_effective = "im2col " + im2col + ", kernel " + type;
    if (!keep_record_.kept.empty()) facts.precision_effective += ", kept in high: " + join_words(keep_record_.kept);
    JsonObject per_buffer;
    for (const auto& entry : dumper_->nodes_per_buffer()) per_buffer.add(entry.first, entry.second);
    JsonObject options;
    options.add("graph", precision_.im2col_type == GGML_TYPE_F16 ? "ggml_conv_2d (IM2COL " + im2col + " + MUL_MAT)"
                                                                 : "ggml_conv_2d's graph with an " + im2col + " IM2COL")
        .add("im2col_type", im2col)
        .add("kernel_type", type)
        .add("stride", stride_).add("padding", padding_).add("dilation", dilation_)
        .add("GGML_VK_DISABLE_F16", !precision_.vulkan_fp16)
        .add_raw("nodes_per_buffer", per_buffer.str());
    if (keep_.given) {
        options.add_raw("keep", JsonObject().add("pattern", keep_.text).add("how", keep_record_.how)
                                    .add("kept", keep_record_.kept).add("movable", keep_record_.movable).str());
    }
    facts.options_json = options.str();
    return facts;
}

double ConvRun::compute(const ModelInput& input, DumpWriter* out, NodeDumper* dumper, PlainOutput* result) {
    Backends backends;
    ggml_backend_dev_t device = device_for(backend_);
    if (device != nullptr) backends.list.push_back(ggml_backend_dev_init(device, nullptr));
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    ggml_backend_cpu_set_n_threads(cpu, threads_);
    backends.list.push_back(cpu);

    ggml_init_params ip{ggml_tensor_overhead() * 64 + ggml_graph_overhead(), nullptr, true};
    std::unique_ptr<ggml_context, void (*)(ggml_context*)> leaves(ggml_init(ip), ggml_free);
    std::unique_ptr<ggml_context, void (*)(ggml_context*)> ctx(ggml_init(ip), ggml_free);  // the nodes: the scheduler places them
    const int64_t* s = input.shape.data();  // [1, C, H, W]
    ggml_tensor* x = ggml_new_tensor_4d(leaves.get(), GGML_TYPE_F32, s[3], s[2], s[1], s[0]);
    ggml_set_name(x, "x");
    ggml_set_input(x);
    // --keep: a kept IM2COL writes the high precision's type; a kept MUL_MAT reads both operands in the high
    // precision's types (the columns and the kernel), a moved one in this precision's
    const GgmlPrecision kept = precision_for("high");
    bool keep_mul_mat = keep_.wants("conv.mul_mat");
    ggml_type kernel_type = keep_mul_mat ? kept.conv_type : precision_.conv_type;
    ggml_type columns_type = keep_mul_mat ? kept.im2col_type : precision_.im2col_type;
    ggml_type im2col_type = keep_.wants("conv.im2col") ? kept.im2col_type : precision_.im2col_type;
    ggml_tensor* w = ggml_new_tensor(leaves.get(), kernel_type, 4, kernel_->ne);
    ggml_set_name(w, "conv.weight");
    ggml_tensor* y = conv2d(ctx.get(), w, x, im2col_type, columns_type, stride_, padding_, dilation_);
    ggml_set_output(y);
    ggml_cgraph* graph = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(graph, y);
    std::vector<std::string> names;  // as the dump names them: a repeated name gets #1, #2
    std::map<std::string, int> uses;
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {  // ggml_conv_2d names none of its nodes
        ggml_tensor* node = ggml_graph_node(graph, i);
        std::string op = ggml_op_desc(node);
        for (char& c : op) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        std::string name = node == y ? std::string("conv.out") : "conv." + op;
        ggml_format_name(node, "%s", name.c_str());
        int n = uses[name]++;
        names.push_back(n == 0 ? name : name + "#" + std::to_string(n));
        if (node->op == GGML_OP_IM2COL) im2col_built_ = node->type;
    }
    ggml_backend_buffer_t weights = ggml_backend_alloc_ctx_tensors(leaves.get(), backends.list.front());
    std::vector<float> k = kernel_floats(kernel_);
    if (kernel_type == GGML_TYPE_F16) {
        std::vector<ggml_fp16_t> half(k.size());
        ggml_fp32_to_fp16_row(k.data(), half.data(), static_cast<int64_t>(k.size()));
        ggml_backend_tensor_set(w, half.data(), 0, half.size() * 2);
    } else {
        ggml_backend_tensor_set(w, k.data(), 0, k.size() * 4);
    }
    ggml_backend_tensor_set(x, input.values.data(), 0, input.values.size() * 4);

    ggml_backend_sched_t sched = ggml_backend_sched_new(backends.list.data(), nullptr, static_cast<int>(backends.list.size()),
                                                        GGML_DEFAULT_GRAPH_SIZE, false, true);
    if (!dumper->plain()) dumper->start(out);  // a plain run's dumper stays plain
    ggml_backend_sched_set_eval_callback(sched, NodeDumper::callback, dumper);
    double start = monotonic_ms();
    ggml_status status = GGML_STATUS_ALLOC_FAILED;
    if (keep_.given) {
        // the scheduler forgets a node's pinned backend when it resets: reset, pin, allocate, then compute
        ggml_backend_sched_reset(sched);
        keep_record_ = keep_nodes_of(graph, names, keep_, device != nullptr ? sched : nullptr, backends.list.front(), cpu);
        if (ggml_backend_sched_alloc_graph(sched, graph)) status = ggml_backend_sched_graph_compute(sched, graph);
    } else {
        status = ggml_backend_sched_graph_compute(sched, graph);
    }
    double ms = monotonic_ms() - start;
    if (result != nullptr && status == GGML_STATUS_SUCCESS) {  // the plain run's output, read as the dump reads nodes
        std::vector<char> bytes;
        std::string dtype;
        result->name = "conv.out";
        if (read_node(y, &bytes, &result->shape, &dtype) && dtype == "float32") {
            const float* values = reinterpret_cast<const float*>(bytes.data());
            result->values.assign(values, values + bytes.size() / sizeof(float));
        }
    }
    ggml_backend_sched_free(sched);
    ggml_backend_buffer_free(weights);
    if (status != GGML_STATUS_SUCCESS) {
        throw HarnessError(kExitRun, "ggml could not compute the convolution on --backend " + backend_ +
                                         " (status " + std::to_string(static_cast<int>(status)) + ")");
    }
    return ms;
}

double ConvRun::run(const ModelInput& input, DumpWriter& out) { return compute(input, &out, dumper_); }

std::vector<PlainOutput> ConvRun::plain_run(const ModelInput& input) {
    NodeDumper plain(nullptr);
    plain.start_plain();
    PlainOutput output;
    compute(input, nullptr, &plain, &output);
    return {output};
}

}  // namespace ld
