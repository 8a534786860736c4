// The tensor summary written beside a raw dump (analyzer/FORMATS.md section 3), computed while each
// tensor streams through the dump writer: exact statistics, a linear count-sketch of BUCKETS float64
// sums, and the values at SAMPLE shared positions. The hash and the positions are defined bit for bit
// in FORMATS.md so the Python writer (analyzer/formats/sketchformat.py) agrees with this one on every
// element: two runs' sketches subtract into the sketch of their difference, whatever wrote them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ld {

constexpr int kSketchBuckets = 1024;
constexpr int64_t kSketchSample = 4096;
constexpr uint64_t kSketchSeed = 0x6C61796572646966ULL;  // "layerdif"

uint64_t mix64(uint64_t x);  // splitmix64's finalizer, with its golden-ratio increment first
// The shared positions of a tensor of `numel` elements, increasing (every element when numel <= SAMPLE).
std::vector<int64_t> sample_positions(int64_t numel, uint64_t seed = kSketchSeed);

// Accumulates one tensor's summary from its bytes, in any number of pieces (an element split between
// two pieces is carried over).
class TensorSketch {
public:
    void begin(const std::string& dtype, int64_t numel);
    void add(const void* data, size_t size);
    const std::vector<double>& sketch() const { return sketch_; }
    const std::vector<unsigned char>& sample() const { return sample_; }
    int64_t numel() const { return numel_; }
    int64_t sample_count() const { return static_cast<int64_t>(positions_.size()); }
    // The statistics as JSON fields (FORMATS.md section 3), without braces' opening/closing.
    void stats_into(class JsonObject& line) const;

private:
    void element(const unsigned char* bytes);
    double value_of(const unsigned char* bytes) const;
    int kind_ = 0;  // index into the FORMATS.md dtype names, in sketch.cpp's order
    size_t itemsize_ = 4;
    int64_t numel_ = 0;
    int64_t index_ = 0;
    std::vector<double> sketch_;
    std::vector<int64_t> positions_;
    size_t next_sample_ = 0;
    std::vector<unsigned char> sample_;
    unsigned char carry_[8] = {};
    size_t carried_ = 0;
    int64_t n_nan_ = 0, n_posinf_ = 0, n_neginf_ = 0, n_zero_ = 0;
    int64_t n_over_ = 0, n_under_ = 0, n_sat_ = 0;
    double lo_ = 0, hi_ = 0, sum_ = 0, sumsq_ = 0;
    bool any_finite_ = false;
};

// Writes summary.jsonl + summary.bin: bytes first, then the line pointing at them, flushed.
class SummaryWriter {
public:
    explicit SummaryWriter(const std::string& dir);
    ~SummaryWriter();
    SummaryWriter(const SummaryWriter&) = delete;
    SummaryWriter& operator=(const SummaryWriter&) = delete;
    void write(int64_t order, const std::string& name, const std::string& dtype, const TensorSketch& sketch);

private:
    FILE* lines_ = nullptr;
    FILE* data_ = nullptr;
    std::string dir_;
    uint64_t offset_ = 0;
};

}  // namespace ld
