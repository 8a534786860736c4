// The reference tensors an --inject run feeds to isolated ops: a raw dump directory (any
// harness's, or one the collector staged from a reference HDF5), looked up by tensor name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ld {

struct InjectTensor {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t offset = 0;
    uint64_t nbytes = 0;
};

class InjectSource {
public:
    // Reads and validates DIR/manifest.jsonl against DIR/tensors.bin; throws HarnessError(kExitBadArgs).
    explicit InjectSource(const std::string& dir);
    bool has(const std::string& name) const { return tensors_.count(name) != 0; }
    const InjectTensor& info(const std::string& name) const;
    std::vector<float> read(const std::string& name) const;  // float32 values, C order
    const std::string& dir() const { return dir_; }

private:
    std::string dir_;
    std::map<std::string, InjectTensor> tensors_;
};

}  // namespace ld
