// layerdiff-ggml: runs a GGUF model through ggml (llama.cpp's graph builders, or layerdiff's own
// convolution graph) on one backend/precision and dumps every graph node in the raw dump format
// (analyzer/FORMATS.md section 1). It speaks the harness command line (device_scripts/HARNESS_CLI.md)
// with `--engine ggml`, one `--model FILE.gguf` and one input: tokens=IDS.npy, prompt=TEXT.txt (or a
// uint8 .npy of its UTF-8 bytes), or x=X.npy (float32) for a convolution graph.
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "backends.h"
#include "conv_run.h"
#include "engine.h"
#include "errors.h"
#include "ggml.h"
#include "json.h"
#include "llama.h"
#include "llama_run.h"
#include "plain_run.h"
#include "node_dump.h"
#include "node_isolate.h"
#include "node_keep.h"
#include "options.h"
#include "sha256.h"
#include "sysutil.h"

#ifndef LAYERDIFF_HARNESS_VERSION
#define LAYERDIFF_HARNESS_VERSION "0.0.0"
#endif
#ifndef LAYERDIFF_GGML_SOURCE
#define LAYERDIFF_GGML_SOURCE "unknown"
#endif

namespace ld {
namespace {

const char* kName = "layerdiff-ggml";
int g_last_level = GGML_LOG_LEVEL_NONE;

// ggml and llama.cpp log every load step at INFO; a user needs their warnings and errors only (stderr).
void quiet_log(ggml_log_level level, const char* text, void*) {
    if (level != GGML_LOG_LEVEL_CONT) g_last_level = level;
    if (g_last_level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

[[noreturn]] void bad(const std::string& what) { throw HarnessError(kExitBadArgs, what + " (see layerdiff-ggml --help)"); }

std::string base_name(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

void validate(const Options& o) {
    if (!o.engine.empty() && o.engine != "ggml") bad("this binary runs --engine ggml, not '" + o.engine + "'");
    if (!known_backend(o.backend)) bad("--backend must be cpu, opencl or vulkan, got '" + o.backend + "'");
    if (!known_precision(o.precision)) bad("--precision must be low, normal or high, got '" + o.precision + "'");
    if (o.models.size() != 1) bad("ggml needs exactly one --model FILE.gguf");
    if (o.inputs.size() != 1) {
        bad("ggml needs one --input: tokens=IDS.npy, prompt=TEXT.txt or x=X.npy (with --inject: the reference run's own input)");
    }
    if (!o.replace.empty()) bad("--replace is not supported by the ggml engine; isolate the node with --inject DIR --target KEY");
    if (o.inject_dir.empty() != o.targets.empty()) bad("--inject DIR and --target KEY go together");
    if (!file_readable(o.inputs[0].second)) bad("cannot read input file " + o.inputs[0].second);
    if (o.out.empty()) bad("--out DIR is required");
    if (!dir_absent_or_empty(o.out)) bad("output directory " + o.out + " is not empty: choose a new --out");
    if (!o.layers.empty()) {
        try {
            std::regex check(o.layers, std::regex::ECMAScript);
        } catch (const std::regex_error&) {
            bad("--layers '" + o.layers + "' is not a valid regular expression");
        }
    }
}

// `extra`: more header fields, values already JSON (an isolation's mode, targets, inject, isolation).
std::string header_json(const Options& o, const RunFacts& facts, const ModelInput& input, int repeat_index,
                        const std::vector<std::pair<std::string, std::string>>& extra = {}) {
    uint64_t size = 0;
    std::string digest = sha256_file(o.models[0], &size);
    std::string model = json_array({JsonObject().add("file", base_name(o.models[0])).add("sha256", digest)
                                        .add("bytes", static_cast<int64_t>(size)).str()});
    std::string inputs = json_array({JsonObject().add("name", input.name).add("file", base_name(input.file))
                                         .add("sha256", input.sha256).add("shape", input.shape)
                                         .add("dtype", input.dtype).str()});
    JsonObject header;
    header.add("record", "header").add("format", "layerdiff-raw").add("format_version", 1)
        .add("engine", "ggml").add("engine_version", facts.engine_version)
        .add("backend_requested", o.backend).add("backends_actual", facts.backends_actual)
        .add("precision_requested", o.precision).add("precision_effective", facts.precision_effective)
        .add("threads", o.threads).add_raw("model", model).add_raw("inputs", inputs)
        .add("harness", std::string(kName) + " " + LAYERDIFF_HARNESS_VERSION)
        .add("started", iso_utc_now()).add_raw("options", facts.options_json);
    if (o.repeat > 1) header.add("repeat", repeat_index);
    for (const auto& field : extra) header.add_raw(field.first, field.second);
    return header.str();
}

DumpLimits limits_from(const Options& o) {
    DumpLimits limits;
    if (!o.layers.empty()) {
        limits.has_filter = true;
        limits.filter = std::regex(o.layers, std::regex::ECMAScript);
    }
    limits.max_bytes = o.max_bytes;
    limits.abort_after = o.abort_after;
    return limits;
}

// Both kinds of graph: open, prepare (tokenize, placement pass), run with a writer.
template <typename Runner>
int run_with(Runner& runner, const Options& o, ModelInput& input, const GgmlPrecision& precision) {
    runner.open(o.models[0], o.backend, precision, o.threads);
    RunFacts facts = runner.prepare(&input);
    for (int r = 0; r < o.repeat; ++r) {
        std::string dir = o.repeat > 1 ? join_path(o.out, "r" + std::to_string(r)) : o.out;
        DumpWriter writer(dir, limits_from(o), facts.nodes);
        std::string header = header_json(o, facts, input, r);
        writer.write_header(header);
        writer.watch(runner.output_names());
        double ms = runner.run(input, writer);
        writer.write_footer(ms, plain_run_check([&] { return runner.plain_run(input); }, kGgmlObserving, writer, header));
    }
    return kExitOk;
}

// --inject DIR --target KEY: the whole graph runs once on the reference's input (nothing dumped) while the
// targets are recorded; then each runs alone (node_isolate.h) and only those outputs are dumped.
template <typename Runner>
int isolate_with(Runner& runner, const Options& o, ModelInput& input, const GgmlPrecision& precision) {
    std::vector<IsolationTarget> targets;
    std::map<std::string, std::string> outputs;  // each output node once: the dump keys tensors by name
    for (const std::string& key : o.targets) {
        targets.push_back(parse_target(key));
        auto taken = outputs.emplace(targets.back().last, key);
        if (!taken.second) bad("--target " + key + " and --target " + taken.first->second + " both end at node " +
                               targets.back().last + "; isolate them in separate runs");
    }
    InjectSource source(o.inject_dir);  // after the targets: the arguments first, then the files
    NodeRecorder recorder(targets, o.models[0]);
    runner.open(o.models[0], o.backend, precision, o.threads);
    RunFacts facts = runner.prepare(&input, &recorder);
    std::vector<IsolatedNode> nodes;
    std::map<std::string, int64_t> per_buffer;
    double total = 0;
    for (size_t i = 0; i < recorder.size(); ++i) {
        nodes.push_back(run_isolated(recorder.target(i), source, o.backend, o.threads));
        per_buffer[nodes.back().buffer]++;
        total += nodes.back().ms;
    }
    facts.backends_actual = backend_words(per_buffer);
    DumpWriter writer(o.out, limits_from(o), static_cast<int64_t>(nodes.size()));
    std::vector<std::string> quoted;
    for (const std::string& key : o.targets) quoted.push_back(json_quote(key));
    writer.write_header(header_json(o, facts, input, 0, {{"mode", json_quote("isolate")}, {"targets", json_array(quoted)},
                                                         {"inject", json_quote(base_name(o.inject_dir))},
                                                         {"isolation", isolation_json(nodes)}}));
    for (const IsolatedNode& node : nodes) {
        TensorInfo info;
        info.op = info.name = node.name;
        info.op_type = node.op_desc;
        info.inputs = node.inputs;
        info.shape = node.shape;
        info.dtype = node.dtype;
        info.layout = "ggml/" + node.type + "@" + node.buffer;
        info.memory = node.buffer.rfind("CPU", 0) == 0 || node.buffer.find("_Host") != std::string::npos ? "host" : "device";
        info.time_ms = node.ms;
        writer.write(info, node.bytes.data(), node.bytes.size());
    }
    writer.write_footer(total);
    return kExitOk;
}

// --keep REGEX is ggml's own argument (the shared parser does not know it): taken out of argv first.
KeepNodes take_keep(int* argc, char** argv) {
    KeepNodes keep;
    int out = 1;
    for (int i = 1; i < *argc; ++i) {
        if (std::string(argv[i]) != "--keep") {
            argv[out++] = argv[i];
            continue;
        }
        if (i + 1 >= *argc) bad("--keep needs a node-name REGEX");
        if (keep.given) bad("give --keep once (one REGEX: a|b names several nodes)");
        keep.given = true;
        keep.text = argv[++i];
        try {
            keep.pattern = std::regex(keep.text, std::regex::ECMAScript);
        } catch (const std::regex_error&) {
            bad("--keep '" + keep.text + "' is not a valid regular expression");
        }
    }
    *argc = out;
    return keep;
}

int run(const Options& o, const KeepNodes& keep) {
    validate(o);
    if (keep.given && !o.inject_dir.empty()) bad("--keep and --inject go in separate runs");
    if (!file_readable(o.models[0])) throw HarnessError(kExitModel, "cannot read model file " + o.models[0] + ": check the path");
    ModelInput input = load_model_input(o.inputs[0].first, o.inputs[0].second);
    GgmlPrecision precision = precision_for(o.precision);
    apply_precision_environment(precision);
    if (o.backend == "vulkan") choose_vulkan_device();
    llama_backend_init();
    std::string arch = gguf_architecture(o.models[0]);
    bool isolating = !o.inject_dir.empty();
    if (arch.rfind("layerdiff.conv2d", 0) == 0) {
        ConvRun conv;
        conv.set_keep(keep);
        return isolating ? isolate_with(conv, o, input, precision) : run_with(conv, o, input, precision);
    }
    if (input.name != "tokens" && input.name != "prompt") {
        bad("a language model takes --input tokens=IDS.npy or --input prompt=TEXT.txt, not '" + input.name + "'");
    }
    if (keep.given) {
        bad("--keep works on layerdiff's convolution graph only: llama.cpp builds a language model's graph inside "
            "llama_decode, and its public API offers no per-node choice of backend or type");
    }
    LlamaRun model;
    return isolating ? isolate_with(model, o, input, precision) : run_with(model, o, input, precision);
}

std::string version_line() {
    return std::string(kName) + " " + LAYERDIFF_HARNESS_VERSION + " (ggml " + ggml_version() + ", " +
           LAYERDIFF_GGML_SOURCE + ", " + build_abi() + ")";
}

std::string probe_json() {
    choose_vulkan_device();
    llama_backend_init();
    JsonObject engine;
    engine.add("version", std::string(ggml_version())).add_raw("backends", backends_probe_json());
    return JsonObject().add("harness", kName).add("version", LAYERDIFF_HARNESS_VERSION).add("abi", build_abi())
        .add_raw("engines", JsonObject().add_raw("ggml", engine.str()).str()).str();
}

const char* usage() {
    return "usage: layerdiff-ggml [--engine ggml] --model FILE.gguf\n"
           "                      --input tokens=IDS.npy | prompt=TEXT.txt | prompt=UTF8.npy | x=X.npy\n"
           "                      --backend cpu|opencl|vulkan --precision low|normal|high\n"
           "                      --out DIR [--threads N] [--layers REGEX] [--max-bytes N] [--repeat N] [--abort-after K]\n"
           "                      [--inject DIR --target NODE|FIRST..LAST ...]   (the input: the reference run's own)\n"
           "                      [--keep REGEX]   (these nodes in the high precision / on the CPU: collect bisect)\n"
           "       layerdiff-ggml --version | --probe\n";
}

}  // namespace
}  // namespace ld

int main(int argc, char** argv) {
    using namespace ld;
    llama_log_set(quiet_log, nullptr);
    try {
        KeepNodes keep = take_keep(&argc, argv);
        Options o = parse_options(argc, argv);
        if (o.backend.empty()) o.backend = "cpu";
        if (o.precision.empty()) o.precision = "high";
        switch (o.mode) {
            case Mode::Help: std::fputs(usage(), stdout); return kExitOk;
            case Mode::Version: std::printf("%s\n", version_line().c_str()); return kExitOk;
            case Mode::Probe: std::printf("%s\n", probe_json().c_str()); return kExitOk;
            case Mode::Run: return run(o, keep);
        }
    } catch (const HarnessError& err) {
        std::fflush(stdout);
        std::fprintf(stderr, "layerdiff-harness: %s\n", err.what());
        return err.code();
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "layerdiff-harness: out of memory; try --layers or --max-bytes to dump less\n");
        return kExitRun;
    } catch (const std::exception& err) {
        std::fprintf(stderr, "layerdiff-harness: run failed: %s\n", err.what());
        return kExitRun;
    }
    return kExitOk;
}
