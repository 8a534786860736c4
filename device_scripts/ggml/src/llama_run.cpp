#include "llama_run.h"

#include <algorithm>
#include <cstdio>

#include "errors.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "json.h"
#include "llama.h"
#include "llama_flash_attn.h"
#include "node_dump.h"
#include "sysutil.h"

#ifndef LAYERDIFF_GGML_SOURCE
#define LAYERDIFF_GGML_SOURCE "unknown"
#endif

namespace ld {

std::vector<std::string> backend_words(const std::map<std::string, int64_t>& per_buffer) {
    std::vector<std::string> words;
    for (const auto& entry : per_buffer) {
        std::string lower;
        for (char c : entry.first) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        // "Vulkan_Host" (pinned host memory) holds what the CPU computed for a GPU run (the token embedding)
        bool host = lower.size() > 5 && lower.compare(lower.size() - 5, 5, "_host") == 0;
        std::string word = host ? "cpu" : lower.rfind("vulkan", 0) == 0 ? "vulkan" : lower.rfind("opencl", 0) == 0 ? "opencl" : "cpu";
        if (std::find(words.begin(), words.end(), word) == words.end()) words.push_back(word);
    }
    return words;
}

std::string gguf_architecture(const std::string& path) {
    gguf_init_params params{true, nullptr};
    gguf_context* gguf = gguf_init_from_file(path.c_str(), params);
    if (gguf == nullptr) throw HarnessError(kExitModel, path + " is not a readable GGUF file");
    int64_t key = gguf_find_key(gguf, "general.architecture");
    std::string arch = key >= 0 && gguf_get_kv_type(gguf, key) == GGUF_TYPE_STRING ? gguf_get_val_str(gguf, key) : "";
    gguf_free(gguf);
    return arch;
}

LlamaRun::~LlamaRun() {
    if (ctx_) llama_free(ctx_);
    if (model_) llama_model_free(model_);
}

void LlamaRun::open(const std::string& model_path, const std::string& backend, const GgmlPrecision& precision,
                    int threads) {
    backend_ = backend;
    precision_ = precision;
    threads_ = threads;
    ggml_backend_dev_t device = device_for(backend);
    device_ = device ? ggml_backend_dev_description(device) : "";
    ggml_backend_dev_t devices[2] = {device, nullptr};  // cpu: an empty list, so nothing is offloaded
    llama_model_params mp = llama_model_default_params();
    mp.devices = devices;
    mp.n_gpu_layers = device ? -1 : 0;
    model_ = llama_model_load_from_file(model_path.c_str(), mp);
    if (model_ == nullptr) {
        throw HarnessError(kExitModel, model_path + ": llama.cpp could not load this GGUF model (its messages are above)");
    }
}

RunFacts LlamaRun::prepare(ModelInput* input, NodeRecorder* recorder) {
    const llama_vocab* vocab = llama_model_get_vocab(model_);
    if (input->name == "prompt") {
        int n = -llama_tokenize(vocab, input->text.data(), static_cast<int32_t>(input->text.size()), nullptr, 0, true, true);
        input->tokens.resize(std::max(n, 0));
        llama_tokenize(vocab, input->text.data(), static_cast<int32_t>(input->text.size()), input->tokens.data(), n, true, true);
    }
    int32_t n_vocab = llama_vocab_n_tokens(vocab);
    if (input->tokens.empty()) throw HarnessError(kExitRun, "input " + input->file + " gives no tokens");
    for (int32_t id : input->tokens) {
        if (id < 0 || id >= n_vocab) {
            throw HarnessError(kExitRun, "token id " + std::to_string(id) + " in " + input->file +
                                             " is outside the model's vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
        }
    }
    uint32_t n_ctx = std::max<uint32_t>(64, static_cast<uint32_t>(input->tokens.size()));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx;  // one ubatch: the whole prompt is one graph
    cp.n_threads = cp.n_threads_batch = threads_;
    cp.type_k = cp.type_v = precision_.kv_type;
    layerdiff_set_flash_attn(cp, precision_.flash_attn);
    cp.cb_eval = NodeDumper::callback;
    cp.no_perf = true;
    dumper_.reset(new NodeDumper(nullptr));
    dumper_->set_recorder(recorder);
    cp.cb_eval_user_data = dumper_.get();
    ctx_ = llama_init_from_model(model_, cp);
    if (ctx_ == nullptr) {
        throw HarnessError(kExitBackend, "llama.cpp could not create a context for --backend " + backend_ +
                                             " with this precision (its messages are above); try --precision normal");
    }
    // the ids as llama.cpp's input tensor holds them (llm_graph_input_embd: "inp_tokens", read by GET_ROWS)
    bool prompt = input->name == "prompt";
    dumper_->read_back_input("inp_tokens", input->name, prompt ? std::vector<int64_t>() : input->shape,
                             prompt ? "token ids of the prompt" : "");
    decode(*input, nullptr);  // placement pass: which backends the scheduler really used, and how many nodes
    const NodeDumper& placement = *dumper_;
    dumper_->set_recorder(nullptr);
    llama_memory_clear(llama_get_memory(ctx_), true);

    char desc[256];
    llama_model_desc(model_, desc, sizeof desc);
    RunFacts facts;
    facts.engine_version = std::string("ggml ") + ggml_version() + " (" + LAYERDIFF_GGML_SOURCE + ")";
    facts.backends_actual = backend_words(placement.nodes_per_buffer());
    facts.nodes = placement.nodes_seen();
    std::string kv = ggml_type_name(precision_.kv_type);
    // An ARMv8.2 build with fp16 vector arithmetic does f16 weights' dot products in fp16 (ggml_vec_dot_f16
    // accumulates with vfmaq_f16): what a phone's CPU computes, and not what an x86 CPU computes.
    bool fp16_va = ggml_cpu_has_fp16_va() != 0;
    facts.precision_effective = "weights " + std::string(desc) + ", kv " + kv +
                                (precision_.flash_attn ? ", flash-attn" : "") +
                                (fp16_va ? ", cpu fp16 vector arithmetic" : "") +
                                (backend_ == "vulkan" ? (precision_.vulkan_fp16 ? ", vulkan fp16 allowed" : ", vulkan fp32") : "");
    std::vector<int64_t> ids(input->tokens.begin(), input->tokens.end());
    JsonObject per_buffer;
    for (const auto& entry : placement.nodes_per_buffer()) per_buffer.add(entry.first, entry.second);
    facts.options_json = JsonObject()
                             .add("input_kind", input->name)
                             .add("tokens", ids)
                             .add("type_k", kv)
                             .add("type_v", kv)
                             .add("flash_attn", precision_.flash_attn)
                             .add("cpu_fp16_vector_arithmetic", fp16_va)
                             .add("n_gpu_layers", std::string(backend_ == "cpu" ? "0" : "all"))
                             .add("GGML_VK_DISABLE_F16", !precision_.vulkan_fp16)
                             .add("model_desc", std::string(desc))
                             .add("device", device_)
                             .add_raw("nodes_per_buffer", per_buffer.str())
                             .str();
    return facts;
}

void LlamaRun::decode(const ModelInput& input, DumpWriter* out, bool plain) {
    std::vector<int32_t> tokens = input.tokens;  // llama_batch_get_one takes a non-const pointer
    if (plain) dumper_->start_plain();
    else dumper_->start(out);
    if (llama_decode(ctx_, llama_batch_get_one(tokens.data(), static_cast<int32_t>(tokens.size()))) != 0) {
        throw HarnessError(kExitRun, "llama_decode failed on --backend " + backend_ + " (its messages are above)");
    }
}

std::vector<PlainOutput> LlamaRun::plain_run(const ModelInput& input) {
    llama_memory_clear(llama_get_memory(ctx_), true);  // the observed run's tokens are in the KV cache
    decode(input, nullptr, true);
    int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model_));
    const float* logits = llama_get_logits_ith(ctx_, -1);
    if (logits == nullptr) throw HarnessError(kExitRun, "llama.cpp returned no logits in the plain run");
    PlainOutput output;
    output.name = "result_output";
    output.shape = {n_vocab};  // the last token's logits, as the observed run dumps result_output (ne1 = 1)
    output.values.assign(logits, logits + n_vocab);
    llama_memory_clear(llama_get_memory(ctx_), true);
    return {output};
}

double LlamaRun::run(const ModelInput& input, DumpWriter& out) {
    double start = monotonic_ms();
    decode(input, &out);
    return monotonic_ms() - start;
}

}  // namespace ld
