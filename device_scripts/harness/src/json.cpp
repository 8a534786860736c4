#include "json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ld {

std::string json_quote(const std::string& text) {
    std::string out = "\"";
    for (unsigned char ch : text) {
        switch (ch) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (ch < 0x20) {
                    char esc[8];
                    std::snprintf(esc, sizeof esc, "\\u%04x", ch);
                    out += esc;
                } else {
                    out += static_cast<char>(ch);  // UTF-8 passes through unchanged
                }
        }
    }
    return out + "\"";
}

std::string json_number(double value) {
    if (!std::isfinite(value)) return "null";
    char text[40];
    for (int digits = 6; digits <= 17; ++digits) {
        std::snprintf(text, sizeof text, "%.*g", digits, value);
        if (std::strtod(text, nullptr) == value) break;
    }
    return text;
}

void JsonObject::key(const std::string& name) {
    if (!body_.empty()) body_ += ",";
    body_ += json_quote(name) + ":";
}

JsonObject& JsonObject::add(const std::string& name, const std::string& value) {
    key(name);
    body_ += json_quote(value);
    return *this;
}

JsonObject& JsonObject::add(const std::string& name, const char* value) {
    return add(name, std::string(value));
}

JsonObject& JsonObject::add(const std::string& name, int64_t value) {
    key(name);
    body_ += std::to_string(value);
    return *this;
}

JsonObject& JsonObject::add(const std::string& name, double value) {
    key(name);
    body_ += json_number(value);
    return *this;
}

JsonObject& JsonObject::add(const std::string& name, bool value) {
    key(name);
    body_ += value ? "true" : "false";
    return *this;
}

JsonObject& JsonObject::add(const std::string& name, const std::vector<std::string>& values) {
    std::vector<std::string> items;
    for (const auto& v : values) items.push_back(json_quote(v));
    return add_raw(name, json_array(items));
}

JsonObject& JsonObject::add(const std::string& name, const std::vector<int64_t>& values) {
    std::vector<std::string> items;
    for (int64_t v : values) items.push_back(std::to_string(v));
    return add_raw(name, json_array(items));
}

JsonObject& JsonObject::add_raw(const std::string& name, const std::string& json) {
    key(name);
    body_ += json;
    return *this;
}

std::string json_array(const std::vector<std::string>& raw_items) {
    std::string out = "[";
    for (size_t i = 0; i < raw_items.size(); ++i) {
        if (i) out += ",";
        out += raw_items[i];
    }
    return out + "]";
}

}  // namespace ld
