// MNN op/tensor names from the model buffer: see mnn_model.h. The FlatBuffers binary layout
// (flatbuffers.dev, "Internals"): a table starts with an int32 offset back to its vtable, whose
// uint16 entries, after two size fields, give each field's offset in the table (0: absent);
// vectors and strings are reached through a uint32 offset and start with a uint32 length.
// Every read is bounds-checked: a truncated or hostile file gives an empty table, never a crash.
#include "mnn_model.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace ld {
namespace {

// Field slots in MNN.fbs (table Net / table Op), in declaration order; a union takes two slots.
// The same numbers as collector/engines/mnn/model.py.
constexpr int kNetOplists = 3, kNetOutputName = 4, kNetTensorName = 7;
constexpr int kOpName = 3, kOpOutputIndexes = 4;

class FlatReader {
public:
    FlatReader(const void* data, size_t size) : data_(static_cast<const uint8_t*>(data)), size_(size) {}

    size_t root() const { return u32(0); }

    // Position of a field's value in the table at `table`, 0 when the field is absent.
    size_t field(size_t table, int slot) const {
        size_t vtable = table - static_cast<size_t>(static_cast<int64_t>(i32(table)));
        size_t entry = 4 + 2 * static_cast<size_t>(slot);
        if (entry + 2 > u16(vtable)) return 0;
        uint16_t offset = u16(vtable + entry);
        return offset ? table + offset : 0;
    }

    // (first element, count) of the vector a field points at; count 0 when absent.
    std::pair<size_t, size_t> vector(size_t table, int slot) const {
        size_t at = field(table, slot);
        if (!at) return {0, 0};
        size_t vec = indirect(at);
        size_t count = u32(vec);
        check(vec + 4, 0);
        if (count > (size_ - vec - 4) / 4) throw std::out_of_range("mnn model buffer");  // no overflow on 32-bit
        return {vec + 4, count};
    }

    std::string string_at(size_t at) const {
        size_t str = indirect(at);
        size_t length = u32(str);
        check(str + 4, length);
        return std::string(reinterpret_cast<const char*>(data_ + str + 4), length);
    }

    size_t indirect(size_t at) const { return at + u32(at); }
    int32_t i32(size_t at) const { return static_cast<int32_t>(u32(at)); }

private:
    void check(size_t at, size_t n) const {
        if (at > size_ || n > size_ - at) throw std::out_of_range("mnn model buffer");
    }
    uint32_t u32(size_t at) const {
        check(at, 4);
        uint32_t v;
        std::memcpy(&v, data_ + at, 4);  // little endian, as FlatBuffers and our targets are
        return v;
    }
    uint16_t u16(size_t at) const {
        check(at, 2);
        uint16_t v;
        std::memcpy(&v, data_ + at, 2);
        return v;
    }

    const uint8_t* data_;
    size_t size_;
};

std::vector<std::string> strings(const FlatReader& r, size_t table, int slot) {
    std::vector<std::string> out;
    std::pair<size_t, size_t> vec = r.vector(table, slot);
    for (size_t i = 0; i < vec.second; ++i) out.push_back(r.string_at(vec.first + 4 * i));
    return out;
}

}  // namespace

bool MnnOps::key(const std::string& op, size_t index, std::pair<std::string, std::string>* key) const {
    auto found = writes.find(op);
    if (found == writes.end() || index >= found->second.size()) return false;
    const std::string& first = found->second[0];
    std::string scope = op + "/";
    std::string dump_op = first.compare(0, scope.size(), scope) == 0 ? op : first;
    *key = {dump_op, index ? found->second[index] : dump_op};
    return true;
}

MnnOps read_mnn_ops(const void* data, size_t size) {
    MnnOps ops;
    if (data == nullptr) return ops;
    try {
        FlatReader r(data, size);
        size_t net = r.root();
        std::vector<std::string> names = strings(r, net, kNetTensorName);
        std::pair<size_t, size_t> oplists = r.vector(net, kNetOplists);
        for (size_t k = 0; k < oplists.second; ++k) {
            size_t op = r.indirect(oplists.first + 4 * k);
            size_t name = r.field(op, kOpName);
            if (!name) continue;
            std::vector<std::string>& writes = ops.writes[r.string_at(name)];
            writes.clear();  // a repeated op name: the last one wins, as in the Python reader's dict
            std::pair<size_t, size_t> indexes = r.vector(op, kOpOutputIndexes);
            for (size_t i = 0; i < indexes.second; ++i) {
                int32_t index = r.i32(indexes.first + 4 * i);
                if (index >= 0 && static_cast<size_t>(index) < names.size()) writes.push_back(names[index]);
            }
        }
        ops.outputs = strings(r, net, kNetOutputName);
    } catch (const std::out_of_range&) {
        return MnnOps();
    }
    return ops;
}

std::string MnnDumpKeys::graph_op(const std::string& op) const {
    std::pair<std::string, std::string> keyed;
    return ops_.key(op, 0, &keyed) ? keyed.first : op;
}

std::pair<std::string, std::string> MnnDumpKeys::key(const std::string& op, size_t index) {
    std::pair<std::string, std::string> keyed;
    if (!ops_.key(op, index, &keyed)) keyed = {op, index == 0 ? op : op + ":" + std::to_string(index)};
    if (used_.count(keyed.second)) {
        std::string base = keyed.second;
        int k = 1;
        while (used_.count(base + "#" + std::to_string(k))) ++k;
        keyed.second = base + "#" + std::to_string(k);
        if (index == 0) keyed.first = keyed.second;
    }
    used_.insert(keyed.second);
    return keyed;
}

}  // namespace ld
