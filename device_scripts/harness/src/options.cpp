#include "options.h"

#include <cstdlib>
#include <regex>

#include "engine.h"
#include "errors.h"
#include "sysutil.h"

namespace ld {
namespace {

[[noreturn]] void bad(const std::string& what) {
    throw HarnessError(kExitBadArgs, what + " (see layerdiff-harness --help)");
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min_value) {
    char* end = nullptr;
    long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || value < min_value) {
        bad(flag + " needs an integer >= " + std::to_string(min_value) + ", got '" + text + "'");
    }
    return value;
}

}  // namespace

const char* usage_text() {
    return "usage: layerdiff-harness --engine ncnn|mnn|paddle-lite --model FILE [--model FILE2]\n"
           "                         --input NAME=FILE.npy [--input ...]\n"
           "                         --backend cpu|opencl|vulkan --precision low|normal|high\n"
           "                         --out DIR [--threads N] [--layers REGEX] [--max-bytes N]\n"
           "                         [--repeat N] [--abort-after K]\n"
           "                         [--inject DIR --target KEY [--target KEY ...]]\n"
           "                         [--inject DIR --replace KEY [--replace KEY ...]]\n"
           "       layerdiff-harness --version\n"
           "       layerdiff-harness --probe\n";
}

Options parse_options(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i];
        if (flag == "--version") { o.mode = Mode::Version; continue; }
        if (flag == "--probe") { o.mode = Mode::Probe; continue; }
        if (flag == "--help" || flag == "-h") { o.mode = Mode::Help; continue; }
        if (i + 1 >= argc) bad("option " + flag + " needs a value");
        std::string value = argv[++i];
        if (flag == "--engine") o.engine = value;
        else if (flag == "--model") o.models.push_back(value);
        else if (flag == "--input") {
            size_t eq = value.find('=');
            if (eq == std::string::npos || eq == 0 || eq + 1 == value.size()) bad("--input needs NAME=FILE.npy, got '" + value + "'");
            o.inputs.emplace_back(value.substr(0, eq), value.substr(eq + 1));
        }
        else if (flag == "--backend") o.backend = value;
        else if (flag == "--precision") o.precision = value;
        else if (flag == "--out") o.out = value;
        else if (flag == "--threads") o.threads = static_cast<int>(parse_int(flag, value, 1));
        else if (flag == "--layers") o.layers = value;
        else if (flag == "--max-bytes") o.max_bytes = parse_int(flag, value, 0);
        else if (flag == "--repeat") o.repeat = static_cast<int>(parse_int(flag, value, 1));
        else if (flag == "--abort-after") o.abort_after = parse_int(flag, value, 1);
        else if (flag == "--inject") o.inject_dir = value;
        else if (flag == "--target") o.targets.push_back(value);
        else if (flag == "--replace") o.replace.push_back(value);
        else bad("unknown option " + flag);
    }
    return o;
}

void validate_options(const Options& o) {
    if (o.engine != "ncnn" && o.engine != "mnn" && o.engine != "paddle-lite") bad("--engine must be ncnn, mnn or paddle-lite, got '" + o.engine + "'");
    if (!known_backend(o.backend)) bad("--backend must be cpu, opencl or vulkan, got '" + o.backend + "'");
    if (!known_precision(o.precision)) bad("--precision must be low, normal or high, got '" + o.precision + "'");
    size_t want_models = o.engine == "ncnn" ? 2 : 1;
    if (o.models.size() != want_models) {
        bad(o.engine == "ncnn" ? "ncnn needs --model FILE.param --model FILE.bin"
                               : "mnn needs exactly one --model FILE.mnn");
    }
    bool isolating = !o.inject_dir.empty() && o.replace.empty();
    if (o.inputs.empty() && !isolating) bad("at least one --input NAME=FILE.npy is required");
    for (const auto& input : o.inputs) {
        if (!file_readable(input.second)) bad("cannot read input file " + input.second + " for " + input.first);
    }
    if (o.out.empty()) bad("--out DIR is required");
    if (!dir_absent_or_empty(o.out)) bad("output directory " + o.out + " is not empty: choose a new --out");
    if (!o.layers.empty()) {
        try {
            std::regex check(o.layers, std::regex::ECMAScript);
        } catch (const std::regex_error&) {
            bad("--layers '" + o.layers + "' is not a valid regular expression");
        }
    }
    if (!o.replace.empty() && (o.inject_dir.empty() || !o.targets.empty())) {
        bad("--replace KEY needs --inject DIR (the tensors) and no --target");
    }
    if (isolating && o.targets.empty()) bad("--inject needs at least one --target KEY");
    if (o.inject_dir.empty() && !o.targets.empty()) bad("--target needs --inject DIR");
}

}  // namespace ld
