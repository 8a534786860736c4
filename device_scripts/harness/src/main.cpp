// layerdiff-harness entry point: parse, load, run, dump; map every failure to one exit code and
// one "layerdiff-harness: ..." line on stderr (HARNESS_CLI.md).
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

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

int run(const Options& o) {
    validate_options(o);
    std::unique_ptr<Engine> engine = make_engine(o.engine);
    if (!engine) {
        throw HarnessError(kExitBackend, "engine " + o.engine + " is not built into this harness (" +
                                             version_line() + "); use a build with it");
    }
    for (const std::string& model : o.models) {
        if (!file_readable(model)) throw HarnessError(kExitModel, "cannot read model file " + model + ": check the path");
    }
    std::vector<NpyArray> inputs;
    for (const auto& input : o.inputs) inputs.push_back(load_npy(input.first, input.second));
    std::string models_json = model_list_json(o.models);

    RunConfig config;
    config.model_files = o.models;
    config.backend = o.backend;
    config.precision = o.precision;
    config.threads = o.threads;
    config.isolate = !o.inject_dir.empty() && o.replace.empty();
    engine->open(config);
    if (!config.isolate) engine->prepare(inputs);
    EngineFacts facts = engine->facts();

    std::unique_ptr<InjectSource> inject;
    if (!o.inject_dir.empty()) inject.reset(new InjectSource(o.inject_dir));
    for (int r = 0; r < o.repeat; ++r) {
        std::string dir = o.repeat > 1 ? join_path(o.out, "r" + std::to_string(r)) : o.out;
        int ops = config.isolate ? static_cast<int>(o.targets.size()) : engine->op_count();
        if (!o.replace.empty()) engine->replace_outputs(o.replace, *inject);  // before the dump: bad keys leave none
        DumpWriter writer(dir, limits_from(o), ops);
        std::string header = header_json(o, facts, models_json, inputs, r);
        writer.write_header(header);
        // a what-if run is not the app's run by design; an engine without output names has no plain run
        bool plain = !config.isolate && o.replace.empty() && !engine->output_names().empty();
        if (plain) writer.watch(engine->output_names());
        double infer_ms = config.isolate ? engine->isolate(o.targets, *inject, writer) : engine->run(inputs, writer);
        std::string record;
        if (plain) record = plain_run_check([&] { return engine->plain_run(inputs); }, engine->observing(), writer, header);
        writer.write_footer(infer_ms, record);
    }
    return kExitOk;
}

}  // namespace
}  // namespace ld

int main(int argc, char** argv) {
    using namespace ld;
    try {
        Options o = parse_options(argc, argv);
        switch (o.mode) {
            case Mode::Help: std::fputs(usage_text(), stdout); return kExitOk;
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
