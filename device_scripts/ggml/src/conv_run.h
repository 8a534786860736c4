// layerdiff's own op graph in a GGUF file (general.architecture "layerdiff.conv2d"): one
// ggml_conv_2d, which ggml builds as IM2COL + MUL_MAT, run on a chosen backend with every node dumped.
// Why: the field report behind seed 004 is ggml's im2col giving NaN/Inf at large sizes in fp16; this
// re-runs exactly that op pair on the user's own input size without a whole model around it.
#pragma once

#include <string>
#include <vector>

#include "backends.h"
#include "dump_writer.h"
#include "model_input.h"
#include "node_keep.h"
#include "plain_run.h"
#include "run_facts.h"

struct ggml_context;
struct gguf_context;
struct ggml_tensor;

namespace ld {

class ConvRun {
public:
    ~ConvRun();
    void open(const std::string& model_path, const std::string& backend, const GgmlPrecision& precision, int threads);
    // `recorder` (--inject): the target nodes are recorded during the placement pass.
    RunFacts prepare(ModelInput* input, class NodeRecorder* recorder = nullptr);
    double run(const ModelInput& input, DumpWriter& out);
    // The plain run (docs/fidelity.md): the graph computed with no node asked for, conv.out read back.
    std::vector<std::string> output_names() const { return {"conv.out"}; }
    std::vector<PlainOutput> plain_run(const ModelInput& input);
    // --keep (node_keep.h): before open(); the header then records options.keep.
    void set_keep(const KeepNodes& keep) { keep_ = keep; }

private:
    double compute(const ModelInput& input, DumpWriter* out, class NodeDumper* dumper, PlainOutput* result = nullptr);
    gguf_context* gguf_ = nullptr;
    ggml_context* weights_ = nullptr;   // the GGUF's tensors, on the host
    ggml_tensor* kernel_ = nullptr;
    int stride_ = 1, padding_ = 0, dilation_ = 1;
    std::string backend_;
    GgmlPrecision precision_;
    int threads_ = 1;
    NodeDumper* dumper_ = nullptr;
    KeepNodes keep_;
    KeepRecord keep_record_;  // filled by each compute()
    // The type the graph's IM2COL was built in (filled by compute()): what ggml_conv_2d builds changes between ggml
    // releases (the kernel's type in ggml 0.9.8, f16 in 0.25.3), so the header says what ran, not what was asked.
    ggml_type im2col_built_ = GGML_TYPE_COUNT;
};

}  // namespace ld
