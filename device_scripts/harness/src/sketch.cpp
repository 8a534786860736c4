#include "sketch.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "errors.h"
#include "json.h"
#include "sysutil.h"

namespace ld {

namespace {

constexpr double kFp16Max = 65504.0;
constexpr double kFp16MinNormal = 6.103515625e-05;

double half_to_double(uint16_t h) {
    const int sign = (h >> 15) & 1;
    const int exponent = (h >> 10) & 0x1f;
    const int mantissa = h & 0x3ff;
    double value;
    if (exponent == 0) {
        value = std::ldexp(static_cast<double>(mantissa), -24);
    } else if (exponent == 31) {
        value = mantissa ? NAN : INFINITY;
    } else {
        value = std::ldexp(static_cast<double>(mantissa + 1024), exponent - 25);
    }
    return sign ? -value : value;
}

template <typename T>
T load(const unsigned char* bytes) {
    T value;
    std::memcpy(&value, bytes, sizeof(T));
    return value;
}

}  // namespace

uint64_t mix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

std::vector<int64_t> sample_positions(int64_t numel, uint64_t seed) {
    std::vector<int64_t> positions;
    if (numel <= kSketchSample) {
        for (int64_t i = 0; i < numel; ++i) positions.push_back(i);
        return positions;
    }
    const uint64_t n = static_cast<uint64_t>(numel);
    const uint64_t m = static_cast<uint64_t>(kSketchSample);
    const uint64_t base = mix64(~seed ^ n);
    positions.reserve(kSketchSample);
    for (uint64_t j = 0; j < m; ++j) {
        const uint64_t lo = j * n / m;
        const uint64_t hi = (j + 1) * n / m;
        positions.push_back(static_cast<int64_t>(lo + mix64(base + j) % (hi - lo)));
    }
    return positions;
}

void TensorSketch::begin(const std::string& dtype, int64_t numel) {
    static const char* const kinds[] = {"float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64"};
    kind_ = 0;
    for (int k = 0; k < 8; ++k) {
        if (dtype == kinds[k]) kind_ = k;
    }
    itemsize_ = (dtype == "float16" || dtype == "int16") ? 2 : (dtype == "float64" || dtype == "int64") ? 8
                : (dtype == "int8" || dtype == "uint8") ? 1 : 4;
    numel_ = numel;
    index_ = 0;
    sketch_.assign(kSketchBuckets, 0.0);
    positions_ = sample_positions(numel);
    next_sample_ = 0;
    sample_.clear();
    sample_.reserve(positions_.size() * itemsize_);
    carried_ = 0;
    n_nan_ = n_posinf_ = n_neginf_ = n_zero_ = n_over_ = n_under_ = n_sat_ = 0;
    lo_ = hi_ = sum_ = sumsq_ = 0;
    any_finite_ = false;
}

void TensorSketch::add(const void* data, size_t size) {
    const unsigned char* bytes = static_cast<const unsigned char*>(data);
    while (carried_ > 0 && size > 0) {  // finish an element split across pieces
        carry_[carried_++] = *bytes++;
        --size;
        if (carried_ == itemsize_) {
            element(carry_);
            carried_ = 0;
        }
    }
    const size_t whole = size / itemsize_;
    for (size_t k = 0; k < whole; ++k) element(bytes + k * itemsize_);
    const size_t rest = size - whole * itemsize_;
    std::memcpy(carry_, bytes + whole * itemsize_, rest);
    carried_ = rest;
}

double TensorSketch::value_of(const unsigned char* b) const {
    switch (kind_) {
        case 0: return load<float>(b);
        case 1: return half_to_double(load<uint16_t>(b));
        case 2: return load<double>(b);
        case 3: return load<int8_t>(b);
        case 4: return load<uint8_t>(b);
        case 5: return load<int16_t>(b);
        case 6: return load<int32_t>(b);
        default: return static_cast<double>(load<int64_t>(b));
    }
}

void TensorSketch::element(const unsigned char* bytes) {
    const double x = value_of(bytes);
    if (next_sample_ < positions_.size() && positions_[next_sample_] == index_) {
        sample_.insert(sample_.end(), bytes, bytes + itemsize_);
        ++next_sample_;
    }
    const uint64_t h = mix64(kSketchSeed + static_cast<uint64_t>(index_));
    ++index_;
    if (std::isnan(x)) { ++n_nan_; return; }
    if (std::isinf(x)) { ++(x > 0 ? n_posinf_ : n_neginf_); return; }
    sketch_[h & (kSketchBuckets - 1)] += (h >> 63) ? -x : x;
    if (!any_finite_) { lo_ = hi_ = x; any_finite_ = true; }
    if (x < lo_) lo_ = x;
    if (x > hi_) hi_ = x;
    sum_ += x;
    sumsq_ += x * x;
    const double mag = std::fabs(x);
    if (mag == 0) ++n_zero_;
    else if (mag < kFp16MinNormal) ++n_under_;
    if (mag > kFp16Max) ++n_over_;
    if (mag == kFp16Max) ++n_sat_;
}

void TensorSketch::stats_into(JsonObject& line) const {
    line.add("numel", numel_)
        .add("n_nan", n_nan_)
        .add("n_posinf", n_posinf_)
        .add("n_neginf", n_neginf_)
        .add("n_zero", n_zero_)
        .add("n_fp16_overflow", n_over_)
        .add("n_fp16_underflow", n_under_)
        .add("n_fp16_saturated", n_sat_)
        .add("min", any_finite_ ? lo_ : NAN)
        .add("max", any_finite_ ? hi_ : NAN)
        .add("sum", sum_)
        .add("sumsq", sumsq_);
}

SummaryWriter::SummaryWriter(const std::string& dir) : dir_(dir) {
    lines_ = std::fopen(join_path(dir, "summary.jsonl").c_str(), "wb");
    data_ = std::fopen(join_path(dir, "summary.bin").c_str(), "wb");
    if (!lines_ || !data_) {
        throw HarnessError(kExitWrite, "cannot create summary.jsonl in " + dir + ": " + std::strerror(errno) +
                                           " (check free space and permissions)");
    }
    JsonObject header;
    header.add("record", "header")
        .add("format", "layerdiff-summary")
        .add("format_version", 1)
        .add("hash", "splitmix64")
        .add("seed", static_cast<int64_t>(kSketchSeed))
        .add("buckets", kSketchBuckets)
        .add("sample", kSketchSample);
    std::fputs((header.str() + "\n").c_str(), lines_);
    std::fflush(lines_);
}

SummaryWriter::~SummaryWriter() {
    if (lines_) std::fclose(lines_);
    if (data_) std::fclose(data_);
}

void SummaryWriter::write(int64_t order, const std::string& name, const std::string& dtype, const TensorSketch& sk) {
    const std::vector<double>& sums = sk.sketch();
    const std::vector<unsigned char>& sample = sk.sample();
    // A tensor of at most SAMPLE elements is its own sample: its sketch is not written (FORMATS.md).
    const size_t buckets = sk.sample_count() == sk.numel() ? 0 : sums.size();
    bool ok = std::fwrite(sums.data(), sizeof(double), buckets, data_) == buckets;
    ok = ok && std::fwrite(sample.data(), 1, sample.size(), data_) == sample.size();
    ok = ok && std::fflush(data_) == 0;
    JsonObject line;
    line.add("record", "tensor")
        .add("order", order)
        .add("name", name)
        .add("offset", static_cast<int64_t>(offset_))
        .add("dtype", dtype)
        .add("sample_count", sk.sample_count());
    sk.stats_into(line);
    ok = ok && std::fputs((line.str() + "\n").c_str(), lines_) >= 0 && std::fflush(lines_) == 0;
    if (!ok) {
        throw HarnessError(kExitWrite, "cannot write summary.bin in " + dir_ + ": " + std::strerror(errno) +
                                           " (check free space and permissions)");
    }
    offset_ += buckets * sizeof(double) + sample.size();
}

}  // namespace ld
