// Writes one raw dump (analyzer/FORMATS.md section 1) as tensors are produced.
// Why streaming: a phone may not hold a whole model's activations twice, and a harness that dies
// mid-run must leave every tensor it already wrote usable. So bytes go to tensors.bin first, then
// the manifest line is written and flushed; the footer comes last and only on a clean finish.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "sketch.h"

namespace ld {

struct TensorInfo {
    std::string op;
    std::string op_type;
    int output_index = 0;
    std::string name;
    std::vector<std::string> inputs;
    std::vector<int64_t> shape;
    std::string dtype = "float32";
    std::string layout;
    std::string memory = "host";
    double time_ms = -1.0;  // < 0: unknown, omitted from the line
};

struct DumpLimits {
    bool has_filter = false;
    std::regex filter;           // dump only ops whose name matches (search semantics)
    int64_t max_bytes = -1;      // < 0: unlimited
    int64_t abort_after = -1;    // < 0: never; testing aid for dumps without footer
};

// A watched tensor (a model output) as the observed run wrote it, for the plain run's comparison.
struct WatchedTensor {
    TensorInfo info;
    std::vector<unsigned char> bytes;
};

class DumpWriter {
public:
    DumpWriter(const std::string& dir, const DumpLimits& limits, int64_t ops_total);
    ~DumpWriter();
    DumpWriter(const DumpWriter&) = delete;
    DumpWriter& operator=(const DumpWriter&) = delete;

    void write_header(const std::string& header_json);
    // Whether the engine should copy this op's outputs at all (layer filter and byte budget).
    bool wants(const std::string& op) const;
    // Streams one tensor: begin, any number of append() calls, end. end() checks the byte count.
    // begin() returns false (and dumping stops for good) when the tensor would break --max-bytes.
    bool begin(const TensorInfo& info, uint64_t nbytes);
    void append(const void* data, size_t size);
    void end();
    // Convenience for a tensor already contiguous in memory.
    void write(const TensorInfo& info, const void* data, uint64_t nbytes);
    // `plain_run_json`: the footer's plain_run record (plain_run.h), already JSON, or empty for none.
    void write_footer(double infer_ms, const std::string& plain_run_json = "");
    // Keep a copy of the tensors with these names as they are written (the model's outputs).
    void watch(const std::vector<std::string>& names) { watched_names_.insert(names.begin(), names.end()); }
    const std::map<std::string, WatchedTensor>& watched() const { return watched_; }
    const std::string& dir() const { return dir_; }
    // An input as the engine received it, read back from its own input tensor after feeding
    // (FORMATS.md `input_fed`): bytes, then the line; neither filtered nor counted as a layer.
    void write_fed(const std::string& name, const std::vector<int64_t>& shape, const std::string& dtype,
                   const std::string& layout, const void* data, uint64_t nbytes);

    int64_t tensors() const { return count_; }
    uint64_t bytes() const { return offset_; }
    bool budget_exhausted() const { return budget_hit_; }

private:
    void check_io(bool ok, const std::string& what);
    FILE* manifest_ = nullptr;
    FILE* tensors_ = nullptr;
    std::string dir_;
    DumpLimits limits_;
    int64_t ops_total_;
    int64_t count_ = 0;
    uint64_t offset_ = 0;
    uint64_t fed_bytes_ = 0;  // bytes of input_fed records (inside offset_)
    bool budget_hit_ = false;
    std::set<std::string> watched_names_;
    std::map<std::string, WatchedTensor> watched_;
    bool watching_current_ = false;
    // the tensor being streamed
    std::unique_ptr<SummaryWriter> summary_;  // summary.jsonl + summary.bin (FORMATS.md section 3)
    TensorSketch sketch_;                     // the current tensor's summary, fed as its bytes stream
    TensorInfo current_;
    uint64_t current_expected_ = 0;
    uint64_t current_written_ = 0;
};

// Byte size of one element of a FORMATS.md dtype name (0 if unknown).
size_t dtype_size(const std::string& dtype);

}  // namespace ld
