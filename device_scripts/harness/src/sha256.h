// SHA-256 of files, for the provenance the raw dump header records (model and input hashes).
// Written here because the phone build must not depend on OpenSSL or similar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ld {

class Sha256 {
public:
    Sha256();
    void update(const void* data, size_t size);
    std::string hex_digest();  // finishes the hash

private:
    void block(const uint8_t* chunk);
    uint32_t state_[8];
    uint8_t buffer_[64];
    size_t buffered_ = 0;
    uint64_t total_ = 0;
};

// Returns the hex digest and the size of the file; throws HarnessError(kExitBadArgs) if unreadable.
std::string sha256_file(const std::string& path, uint64_t* size_out);

}  // namespace ld
