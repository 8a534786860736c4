#include "dump_writer.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "errors.h"
#include "json.h"
#include "sysutil.h"

namespace ld {

size_t dtype_size(const std::string& dtype) {
    if (dtype == "float32" || dtype == "int32") return 4;
    if (dtype == "float16" || dtype == "int16") return 2;
    if (dtype == "float64" || dtype == "int64") return 8;
    if (dtype == "int8" || dtype == "uint8") return 1;
    return 0;
}

DumpWriter::DumpWriter(const std::string& dir, const DumpLimits& limits, int64_t ops_total)
    : dir_(dir), limits_(limits), ops_total_(ops_total) {
    make_dirs(dir);
    manifest_ = std::fopen(join_path(dir, "manifest.jsonl").c_str(), "wb");
    check_io(manifest_ != nullptr, "create manifest.jsonl");
    tensors_ = std::fopen(join_path(dir, "tensors.bin").c_str(), "wb");
    check_io(tensors_ != nullptr, "create tensors.bin");
    summary_ = std::make_unique<SummaryWriter>(dir);
}

DumpWriter::~DumpWriter() {
    if (tensors_) std::fclose(tensors_);
    if (manifest_) std::fclose(manifest_);
}

void DumpWriter::check_io(bool ok, const std::string& what) {
    if (!ok) {
        throw HarnessError(kExitWrite, "cannot " + what + " in " + dir_ + ": " + std::strerror(errno) +
                                           " (check free space and permissions)");
    }
}

void DumpWriter::write_header(const std::string& header_json) {
    check_io(std::fputs((header_json + "\n").c_str(), manifest_) >= 0, "write manifest.jsonl");
    check_io(std::fflush(manifest_) == 0, "flush manifest.jsonl");
}

bool DumpWriter::wants(const std::string& op) const {
    if (budget_hit_) return false;
    if (limits_.has_filter && !std::regex_search(op, limits_.filter)) return false;
    return true;
}

bool DumpWriter::begin(const TensorInfo& info, uint64_t nbytes) {
    if (limits_.max_bytes >= 0 && static_cast<int64_t>(offset_ - fed_bytes_ + nbytes) > limits_.max_bytes) {
        budget_hit_ = true;
        return false;
    }
    uint64_t elements = 1;
    for (int64_t dim : info.shape) elements *= static_cast<uint64_t>(dim);
    if (elements * dtype_size(info.dtype) != nbytes) {
        throw HarnessError(kExitRun, "layer " + info.op + ": " + std::to_string(nbytes) +
                                         " bytes do not match its shape and dtype");
    }
    current_ = info;
    current_expected_ = nbytes;
    current_written_ = 0;
    sketch_.begin(info.dtype, static_cast<int64_t>(elements));
    watching_current_ = watched_names_.count(info.name) > 0 && watched_.count(info.name) == 0;
    if (watching_current_) watched_[info.name] = WatchedTensor{info, {}};
    return true;
}

void DumpWriter::append(const void* data, size_t size) {
    if (size == 0) return;
    check_io(std::fwrite(data, 1, size, tensors_) == size, "write tensors.bin");
    current_written_ += size;
    sketch_.add(data, size);
    if (watching_current_) {
        const unsigned char* bytes = static_cast<const unsigned char*>(data);
        std::vector<unsigned char>& kept = watched_[current_.name].bytes;
        kept.insert(kept.end(), bytes, bytes + size);
    }
}

void DumpWriter::end() {
    if (current_written_ != current_expected_) {
        throw HarnessError(kExitRun, "layer " + current_.op + ": wrote " + std::to_string(current_written_) +
                                         " of " + std::to_string(current_expected_) + " bytes");
    }
    // Bytes first, then the line that points at them: a cut-short dump never names missing bytes.
    check_io(std::fflush(tensors_) == 0, "flush tensors.bin");
    JsonObject line;
    line.add("record", "tensor")
        .add("order", count_)
        .add("op", current_.op)
        .add("op_type", current_.op_type)
        .add("output_index", current_.output_index)
        .add("name", current_.name)
        .add("inputs", current_.inputs)
        .add("shape", current_.shape)
        .add("dtype", current_.dtype)
        .add("layout", current_.layout)
        .add("offset", static_cast<int64_t>(offset_))
        .add("nbytes", static_cast<int64_t>(current_expected_))
        .add("memory", current_.memory);
    if (current_.time_ms >= 0) line.add("time_ms", current_.time_ms);
    check_io(std::fputs((line.str() + "\n").c_str(), manifest_) >= 0, "write manifest.jsonl");
    check_io(std::fflush(manifest_) == 0, "flush manifest.jsonl");
    summary_->write(count_, current_.name, current_.dtype, sketch_);
    offset_ += current_expected_;
    ++count_;

    JsonObject progress;
    progress.add("event", "tensor").add("k", count_).add("n", ops_total_).add("op", current_.op);
    std::printf("@@ld %s\n", progress.str().c_str());
    std::fflush(stdout);
    if (limits_.abort_after >= 0 && count_ >= limits_.abort_after) {
        std::fprintf(stderr, "layerdiff-harness: --abort-after %lld reached; aborting on purpose\n",
                     static_cast<long long>(limits_.abort_after));
        std::abort();
    }
}

void DumpWriter::write(const TensorInfo& info, const void* data, uint64_t nbytes) {
    if (!begin(info, nbytes)) return;
    append(data, nbytes);
    end();
}

void DumpWriter::write_fed(const std::string& name, const std::vector<int64_t>& shape, const std::string& dtype,
                           const std::string& layout, const void* data, uint64_t nbytes) {
    if (nbytes > 0) check_io(std::fwrite(data, 1, nbytes, tensors_) == nbytes, "write tensors.bin");
    check_io(std::fflush(tensors_) == 0, "flush tensors.bin");
    std::vector<int64_t> axes;
    for (size_t i = 0; i < shape.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    JsonObject line;
    line.add("record", "input_fed")
        .add("name", name)
        .add("shape", shape)
        .add("dtype", dtype)
        .add("layout", layout)
        .add("axes", axes)
        .add("offset", static_cast<int64_t>(offset_))
        .add("nbytes", static_cast<int64_t>(nbytes));
    check_io(std::fputs((line.str() + "\n").c_str(), manifest_) >= 0, "write manifest.jsonl");
    check_io(std::fflush(manifest_) == 0, "flush manifest.jsonl");
    offset_ += nbytes;
    fed_bytes_ += nbytes;  // the run's inputs: not counted against --max-bytes
}

void DumpWriter::write_footer(double infer_ms, const std::string& plain_run_json) {
    std::string status = "ok";
    if (budget_hit_) status = "byte budget exhausted (--max-bytes " + std::to_string(limits_.max_bytes) + ")";
    JsonObject footer;
    footer.add("record", "footer")
        .add("tensors", count_)
        .add("bytes", static_cast<int64_t>(offset_))
        .add("infer_ms", infer_ms)
        .add("finished", iso_utc_now())
        .add("status", status);
    if (!plain_run_json.empty()) footer.add_raw("plain_run", plain_run_json);
    check_io(std::fflush(tensors_) == 0, "flush tensors.bin");
    check_io(std::fputs((footer.str() + "\n").c_str(), manifest_) >= 0, "write manifest.jsonl");
    check_io(std::fflush(manifest_) == 0, "flush manifest.jsonl");
}

}  // namespace ld
