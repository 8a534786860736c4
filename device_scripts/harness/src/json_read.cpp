#include "json_read.h"

#include <cmath>
#include <cstdlib>

#include "errors.h"

namespace ld {
namespace {

class Parser {
public:
    Parser(const std::string& text, const std::string& where) : s_(text), where_(where) {}

    JsonValue document() {
        JsonValue value = parse_value(0);
        skip_space();
        if (pos_ != s_.size()) fail("trailing characters");
        return value;
    }

private:
    [[noreturn]] void fail(const std::string& what) {
        throw HarnessError(kExitBadArgs, where_ + ": invalid JSON (" + what + " at character " + std::to_string(pos_) + ")");
    }

    void skip_space() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
    }

    bool consume(char ch) {
        skip_space();
        if (pos_ < s_.size() && s_[pos_] == ch) {
            ++pos_;
            return true;
        }
        return false;
    }

    void expect(char ch) {
        if (!consume(ch)) fail(std::string("expected '") + ch + "'");
    }

    JsonValue parse_value(int depth) {
        if (depth > 64) fail("nesting too deep");
        skip_space();
        if (pos_ >= s_.size()) fail("unexpected end");
        char ch = s_[pos_];
        JsonValue v;
        if (ch == '{') {
            v.kind = JsonValue::Kind::Object;
            ++pos_;
            if (consume('}')) return v;
            do {
                skip_space();
                std::string key = parse_string();
                expect(':');
                v.members.emplace_back(key, parse_value(depth + 1));
            } while (consume(','));
            expect('}');
        } else if (ch == '[') {
            v.kind = JsonValue::Kind::Array;
            ++pos_;
            if (consume(']')) return v;
            do {
                v.items.push_back(parse_value(depth + 1));
            } while (consume(','));
            expect(']');
        } else if (ch == '"') {
            v.kind = JsonValue::Kind::String;
            v.text = parse_string();
        } else if (s_.compare(pos_, 4, "true") == 0) {
            v.kind = JsonValue::Kind::Bool;
            v.boolean = true;
            pos_ += 4;
        } else if (s_.compare(pos_, 5, "false") == 0) {
            v.kind = JsonValue::Kind::Bool;
            pos_ += 5;
        } else if (s_.compare(pos_, 4, "null") == 0) {
            pos_ += 4;
        } else if (s_.compare(pos_, 3, "NaN") == 0 || s_.compare(pos_, 8, "Infinity") == 0 ||
                   s_.compare(pos_, 9, "-Infinity") == 0) {
            // Python's json module writes these by default; accept what our own tools emit.
            v.kind = JsonValue::Kind::Number;
            bool negative = s_[pos_] == '-';
            bool nan = s_[pos_] == 'N';
            pos_ += nan ? 3 : (negative ? 9 : 8);
            v.number = nan ? std::nan("") : (negative ? -HUGE_VAL : HUGE_VAL);
        } else {
            v.kind = JsonValue::Kind::Number;
            const char* start = s_.c_str() + pos_;
            char* end = nullptr;
            v.number = std::strtod(start, &end);
            if (end == start) fail("unexpected character");
            pos_ += static_cast<size_t>(end - start);
        }
        return v;
    }

    void append_utf8(std::string& out, unsigned code) {
        if (code < 0x80) {
            out += static_cast<char>(code);
        } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
        } else if (code < 0x10000) {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (code >> 18));
            out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
        }
    }

    unsigned hex4() {
        if (pos_ + 4 > s_.size()) fail("short \\u escape");
        unsigned code = 0;
        for (int i = 0; i < 4; ++i) {
            char h = s_[pos_++];
            code <<= 4;
            if (h >= '0' && h <= '9') code |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f') code |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') code |= unsigned(h - 'A' + 10);
            else fail("bad \\u escape");
        }
        return code;
    }

    std::string parse_string() {
        if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string");
        ++pos_;
        std::string out;
        while (pos_ < s_.size() && s_[pos_] != '"') {
            char ch = s_[pos_++];
            if (ch != '\\') {
                out += ch;
                continue;
            }
            if (pos_ >= s_.size()) fail("unterminated escape");
            char esc = s_[pos_++];
            switch (esc) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    unsigned code = hex4();
                    if (code >= 0xD800 && code < 0xDC00 && s_.compare(pos_, 2, "\\u") == 0) {
                        pos_ += 2;
                        unsigned low = hex4();
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                    }
                    append_utf8(out, code);
                    break;
                }
                default: fail("unknown escape");
            }
        }
        if (pos_ >= s_.size()) fail("unterminated string");
        ++pos_;
        return out;
    }

    const std::string& s_;
    std::string where_;
    size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(const std::string& key) const {
    if (kind != Kind::Object) return nullptr;
    for (const auto& member : members) {
        if (member.first == key) return &member.second;
    }
    return nullptr;
}

std::string JsonValue::string_or(const std::string& key, const std::string& fallback) const {
    const JsonValue* v = find(key);
    return v && v->kind == Kind::String ? v->text : fallback;
}

double JsonValue::number_or(const std::string& key, double fallback) const {
    const JsonValue* v = find(key);
    return v && v->kind == Kind::Number ? v->number : fallback;
}

JsonValue parse_json(const std::string& text, const std::string& where) {
    return Parser(text, where).document();
}

}  // namespace ld
