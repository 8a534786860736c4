// A GGUF model of any architecture llama.cpp knows, run through llama.cpp's own graph builders:
// one llama_decode of the whole prompt, every node dumped with the names llama.cpp gives them.
#pragma once

#include <memory>
#include <string>

#include "backends.h"
#include "dump_writer.h"
#include "model_input.h"
#include "plain_run.h"
#include "run_facts.h"

struct llama_model;
struct llama_context;

namespace ld {

class LlamaRun {
public:
    LlamaRun() = default;
    ~LlamaRun();
    // Loads the model for the backend/precision. Throws HarnessError: kExitModel, kExitBackend.
    void open(const std::string& model_path, const std::string& backend, const GgmlPrecision& precision, int threads);
    // Tokenizes a prompt (the model's tokenizer) and checks ids; then a placement pass that dumps
    // nothing tells which backends the nodes run on (and, with a `recorder` (--inject), records the
    // target nodes). Throws HarnessError(kExitRun/kExitBadArgs).
    RunFacts prepare(ModelInput* input, class NodeRecorder* recorder = nullptr);
    double run(const ModelInput& input, DumpWriter& out);
    // The plain run (docs/fidelity.md): the prompt decoded with no node asked for, the logits read as
    // llama.cpp hands them to an app; the KV cache is cleared before and after.
    std::vector<std::string> output_names() const { return {"result_output"}; }
    std::vector<PlainOutput> plain_run(const ModelInput& input);

private:
    void decode(const ModelInput& input, DumpWriter* out, bool plain = false);
    std::unique_ptr<class NodeDumper> dumper_;  // cb_eval's user data: fixed when the context is made
    llama_model* model_ = nullptr;
    llama_context* ctx_ = nullptr;
    std::string backend_;
    std::string device_;  // the GPU device's description ("" on the CPU)
    GgmlPrecision precision_;
    int threads_ = 1;
};

// Whether a GGUF file is one of layerdiff's own op graphs (general.architecture "layerdiff.*").
std::string gguf_architecture(const std::string& path);

}  // namespace ld
