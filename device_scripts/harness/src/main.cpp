// layerdiff-harness entry point: parse, load, run, dump; map every failure to one exit code and
// one "layerdiff-harness: ..." line on stderr (HARNESS_CLI.md). `--each FILE` runs many inputs on one
// loaded model, each its own dump, and says per run on stdout how it ended.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "each_cases.h"
#include "engine.h"
#include "errors.h"
#include "json.h"
#include "options.h"
#include "sysutil.h"
#include "sha256.h"

#ifndef LAYERDIFF_HARNESS_VERSION
#define LAYERDIFF_HARNESS_VERSION "0.0.0"
#endif

namespace ld {
namespace {

const char* kHarnessName = "layerdiff-harness";

std::string version_line() {
    std::string line = std::string(kHarnessName) + " " + LAYERDIFF_HARNESS_VERSION + " (";
    std::vector<std::string> engines = built_engines();
    for (size_t i = 0; i < engines.size(); ++i) {
        if (i) line += ", ";
        line += engines[i] + " " + engine_version(engines[i]);
    }
    return line + ", " + build_abi() + ")";
}

std::string probe_json() {
    JsonObject engines;
    for (const std::string& name : built_engines()) engines.add_raw(name, engine_probe_json(name));
    JsonObject probe;
    probe.add("harness", kHarnessName)
        .add("version", LAYERDIFF_HARNESS_VERSION)
        .add("abi", build_abi())
        .add_raw("engines", engines.str());
    return probe.str();
}

// The header names files by base name: staging paths on a phone say nothing about the model.
std::string base_name(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string model_list_json(const std::vector<std::string>& files) {
    std::vector<std::string> items;
    for (const std::string& file : files) {
        uint64_t size = 0;
        std::string digest = sha256_file(file, &size);
        items.push_back(JsonObject().add("file", base_name(file)).add("sha256", digest)
                            .add("bytes", static_cast<int64_t>(size)).str());
    }
    return json_array(items);
}

std::string input_list_json(const std::vector<NpyArray>& inputs) {
    std::vector<std::string> items;
    for (const NpyArray& input : inputs) {
        items.push_back(JsonObject().add("name", input.name).add("file", base_name(input.file))
                            .add("sha256", input.sha256).add("shape", input.shape)
                            .add("dtype", "float32").str());
    }
    return json_array(items);
}

std::string header_json(const Options& o, const EngineFacts& facts, const std::string& models_json,
                        const std::vector<NpyArray>& inputs, int repeat_index) {
    JsonObject header;
    header.add("record", "header")
        .add("format", "layerdiff-raw")
        .add("format_version", 1)
        .add("engine", facts.engine)
        .add("engine_version", facts.engine_version)
        .add("backend_requested", o.backend)
        .add("backends_actual", facts.backends_actual)
        .add("precision_requested", o.precision)
        .add("precision_effective", facts.precision_effective)
        .add("threads", facts.threads >= 0 ? facts.threads : o.threads)
        .add_raw("model", models_json)
        .add_raw("inputs", input_list_json(inputs))
        .add("harness", std::string(kHarnessName) + " " + LAYERDIFF_HARNESS_VERSION)
        .add("started", iso_utc_now())
        .add_raw("options", facts.options_json);
    if (o.repeat > 1) header.add("repeat", repeat_index);
    if (!o.replace.empty()) {  // a what-if run: the whole model, these outputs overwritten
        header.add("mode", "replace").add("replaced", o.replace).add("inject", base_name(o.inject_dir));
    } else if (!o.inject_dir.empty()) {  // an isolation run: each target op ran alone on reference inputs
        header.add("mode", "isolate").add("targets", o.targets).add("inject", base_name(o.inject_dir));
    }
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

std::vector<NpyArray> load_inputs(const Options& o) {
    std::vector<NpyArray> inputs;
    for (const auto& input : o.inputs) inputs.push_back(load_npy(input.first, input.second));
    return inputs;
}

// The engine, once the build has it and the model files are readable.
std::unique_ptr<Engine> checked_engine(const Options& o) {
    std::unique_ptr<Engine> engine = make_engine(o.engine);
    if (!engine) {
        throw HarnessError(kExitBackend, "engine " + o.engine + " is not built into this harness (" +
                                             version_line() + "); use a build with it");
    }
    for (const std::string& model : o.models) {
        if (!file_readable(model)) throw HarnessError(kExitModel, "cannot read model file " + model + ": check the path");
    }
    return engine;
}

// The model loaded for o's backend and precision.
RunConfig open_model(const Options& o, Engine& engine) {
    RunConfig config;
    config.model_files = o.models;
    config.backend = o.backend;
    config.precision = o.precision;
    config.threads = o.threads;
    config.isolate = !o.inject_dir.empty() && o.replace.empty();
    engine.open(config);
    return config;
}

// Adds the tensors a dump wrote to `total` however its run ends (--abort-after counts a process's tensors).
struct TensorTally {
    const DumpWriter& writer;
    int64_t& total;
    ~TensorTally() { total += writer.tensors(); }
};

// o.repeat raw dumps under o.out of the opened engine, each with its header, tensors and footer.
void dump_runs(const Options& o, Engine& engine, const RunConfig& config, const EngineFacts& facts,
               const std::string& models_json, const std::vector<NpyArray>& inputs, const DumpLimits& limits,
               int64_t& dumped) {
    std::unique_ptr<InjectSource> inject;
    if (!o.inject_dir.empty()) inject.reset(new InjectSource(o.inject_dir));
    for (int r = 0; r < o.repeat; ++r) {
        std::string dir = o.repeat > 1 ? join_path(o.out, "r" + std::to_string(r)) : o.out;
        int ops = config.isolate ? static_cast<int>(o.targets.size()) : engine.op_count();
        if (!o.replace.empty()) engine.replace_outputs(o.replace, *inject);  // before the dump: bad keys leave none
        DumpWriter writer(dir, limits, ops);
        TensorTally tally{writer, dumped};
        std::string header = header_json(o, facts, models_json, inputs, r);
        writer.write_header(header);
        // a what-if run is not the app's run by design; an engine without output names has no plain run
        bool plain = !config.isolate && o.replace.empty() && !engine.output_names().empty();
        if (plain) writer.watch(engine.output_names());
        double infer_ms = config.isolate ? engine.isolate(o.targets, *inject, writer) : engine.run(inputs, writer);
        std::string record;
        if (plain) record = plain_run_check([&] { return engine.plain_run(inputs); }, engine.observing(), writer, header);
        writer.write_footer(infer_ms, record);
    }
}

int run(const Options& o) {
    validate_options(o);
    std::unique_ptr<Engine> engine = checked_engine(o);
    std::vector<NpyArray> inputs = load_inputs(o);
    std::string models_json = model_list_json(o.models);
    RunConfig config = open_model(o, *engine);
    if (!config.isolate) engine->prepare(inputs);
    int64_t dumped = 0;
    dump_runs(o, *engine, config, engine->facts(), models_json, inputs, limits_from(o), dumped);
    return kExitOk;
}

// --each's progress on stdout (HARNESS_CLI.md): `@@ld {"event": "case", "case": K, "state": ...}`.
void case_event(size_t k, const char* state, int code = 0, const std::string& message = "") {
    JsonObject event;
    event.add("event", "case").add("case", static_cast<int64_t>(k)).add("state", state)
        .add("pid", static_cast<int64_t>(getpid()));
    if (code) event.add("code", code).add("message", message);
    std::printf("@@ld %s\n", event.str().c_str());
    std::fflush(stdout);
}

void case_failed(size_t k, int code, const std::string& message) {
    std::fflush(stdout);
    std::fprintf(stderr, "layerdiff-harness: %s\n", message.c_str());
    std::fflush(stderr);
    case_event(k, "failed", code, message);
}

// The engine, opened by the first run whose files are good, and kept for every later run.
struct EachEngine {
    std::unique_ptr<Engine> engine;
    RunConfig config;
    std::string models_json;
    bool prepared = false;
    EngineFacts facts;
};

// One line of --each as a run of its own: checked, fed and dumped exactly as `--out`/`--input` would.
void run_case(const Options& shared, const EachCase& one, EachEngine& each, int64_t& dumped) {
    Options o = shared;
    o.inputs = one.inputs;
    o.out = one.out;
    validate_options(o);
    std::vector<NpyArray> inputs = load_inputs(o);
    if (!each.engine) {  // a model that failed to load is tried again by the next run, as a process of its own would
        std::unique_ptr<Engine> engine = checked_engine(o);
        each.models_json = model_list_json(o.models);
        each.config = open_model(o, *engine);
        each.engine = std::move(engine);
    }
    if (!each.prepared) {  // the first run's inputs settle the engine's facts; later runs resize as they feed
        each.engine->prepare(inputs);
        each.facts = each.engine->facts();
        each.prepared = true;
    }
    DumpLimits limits = limits_from(o);
    if (o.abort_after >= 0) limits.abort_after = std::max<int64_t>(1, o.abort_after - dumped);
    dump_runs(o, *each.engine, each.config, each.facts, each.models_json, inputs, limits, dumped);
}

// --each FILE: every line a run in this one process, the model loaded once; each run's dump is written
// and closed before the next starts, so a crash keeps the runs before it. A run that fails says so on
// stdout with the exit code and line it would give alone, and the next one runs.
int run_each(const Options& shared, const std::string& path) {
    if (!shared.inputs.empty() || shared.repeat != 1 || !shared.inject_dir.empty() || !shared.targets.empty() ||
        !shared.replace.empty()) {
        throw HarnessError(kExitBadArgs, "--each takes each run's inputs from its file: no --input, --repeat, "
                                         "--inject, --target or --replace (see layerdiff-harness --help)");
    }
    std::vector<EachCase> cases = read_each_cases(path);
    EachEngine each;
    int64_t dumped = 0;
    for (size_t k = 0; k < cases.size(); ++k) {
        case_event(k, "start");
        try {
            run_case(shared, cases[k], each, dumped);
        } catch (const HarnessError& err) {
            case_failed(k, err.code(), err.what());
            continue;
        } catch (const std::bad_alloc&) {
            case_failed(k, kExitRun, "out of memory; try --layers or --max-bytes to dump less");
            continue;
        } catch (const std::exception& err) {
            case_failed(k, kExitRun, std::string("run failed: ") + err.what());
            continue;
        }
        case_event(k, "done");
    }
    return kExitOk;
}

// `--each FILE` taken out of the command line: the other options are every harness's (options.cpp, shared
// with engines that take one input a process); "" when absent.
std::string take_each(int* argc, char** argv) {
    std::string each;
    int kept = 1;
    for (int i = 1; i < *argc; ++i) {
        std::string flag = argv[i];
        if (flag == "--each" && i + 1 < *argc) {
            each = argv[++i];
            if (each.empty()) throw HarnessError(kExitBadArgs, "--each needs a FILE (see layerdiff-harness --help)");
            continue;
        }
        argv[kept++] = argv[i];
        bool takes_value = flag != "--version" && flag != "--probe" && flag != "--help" && flag != "-h";
        if (takes_value && i + 1 < *argc) argv[kept++] = argv[++i];
    }
    *argc = kept;
    return each;
}

}  // namespace
}  // namespace ld

int main(int argc, char** argv) {
    using namespace ld;
    try {
        std::string each = take_each(&argc, argv);
        Options o = parse_options(argc, argv);
        if (!each.empty() && o.mode == Mode::Run) return run_each(o, each);
        switch (o.mode) {
            case Mode::Help:
                std::fputs(usage_text(), stdout);
                std::fputs("       layerdiff-harness --engine ... --model ... --backend ... --precision ... --each FILE\n"
                           "                         (one run per line: {\"out\": DIR, \"inputs\": {NAME: FILE.npy}})\n",
                           stdout);
                return kExitOk;
            case Mode::Version: std::printf("%s\n", version_line().c_str()); return kExitOk;
            case Mode::Probe: std::printf("%s\n", probe_json().c_str()); return kExitOk;
            case Mode::Run: return run(o);
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
