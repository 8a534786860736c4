#include "plain_run.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "errors.h"
#include "json.h"
#include "sysutil.h"

namespace ld {
namespace {

// {compared, identical, max_abs, rel_l2} of `other` against the plain values (NaN equal to NaN; a NaN or
// an infinity on one side only is an infinite difference, written as null: JSON has no infinity).
struct Difference {
    bool compared = false;
    bool identical = false;
    double max_abs = 0.0;
    double rel_l2 = 0.0;
    std::string json() const {
        if (!compared) return JsonObject().add("compared", false).str();
        return JsonObject().add("compared", true).add("identical", identical).add("max_abs", max_abs).add("rel_l2", rel_l2).str();
    }
};

Difference difference(const float* other, size_t count, const std::vector<float>& plain, bool comparable) {
    Difference out;
    if (!comparable || count != plain.size()) return out;
    bool identical = std::memcmp(other, plain.data(), count * sizeof(float)) == 0;
    double max_abs = 0.0, diff_sq = 0.0, norm_sq = 0.0;
    bool infinite = false;
    for (size_t i = 0; i < count; ++i) {
        double a = plain[i], b = other[i];
        if (std::isnan(a) || std::isnan(b)) {
            infinite = infinite || std::isnan(a) != std::isnan(b);
            continue;
        }
        if (a == b) {  // equal values, equal infinities included: no difference
            if (std::isfinite(a)) norm_sq += a * a;
            continue;
        }
        double d = b - a;
        if (!std::isfinite(d)) { infinite = true; continue; }
        max_abs = std::fabs(d) > max_abs ? std::fabs(d) : max_abs;
        diff_sq += d * d;
        norm_sq += a * a;
    }
    double rel = norm_sq > 0 ? std::sqrt(diff_sq / norm_sq) : (diff_sq > 0 ? INFINITY : 0.0);
    if (infinite) max_abs = rel = INFINITY;
    out.compared = true;
    out.identical = identical;
    out.max_abs = max_abs;
    out.rel_l2 = rel;
    return out;
}

const WatchedTensor* observed_of(const DumpWriter& writer, const std::string& name) {
    auto found = writer.watched().find(name);
    return found == writer.watched().end() ? nullptr : &found->second;
}

void check_io(bool ok, const std::string& what, const std::string& dir) {
    if (!ok) throw HarnessError(kExitWrite, "cannot " + what + " in " + dir + ": " + std::strerror(errno));
}

// The plain run's outputs as a raw dump (no progress lines: they are not layers of the observed run).
void write_plain_dump(const std::string& dir, const std::string& header_json, const DumpWriter& writer,
                      const std::vector<PlainOutput>& outputs, double infer_ms) {
    make_dirs(dir);
    FILE* manifest = std::fopen(join_path(dir, "manifest.jsonl").c_str(), "wb");
    check_io(manifest != nullptr, "create manifest.jsonl", dir);
    FILE* tensors = std::fopen(join_path(dir, "tensors.bin").c_str(), "wb");
    if (!tensors) std::fclose(manifest);
    check_io(tensors != nullptr, "create tensors.bin", dir);
    bool ok = std::fputs((header_json + "\n").c_str(), manifest) >= 0;
    int64_t offset = 0, order = 0;
    for (const PlainOutput& output : outputs) {
        const WatchedTensor* seen = observed_of(writer, output.name);
        uint64_t nbytes = output.values.size() * sizeof(float);
        ok = ok && std::fwrite(output.values.data(), 1, nbytes, tensors) == nbytes && std::fflush(tensors) == 0;
        JsonObject line;
        line.add("record", "tensor").add("order", order++)
            .add("op", seen ? seen->info.op : output.name)
            .add("op_type", seen ? seen->info.op_type : std::string("Output"))
            .add("output_index", seen ? seen->info.output_index : 0)
            .add("name", output.name)
            .add("inputs", std::vector<std::string>())
            .add("shape", output.shape)
            .add("dtype", "float32")
            .add("layout", seen ? seen->info.layout : std::string(""))
            .add("offset", offset)
            .add("nbytes", static_cast<int64_t>(nbytes))
            .add("memory", "host");
        ok = ok && std::fputs((line.str() + "\n").c_str(), manifest) >= 0;
        offset += static_cast<int64_t>(nbytes);
    }
    JsonObject footer;
    footer.add("record", "footer").add("tensors", order).add("bytes", offset).add("infer_ms", infer_ms)
        .add("finished", iso_utc_now()).add("status", "ok");
    ok = ok && std::fputs((footer.str() + "\n").c_str(), manifest) >= 0;
    ok = (std::fclose(tensors) == 0) && ok;
    ok = (std::fclose(manifest) == 0) && ok;
    check_io(ok, "write the plain run's outputs", dir);
}

}  // namespace

std::string plain_run_check(const std::function<std::vector<PlainOutput>()>& run_plain, const std::string& observing,
                            const DumpWriter& writer, const std::string& header_json) {
    double started = monotonic_ms();
    std::vector<PlainOutput> first = run_plain();
    double infer_ms = monotonic_ms() - started;
    std::vector<PlainOutput> second = run_plain();
    write_plain_dump(join_path(writer.dir(), "plain"), header_json, writer, first, infer_ms);
    std::map<std::string, const PlainOutput*> again;
    for (const PlainOutput& output : second) again[output.name] = &output;
    std::vector<std::string> entries;
    bool all_identical = !first.empty();
    for (const PlainOutput& output : first) {
        const WatchedTensor* seen = observed_of(writer, output.name);
        bool comparable = seen && seen->info.dtype == "float32" && seen->info.shape == output.shape;
        const float* observed = comparable ? reinterpret_cast<const float*>(seen->bytes.data()) : nullptr;
        size_t count = comparable ? seen->bytes.size() / sizeof(float) : 0;
        Difference vs_observed = difference(observed, count, output.values, comparable);
        all_identical = all_identical && vs_observed.compared && vs_observed.identical;
        const PlainOutput* other = again.count(output.name) ? again[output.name] : nullptr;
        Difference vs_second = difference(other ? other->values.data() : nullptr, other ? other->values.size() : 0,
                                                output.values, other && other->shape == output.shape);
        std::string key = (seen ? seen->info.op : output.name) + ":" + std::to_string(seen ? seen->info.output_index : 0);
        entries.push_back(JsonObject().add("name", output.name).add("key", key).add_raw("vs_observed", vs_observed.json())
                              .add_raw("vs_second_plain_run", vs_second.json()).str());
    }
    return JsonObject().add("runs", 2).add("observing", observing).add_raw("outputs", json_array(entries))
        .add("identical", all_identical).add("plain_outputs", "plain").add("infer_ms", infer_ms).str();
}

}  // namespace ld
