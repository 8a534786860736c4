// The input of a GGUF language model: token ids, or a prompt the model's own tokenizer turns into ids.
// On the command line: --input tokens=IDS.npy (int32/int64) or --input prompt=TEXT.txt (UTF-8), or
// --input prompt=BYTES.npy (uint8: the UTF-8 bytes, how the collector stages a prompt).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ld {

struct ModelInput {
    std::string name;        // "tokens" or "prompt"
    std::string file;
    std::string sha256;      // of the bytes as given (ids or text)
    std::string dtype;       // of the file: int32, int64, uint8, text
    std::vector<int64_t> shape;
    std::vector<int32_t> tokens;  // ids (filled for a prompt once tokenized)
    std::string text;             // the prompt
    std::vector<float> values;    // float32 inputs (the convolution graph's x)
};

// Throws HarnessError(kExitBadArgs) naming the file and what is wrong with it.
ModelInput load_model_input(const std::string& name, const std::string& path);

}  // namespace ld
