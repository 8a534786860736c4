#include "each_cases.h"

#include <cstdio>
#include <memory>
#include <set>

#include "errors.h"
#include "json_read.h"

namespace ld {
namespace {

// Generous for any real data set (200 inputs take a few KB), small enough that a wrong or hostile file
// costs a clear line rather than the device's memory.
const long kMaxFileBytes = 64L << 20;
const size_t kMaxLineBytes = 64 << 10;
const size_t kMaxCases = 1000000;
const size_t kMaxInputs = 256;
const size_t kMaxPathBytes = 4096;
const size_t kMaxNameBytes = 1024;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
    throw HarnessError(kExitBadArgs, "--each " + where + ": " + what);
}

std::string read_bounded(const std::string& path) {
    std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
    if (!file) bad(path, "not readable; check the path");
    std::string text;
    char buffer[1 << 16];
    size_t got = 0;
    while ((got = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
        text.append(buffer, got);
        if (static_cast<long>(text.size()) > kMaxFileBytes) {
            bad(path, "larger than " + std::to_string(kMaxFileBytes >> 20) + " MiB; split the inputs over several files");
        }
    }
    if (std::ferror(file.get())) bad(path, "read error");
    return text;
}

// A string member that names a file or an input: present, a string, bounded, no NUL byte.
std::string text_field(const JsonValue& value, const std::string& where, const std::string& what, size_t limit) {
    if (value.kind != JsonValue::Kind::String) bad(where, what + " is not a string");
    if (value.text.empty()) bad(where, what + " is empty");
    if (value.text.size() > limit) bad(where, what + " is longer than " + std::to_string(limit) + " bytes");
    if (value.text.find('\0') != std::string::npos) bad(where, what + " holds a NUL character");
    return value.text;
}

// `path` as the harness opens it: relative ones from the cases file's directory (`base`, "" or ending in '/').
std::string beside(const std::string& base, const std::string& path) {
    return path[0] == '/' ? path : base + path;
}

EachCase parse_case(const std::string& line, const std::string& where, const std::string& base) {
    JsonValue value = parse_json(line, "--each " + where);
    if (value.kind != JsonValue::Kind::Object) bad(where, "not an {\"out\", \"inputs\"} object");
    const JsonValue* out = value.find("out");
    const JsonValue* inputs = value.find("inputs");
    if (!out || !inputs) bad(where, "not an {\"out\", \"inputs\"} object (both are required)");
    EachCase one;
    one.out = beside(base, text_field(*out, where, "\"out\"", kMaxPathBytes));
    if (inputs->kind != JsonValue::Kind::Object) bad(where, "\"inputs\" is not an object of NAME: FILE.npy");
    if (inputs->members.empty()) bad(where, "\"inputs\" names no input");
    if (inputs->members.size() > kMaxInputs) bad(where, "more than " + std::to_string(kMaxInputs) + " inputs");
    std::set<std::string> seen;
    for (const auto& member : inputs->members) {
        std::string name = member.first;
        if (name.empty() || name.size() > kMaxNameBytes || name.find('\0') != std::string::npos) {
            bad(where, "an input name is empty, longer than " + std::to_string(kMaxNameBytes) + " bytes or holds NUL");
        }
        if (!seen.insert(name).second) bad(where, "input '" + name + "' is named twice");
        one.inputs.emplace_back(name, beside(base, text_field(member.second, where, "input '" + name + "'", kMaxPathBytes)));
    }
    return one;
}

}  // namespace

std::vector<EachCase> read_each_cases(const std::string& path) {
    std::string text = read_bounded(path);
    size_t slash = path.rfind('/');
    std::string base = slash == std::string::npos ? "" : path.substr(0, slash + 1);
    std::vector<EachCase> cases;
    size_t start = 0;
    for (size_t number = 1; start < text.size(); ++number) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(start, end - start);
        start = end + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        std::string where = path + " line " + std::to_string(number);
        if (line.size() > kMaxLineBytes) bad(where, "longer than " + std::to_string(kMaxLineBytes) + " bytes");
        if (cases.size() >= kMaxCases) bad(path, "more than " + std::to_string(kMaxCases) + " runs");
        cases.push_back(parse_case(line, where, base));
    }
    if (cases.empty()) bad(path, "names no run (one {\"out\", \"inputs\"} object a line)");
    return cases;
}

}  // namespace ld
