#include "engine.h"

#include <cstdlib>

namespace ld {

std::vector<std::string> built_engines() {
    std::vector<std::string> names;
#if LAYERDIFF_WITH_NCNN
    names.push_back("ncnn");
#endif
#if LAYERDIFF_WITH_MNN
    names.push_back("mnn");
#endif
#if LAYERDIFF_WITH_PADDLE_LITE
    names.push_back("paddle-lite");
#endif
    return names;
}

std::unique_ptr<Engine> make_engine(const std::string& name) {
#if LAYERDIFF_WITH_NCNN
    if (name == "ncnn") return make_ncnn_engine();
#endif
#if LAYERDIFF_WITH_MNN
    if (name == "mnn") return make_mnn_engine();
#endif
#if LAYERDIFF_WITH_PADDLE_LITE
    if (name == "paddle-lite") return make_paddle_lite_engine();
#endif
    (void)name;
    return nullptr;
}

std::string engine_version(const std::string& name) {
#if LAYERDIFF_WITH_NCNN
    if (name == "ncnn") return ncnn_version();
#endif
#if LAYERDIFF_WITH_MNN
    if (name == "mnn") return mnn_version();
#endif
#if LAYERDIFF_WITH_PADDLE_LITE
    if (name == "paddle-lite") return paddle_lite_version();
#endif
    (void)name;
    return "";
}

std::string engine_probe_json(const std::string& name) {
#if LAYERDIFF_WITH_NCNN
    if (name == "ncnn") return ncnn_probe_json();
#endif
#if LAYERDIFF_WITH_MNN
    if (name == "mnn") return mnn_probe_json();
#endif
#if LAYERDIFF_WITH_PADDLE_LITE
    if (name == "paddle-lite") return paddle_lite_probe_json();
#endif
    (void)name;
    return "{}";
}

void split_tensor_key(const std::string& key, std::string* op, int* index) {
    // Same rule as the host engines: `<op>:<digits>`, otherwise the whole key is the op, output 0.
    size_t colon = key.rfind(':');
    bool indexed = colon != std::string::npos && colon + 1 < key.size() &&
                   key.find_first_not_of("0123456789", colon + 1) == std::string::npos;
    *op = indexed ? key.substr(0, colon) : key;
    *index = indexed ? std::atoi(key.c_str() + colon + 1) : 0;
    if (op->empty()) throw HarnessError(kExitBadArgs, "--target '" + key + "' names no op");
}

bool known_backend(const std::string& backend) {
    return backend == "cpu" || backend == "opencl" || backend == "vulkan";
}

bool known_precision(const std::string& precision) {
    return precision == "low" || precision == "normal" || precision == "high";
}

}  // namespace ld
