#include "model_input.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "errors.h"
#include "npy.h"
#include "sha256.h"

namespace ld {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
    throw HarnessError(kExitBadArgs, "input " + path + ": " + what);
}

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) bad(path, "cannot be read");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string digest(const void* data, size_t size) {
    Sha256 hash;
    hash.update(data, size);
    return hash.hex_digest();
}

// Splits a .npy file into descr, shape and data bytes (any element type; C order only).
void split_npy(const std::string& path, const std::string& blob, std::string* descr, std::vector<int64_t>* shape,
               std::string* data) {
    if (blob.size() < 10 || blob.compare(0, 6, "\x93NUMPY") != 0) bad(path, "not a .npy file");
    int major = static_cast<unsigned char>(blob[6]);
    size_t len_size = major == 1 ? 2 : 4;
    size_t header_len = 0;
    for (size_t i = 0; i < len_size; ++i) header_len |= static_cast<size_t>(static_cast<unsigned char>(blob[8 + i])) << (8 * i);
    size_t start = 8 + len_size + header_len;
    if (start > blob.size()) bad(path, "header runs past the end of the file");
    bool fortran = false;
    parse_npy_header(blob.substr(8 + len_size, header_len), path, descr, &fortran, shape);
    if (fortran) bad(path, "is Fortran-ordered; save it in C order");
    *data = blob.substr(start);
}

}  // namespace

ModelInput load_model_input(const std::string& name, const std::string& path) {
    ModelInput input;
    input.name = name;
    input.file = path;
    std::string blob = read_all(path);
    bool npy = blob.compare(0, 6, "\x93NUMPY") == 0;
    if (!npy) {  // a text file: the prompt itself
        if (name != "prompt") bad(path, "is not a .npy; only --input prompt=FILE takes a text file");
        input.text = blob;
        input.dtype = "text";
        input.shape = {static_cast<int64_t>(blob.size())};
        input.sha256 = digest(blob.data(), blob.size());
        return input;
    }
    std::string descr, data;
    split_npy(path, blob, &descr, &input.shape, &data);
    int64_t count = 1;
    for (int64_t d : input.shape) count *= d;
    input.sha256 = digest(data.data(), data.size());
    if (descr == "|u1" && name == "prompt") {
        input.dtype = "uint8";
        input.text.assign(data.data(), std::min<size_t>(data.size(), static_cast<size_t>(count)));
    } else if ((descr == "<i4" || descr == "<i8") && name == "tokens") {
        size_t item = descr == "<i4" ? 4 : 8;
        if (data.size() < static_cast<size_t>(count) * item) bad(path, "holds fewer ids than its shape says");
        input.dtype = item == 4 ? "int32" : "int64";
        for (int64_t i = 0; i < count; ++i) {
            int64_t id = 0;
            std::memcpy(&id, data.data() + i * item, item);
            if (item == 4) id = static_cast<int32_t>(id);
            input.tokens.push_back(static_cast<int32_t>(id));
        }
    } else if (descr == "<f4" && name != "tokens" && name != "prompt") {
        if (data.size() < static_cast<size_t>(count) * 4) bad(path, "holds fewer values than its shape says");
        input.dtype = "float32";
        input.values.resize(static_cast<size_t>(count));
        std::memcpy(input.values.data(), data.data(), input.values.size() * 4);
    } else {
        bad(path, "holds " + descr + "; use tokens=IDS.npy (int32/int64), prompt=TEXT.txt or prompt=BYTES.npy (uint8), "
                  "or a float32 .npy for a convolution graph's input");
    }
    return input;
}

}  // namespace ld
