// A small JSON reader for the one JSON input the harness takes: the manifest of an --inject dump.
// Recursive descent over the whole grammar (objects, arrays, strings with escapes, numbers,
// literals); values are kept as a plain tree. Errors throw HarnessError(kExitBadArgs).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ld {

struct JsonValue {
    enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
    bool boolean = false;
    double number = 0;
    std::string text;
    std::vector<JsonValue> items;
    std::vector<std::pair<std::string, JsonValue>> members;

    const JsonValue* find(const std::string& key) const;  // nullptr if absent or not an object
    std::string string_or(const std::string& key, const std::string& fallback) const;
    double number_or(const std::string& key, double fallback) const;
};

// `where` names the source in error messages (file and line).
JsonValue parse_json(const std::string& text, const std::string& where);

}  // namespace ld
