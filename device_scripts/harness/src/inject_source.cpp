#include "inject_source.h"

#include <cstdio>
#include <fstream>

#include "errors.h"
#include "json_read.h"
#include "sysutil.h"

namespace ld {
namespace {

[[noreturn]] void bad_inject(const std::string& where, const std::string& what) {
    throw HarnessError(kExitBadArgs, "inject dump " + where + ": " + what);
}

uint64_t file_size(const std::string& path) {
    FILE* file = std::fopen(path.c_str(), "rb");
    if (!file) return 0;
    std::fseek(file, 0, SEEK_END);
    long size = std::ftell(file);
    std::fclose(file);
    return size < 0 ? 0 : static_cast<uint64_t>(size);
}

}  // namespace

InjectSource::InjectSource(const std::string& dir) : dir_(dir) {
    std::string manifest = join_path(dir, "manifest.jsonl");
    std::string data = join_path(dir, "tensors.bin");
    std::ifstream in(manifest);
    if (!in) bad_inject(dir, "no readable manifest.jsonl (give a raw dump directory)");
    uint64_t data_size = file_size(data);
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        ++lineno;
        if (line.empty()) continue;
        std::string where = manifest + ":" + std::to_string(lineno);
        JsonValue record = parse_json(line, where);
        if (record.string_or("record", "") != "tensor") continue;
        if (record.string_or("dtype", "") != "float32") bad_inject(where, "only float32 tensors can be injected");
        InjectTensor t;
        t.name = record.string_or("name", "");
        t.offset = static_cast<uint64_t>(record.number_or("offset", -1));
        t.nbytes = static_cast<uint64_t>(record.number_or("nbytes", -1));
        const JsonValue* shape = record.find("shape");
        if (t.name.empty() || !shape || shape->kind != JsonValue::Kind::Array) bad_inject(where, "tensor line without name or shape");
        uint64_t elements = 1;
        for (const JsonValue& dim : shape->items) {
            if (dim.kind != JsonValue::Kind::Number || dim.number < 0 || dim.number > 1e12) bad_inject(where, "bad shape");
            t.shape.push_back(static_cast<int64_t>(dim.number));
            elements *= static_cast<uint64_t>(dim.number);
        }
        if (elements * 4 != t.nbytes || t.offset + t.nbytes > data_size) {
            bad_inject(where, "tensor '" + t.name + "' does not fit its shape or tensors.bin");
        }
        tensors_[t.name] = t;
    }
    if (lineno == 0) bad_inject(dir, "manifest.jsonl is empty");
}

const InjectTensor& InjectSource::info(const std::string& name) const {
    auto found = tensors_.find(name);
    if (found == tensors_.end()) bad_inject(dir_, "has no tensor named '" + name + "'");
    return found->second;
}

std::vector<float> InjectSource::read(const std::string& name) const {
    const InjectTensor& t = info(name);
    std::vector<float> values(t.nbytes / 4);
    FILE* file = std::fopen(join_path(dir_, "tensors.bin").c_str(), "rb");
    bool ok = file && std::fseek(file, static_cast<long>(t.offset), SEEK_SET) == 0 &&
              std::fread(values.data(), 1, t.nbytes, file) == t.nbytes;
    if (file) std::fclose(file);
    if (!ok) bad_inject(dir_, "cannot read tensor '" + name + "' from tensors.bin");
    return values;
}

}  // namespace ld
