// A bounds-checked flatbuffers reader for the few tables of Paddle-Lite's ProgramDesc the harness
// needs (field ids from framework.fbs: ProgramDesc.blocks=0; BlockDesc.vars=2, ops=3; OpDesc
// type=0, inputs=1, outputs=2, attrs=3; Var parameter=0, arguments=1; Attr name=0, s=4;
// VarDesc name=0, persistable=2). Every offset is checked against the buffer before it is read.
#include "paddle_lite_model.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "errors.h"

namespace ld {
namespace {

const char* kKernelTypeAttr = "__@kernel_type_attr@__";  // "op/alias/target/precision/layout"

class FlatReader {
public:
    FlatReader(const std::string& buffer, const std::string& file) : buf_(buffer), file_(file) {}

    uint32_t root() const { return table_at(0); }

    // Position of field `id` of the table at `table`, or 0 when the field is absent.
    uint32_t field(uint32_t table, int id) const {
        int32_t soffset = i32(table);
        int64_t vtable = static_cast<int64_t>(table) - soffset;
        check(vtable >= 0 && vtable + 4 <= static_cast<int64_t>(buf_.size()), "vtable");
        uint16_t vsize = u16(static_cast<uint32_t>(vtable));
        uint32_t slot = 4 + 2 * static_cast<uint32_t>(id);
        if (slot + 2 > vsize) return 0;
        uint16_t at = u16(static_cast<uint32_t>(vtable) + slot);
        return at ? table + at : 0;
    }

    std::vector<uint32_t> tables(uint32_t table, int id) const {
        std::vector<uint32_t> out;
        uint32_t f = field(table, id);
        if (!f) return out;
        uint32_t vec = f + u32(f), n = u32(vec);
        check(static_cast<uint64_t>(vec) + 4 + 4ull * n <= buf_.size(), "vector");
        for (uint32_t i = 0; i < n; ++i) out.push_back(table_at(vec + 4 + 4 * i));
        return out;
    }

    std::vector<std::string> strings(uint32_t table, int id) const {
        std::vector<std::string> out;
        for (uint32_t at : tables(table, id)) out.push_back(string_at(at));
        return out;
    }

    std::string string(uint32_t table, int id) const {
        uint32_t f = field(table, id);
        return f ? string_at(f + u32(f)) : std::string();
    }

    bool boolean(uint32_t table, int id) const {
        uint32_t f = field(table, id);
        check(!f || f < buf_.size(), "bool");
        return f && buf_[f] != 0;
    }

private:
    uint32_t table_at(uint32_t at) const { return at + u32(at); }

    std::string string_at(uint32_t at) const {
        uint32_t n = u32(at);
        check(static_cast<uint64_t>(at) + 4 + n <= buf_.size(), "string");
        return buf_.substr(at + 4, n);
    }

    void check(bool ok, const char* what) const {
        if (!ok) throw HarnessError(kExitModel, file_ + ": not a Paddle-Lite .nb model (" + what + " out of bounds); optimise the model with Paddle-Lite's opt");
    }
    uint32_t u32(uint32_t at) const {
        check(static_cast<uint64_t>(at) + 4 <= buf_.size(), "offset");
        uint32_t v;
        std::memcpy(&v, buf_.data() + at, 4);
        return v;
    }
    int32_t i32(uint32_t at) const { return static_cast<int32_t>(u32(at)); }
    uint16_t u16(uint32_t at) const {
        check(static_cast<uint64_t>(at) + 2 <= buf_.size(), "offset");
        uint16_t v;
        std::memcpy(&v, buf_.data() + at, 2);
        return v;
    }

    const std::string& buf_;
    std::string file_;
};

std::vector<std::pair<std::string, std::vector<std::string>>> slots(const FlatReader& r, uint32_t op, int id) {
    std::vector<std::pair<std::string, std::vector<std::string>>> out;
    for (uint32_t var : r.tables(op, id)) out.emplace_back(r.string(var, 0), r.strings(var, 1));
    return out;
}

void read_kernel_place(const FlatReader& r, uint32_t op, NbOp* out) {
    for (uint32_t attr : r.tables(op, 3)) {
        if (r.string(attr, 0) != kKernelTypeAttr) continue;
        std::stringstream parts(r.string(attr, 4));
        std::string item;
        std::vector<std::string> fields;
        while (std::getline(parts, item, '/')) fields.push_back(item);
        if (fields.size() >= 5) {
            out->alias = fields[fields.size() - 4];
            out->target = std::atoi(fields[fields.size() - 3].c_str());
            out->precision = std::atoi(fields[fields.size() - 2].c_str());
        }
    }
}

}  // namespace

NbProgram read_nb_program(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw HarnessError(kExitModel, "cannot read model file " + path);
    char head[26];
    in.read(head, sizeof(head));
    if (in.gcount() != static_cast<std::streamsize>(sizeof(head))) {
        throw HarnessError(kExitModel, path + ": too short for a Paddle-Lite .nb model");
    }
    NbProgram program;
    uint16_t meta = 0;
    uint64_t topo_size = 0;
    std::memcpy(&meta, head, 2);
    std::memcpy(&topo_size, head + 18, 8);
    program.meta_version = meta;
    program.opt_version = std::string(head + 2, strnlen(head + 2, 16));
    if (meta != 1 && meta != 2) {
        throw HarnessError(kExitModel, path + ": not a Paddle-Lite .nb model of v2.7 or later (meta version " +
                                           std::to_string(meta) + "); optimise it with a current opt");
    }
    in.seekg(0, std::ios::end);
    uint64_t size = static_cast<uint64_t>(in.tellg());
    if (topo_size < 8 || topo_size > size - 26) {
        throw HarnessError(kExitModel, path + ": its program size (" + std::to_string(topo_size) + " bytes) does not fit the file");
    }
    std::string buffer(static_cast<size_t>(topo_size), '\0');
    in.seekg(26);
    in.read(&buffer[0], static_cast<std::streamsize>(topo_size));
    FlatReader r(buffer, path);
    std::vector<uint32_t> blocks = r.tables(r.root(), 0);
    if (blocks.empty()) throw HarnessError(kExitModel, path + ": the .nb program has no block");
    for (uint32_t var : r.tables(blocks[0], 2)) program.vars.push_back({r.string(var, 0), r.boolean(var, 2)});
    for (uint32_t op : r.tables(blocks[0], 3)) {
        NbOp parsed;
        parsed.type = r.string(op, 0);
        parsed.inputs = slots(r, op, 1);
        parsed.outputs = slots(r, op, 2);
        read_kernel_place(r, op, &parsed);
        program.ops.push_back(std::move(parsed));
    }
    if (program.ops.empty()) throw HarnessError(kExitModel, path + ": the .nb program has no op");
    return program;
}

std::string nb_target_name(int target) {
    switch (target) {
        case kNbHost: return "host";
        case kNbX86: return "x86";
        case kNbARM: return "arm";
        case kNbOpenCL: return "opencl";
        default: return "target " + std::to_string(target);
    }
}

}  // namespace ld
