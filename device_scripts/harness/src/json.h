// Minimal JSON output: the harness only ever writes flat-ish objects (manifest lines, --probe),
// so a string builder with correct escaping is all we need; no dependency to vendor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ld {

std::string json_quote(const std::string& text);   // "..." with JSON escapes
std::string json_number(double value);             // shortest round-trip form; null for NaN/Inf

// Builds one JSON object, keys in insertion order.
class JsonObject {
public:
    JsonObject& add(const std::string& key, const std::string& value);
    JsonObject& add(const std::string& key, const char* value);
    JsonObject& add(const std::string& key, int64_t value);
    JsonObject& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
    JsonObject& add(const std::string& key, double value);
    JsonObject& add(const std::string& key, bool value);
    JsonObject& add(const std::string& key, const std::vector<std::string>& values);
    JsonObject& add(const std::string& key, const std::vector<int64_t>& values);
    JsonObject& add_raw(const std::string& key, const std::string& json);  // value already JSON
    std::string str() const { return "{" + body_ + "}"; }
    bool empty() const { return body_.empty(); }

private:
    void key(const std::string& name);
    std::string body_;
};

std::string json_array(const std::vector<std::string>& raw_items);  // items already JSON

}  // namespace ld
