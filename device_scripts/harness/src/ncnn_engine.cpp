// ncnn engine: every blob extracted in layer order, so each layer's output is dumped as ncnn
// computed it on the chosen backend and precision.
//
// Blobs are extracted in layer order, so each extract() runs only the layers not run yet and a
// layer's time is the time of its extract. Type 0 makes ncnn unpack elempack and convert fp16/bf16
// storage to fp32 for us. Memory: light mode is on, so ncnn frees a blob once its consumer ran
// (each blob is written out and released before that), and the device holds the live blobs, not
// the whole dump. On Vulkan, light mode frees only the GPU copy: the host copy extract() downloads
// would stay in the extractor to its end, so once written it is replaced by an empty Mat (the
// consumer reads the GPU copy, or downloads it again if it runs on the CPU).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine.h"
#include "errors.h"
#include "json.h"
#include "sysutil.h"

#include <cpu.h>
#include <layer.h>
#include <net.h>
#include <platform.h>
#if NCNN_VULKAN
#include <gpu.h>
#include <dirent.h>
#include <sys/stat.h>
#endif

namespace ld {
namespace {

bool cpu_has_fp16_arith() { return ncnn::cpu_support_arm_asimdhp() != 0; }
bool cpu_has_fp16_storage_only() {
#if defined(__arm__) && !defined(__aarch64__)
    return ncnn::cpu_support_arm_vfpv4() != 0;
#else
    return false;
#endif
}

// What "low" means on this CPU: fp16 where the CPU has it, otherwise bf16 storage.
std::string cpu_low_precision() {
    if (cpu_has_fp16_arith()) return "fp16-storage+arith";
    if (cpu_has_fp16_storage_only()) return "fp16-storage";
    return "bf16-storage";
}

// `use_bf16_packed` is an option of recent ncnn releases (1.0.20261020 has it, 1.0.20250916 not); older ones (built with
// `--engine ncnn==RELEASE`) have bf16 storage only, which decides the packed layout too. Asked of the
// Option type itself, so the harness compiles against either.
template <typename Opt, typename = void>
struct has_bf16_packed : std::false_type {};
template <typename Opt>
struct has_bf16_packed<Opt, std::void_t<decltype(std::declval<Opt&>().use_bf16_packed)>> : std::true_type {};

template <typename Opt>
void set_bf16(Opt& opt, bool on) {
    opt.use_bf16_storage = on;
    if constexpr (has_bf16_packed<Opt>::value) opt.use_bf16_packed = on;
}

template <typename Opt>
bool bf16_packed(const Opt& opt) {
    if constexpr (has_bf16_packed<Opt>::value) return opt.use_bf16_packed;
    return false;
}

template <typename Opt>
void add_bf16_packed(JsonObject& json, const Opt& opt) {
    if constexpr (has_bf16_packed<Opt>::value) json.add("use_bf16_packed", opt.use_bf16_packed);
}

void set_fp16(ncnn::Option& opt, bool packed, bool storage, bool arithmetic) {
    opt.use_fp16_packed = packed;
    opt.use_fp16_storage = storage;
    opt.use_fp16_arithmetic = arithmetic;
    opt.use_fp16_uniform = arithmetic;
}

// docs/DESIGN.md mapping: low = fp16 packed+storage+arithmetic (bf16 storage where the CPU has no
// fp16), normal = ncnn defaults, high = every reduced-precision path off.
void apply_precision(ncnn::Option& opt, const std::string& precision, bool vulkan) {
    if (precision == "high") {
        set_fp16(opt, false, false, false);
        set_bf16(opt, false);
    } else if (precision == "low") {
        bool bf16 = !vulkan && !cpu_has_fp16_arith() && !cpu_has_fp16_storage_only();
        set_fp16(opt, !bf16, !bf16, !bf16);
        set_bf16(opt, bf16);
    }
}

// The arithmetic that really happens, from the options ncnn kept after loading (for Vulkan,
// ncnn clears what the device lacks) and the CPU's features.
std::string effective_precision(const ncnn::Option& opt, bool vulkan) {
    if (vulkan) {
        std::string storage = opt.use_fp16_storage ? "fp16-storage" : opt.use_fp16_packed ? "fp16-packed" : "";
        if (!storage.empty()) return opt.use_fp16_arithmetic ? storage + "+arith" : storage;
        if (opt.use_bf16_storage || bf16_packed(opt)) return "bf16-storage";
        return "fp32";
    }
    if (opt.use_fp16_storage && cpu_has_fp16_arith()) return opt.use_fp16_arithmetic ? "fp16-storage+arith" : "fp16-storage";
    if (opt.use_fp16_storage && !opt.use_bf16_storage && cpu_has_fp16_storage_only()) return "fp16-storage";
    if (opt.use_bf16_storage) return "bf16-storage";
    return "fp32";
}

std::string options_json(const ncnn::Option& opt) {
    JsonObject json;
    json.add("lightmode", opt.lightmode)
        .add("num_threads", opt.num_threads)
        .add("use_vulkan_compute", opt.use_vulkan_compute)
        .add("use_packing_layout", opt.use_packing_layout)
        .add("use_fp16_packed", opt.use_fp16_packed)
        .add("use_fp16_storage", opt.use_fp16_storage)
        .add("use_fp16_arithmetic", opt.use_fp16_arithmetic)
        .add("use_fp16_uniform", opt.use_fp16_uniform)
        .add("use_bf16_storage", opt.use_bf16_storage)
        .add("use_winograd_convolution", opt.use_winograd_convolution)
        .add("use_sgemm_convolution", opt.use_sgemm_convolution);
    add_bf16_packed(json, opt);
    return json.str();
}

#if NCNN_VULKAN
// The driver that computes, as Vulkan reports it (ncnn's GpuInfo) and as this process mapped it: a GPU
// name cannot tell two driver builds apart, nor a loader that picked another driver than expected.
// The same fields as the host ncnn engine (analyzer/FORMATS.md, options.vulkan_driver).
std::string decode_driver_version(uint32_t vendor, uint32_t packed) {
    std::ostringstream out;
    if (vendor == 0x10DE) {  // NVIDIA: 10.8.8.6 bits
        out << (packed >> 22 & 0x3FF) << "." << (packed >> 14 & 0xFF) << "." << (packed >> 6 & 0xFF) << "." << (packed & 0x3F);
    } else {  // Vulkan's 10.10.12 major.minor.patch
        out << (packed >> 22 & 0x3FF) << "." << (packed >> 12 & 0x3FF) << "." << (packed & 0xFFF);
    }
    return out.str();
}

std::string hex_id(uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof(text), "0x%04x", value);
    return text;
}

std::string dirname_of(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string basename_of(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The library a Vulkan manifest names ("ICD": {"library_path": ...}), resolved as the loader does:
// a relative path with a folder part from the manifest's folder; a bare file name stays bare.
std::string manifest_library(const std::string& manifest) {
    std::ifstream in(manifest);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t key = text.find("\"library_path\"");
    if (key == std::string::npos) return "";
    size_t open = text.find('"', text.find(':', key) + 1);
    size_t close = open == std::string::npos ? std::string::npos : text.find('"', open + 1);
    if (close == std::string::npos) return "";
    std::string name = text.substr(open + 1, close - open - 1);
    if (name.empty() || name[0] == '/' || name.find('/') == std::string::npos) return name;
    char resolved[4096];
    std::string joined = dirname_of(manifest) + "/" + name;
    return realpath(joined.c_str(), resolved) ? std::string(resolved) : joined;
}

// The manifests the loader reads: $VK_DRIVER_FILES / $VK_ICD_FILENAMES when set, else the icd.d folders.
std::vector<std::string> vulkan_manifests() {
    std::vector<std::string> found;
    const char* chosen = std::getenv("VK_DRIVER_FILES");
    if (!chosen || !*chosen) chosen = std::getenv("VK_ICD_FILENAMES");
    if (chosen && *chosen) {
        std::stringstream list(chosen);
        for (std::string item; std::getline(list, item, ':');) if (!item.empty()) found.push_back(item);
        return found;
    }
    for (const char* folder : {"/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"}) {
        DIR* dir = opendir(folder);
        if (!dir) continue;
        std::set<std::string> names;
        while (dirent* entry = readdir(dir)) {
            std::string name = entry->d_name;
            if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) names.insert(name);
        }
        closedir(dir);
        for (const std::string& name : names) found.push_back(std::string(folder) + "/" + name);
    }
    return found;
}

// Every Vulkan driver library this process has mapped (/proc/self/maps): those a manifest names, and on
// Android (no manifests) the HAL's hw/vulkan.<name>.so, each with its size.
std::string mapped_vulkan_drivers_json() {
    std::vector<std::string> mapped;
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
        size_t path = line.find('/');
        if (path == std::string::npos) continue;
        std::string name = line.substr(path);
        bool seen = false;
        for (const std::string& m : mapped) seen = seen || m == name;
        if (!seen) mapped.push_back(name);
    }
    std::vector<std::pair<std::string, std::string>> hits;  // (manifest, path)
    for (const std::string& manifest : vulkan_manifests()) {
        std::string library = manifest_library(manifest);
        if (library.empty()) continue;
        bool bare = library.find('/') == std::string::npos;
        for (const std::string& path : mapped) {
            if (path == library || (bare && basename_of(path) == library)) hits.emplace_back(manifest, path);
        }
    }
    for (const std::string& path : mapped) {
        if (path.find("/hw/vulkan.") != std::string::npos) hits.emplace_back("", path);
    }
    std::string out = "[";
    for (size_t i = 0; i < hits.size(); ++i) {
        struct stat st {};
        int64_t size = stat(hits[i].second.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
        out += (i ? "," : "") + JsonObject().add("manifest", hits[i].first).add("path", hits[i].second).add("size", size).str();
    }
    return out + "]";
}

std::string vulkan_driver_json(int device_index) {
    const ncnn::GpuInfo& gpu = ncnn::get_gpu_info(device_index);
    const uint8_t* uuid = gpu.pipeline_cache_uuid();
    char hex[33] = {0};
    for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", uuid[i]);
    return JsonObject()
        .add("device_name", gpu.device_name())
        .add("vendor_id", hex_id(gpu.vendor_id()))
        .add("device_id", hex_id(gpu.device_id()))
        .add("driver_version", decode_driver_version(gpu.vendor_id(), gpu.driver_version()))
        .add("driver_version_raw", static_cast<int64_t>(gpu.driver_version()))
        .add("api_version", decode_driver_version(0, gpu.api_version()))
        .add("pipeline_cache_uuid", std::string(hex))
        .add_raw("libraries", mapped_vulkan_drivers_json())
        .str();
}
#endif

// ncnn has no batch axis; the dump puts N=1 back so blobs read as NCHW like MNN's and the ONNX
// originals' (a 2-D h x w blob stays h x w), the same rule as the host engine's.
void blob_shape(const ncnn::Mat& m, std::vector<int64_t>* shape, std::string* layout) {
    switch (m.dims) {
        case 1: *shape = {1, m.w}; *layout = "NC"; break;
        case 2: *shape = {m.h, m.w}; *layout = "HW"; break;
        case 3: *shape = {1, m.c, m.h, m.w}; *layout = "NCHW"; break;
        default: *shape = {1, m.c, m.d, m.h, m.w}; *layout = "NCDHW"; break;
    }
}

// Dumped/.npy shape -> ncnn Mat: a leading batch of 1 is dropped for 2-D, 4-D and 5-D arrays,
// the inverse of blob_shape() (so injected reference tensors land in the blob layout ncnn had).
ncnn::Mat mat_from_array(const std::vector<int64_t>& shape, const float* values, const std::string& label) {
    std::vector<int64_t> s = shape;
    if ((s.size() == 2 || s.size() >= 4) && s[0] == 1) s.erase(s.begin());
    ncnn::Mat m;
    if (s.size() == 1) m.create(int(s[0]));
    else if (s.size() == 2) m.create(int(s[1]), int(s[0]));
    else if (s.size() == 3) m.create(int(s[2]), int(s[1]), int(s[0]));
    else if (s.size() == 4) m.create(int(s[3]), int(s[2]), int(s[1]), int(s[0]));
    else throw HarnessError(kExitRun, label + ": ncnn takes 1 to 4 dimensions after the batch of 1");
    if (m.empty()) throw HarnessError(kExitRun, label + " is empty");
    size_t plane = size_t(m.w) * m.h * m.d;
    for (int q = 0; q < m.c; ++q) std::memcpy(m.channel(q), values + q * plane, plane * sizeof(float));
    return m;
}

// Layer types a .param lists that ncnn does not know (ncnn::layer_to_index < 0), comma-joined, in file
// order: what a converter left unconverted (pnnx: torch.where, Tensor.slice, ...); "" when none.
std::string unknown_layer_types(const std::string& param) {
    std::ifstream file(param);
    std::string line, listed;
    std::set<std::string> seen;
    for (int number = 0; std::getline(file, line); ++number) {
        if (number < 2) continue;  // magic, then "layer_count blob_count"
        std::istringstream fields(line);
        std::string type;
        if (!(fields >> type) || seen.count(type)) continue;
        seen.insert(type);
        if (ncnn::layer_to_index(type.c_str()) < 0) listed += (listed.empty() ? "" : ", ") + type;
    }
    return listed;
}

ncnn::Mat mat_from_npy(const NpyArray& input) {
    return mat_from_array(input.shape, input.data.data(), "input " + input.file);
}

class NcnnEngine : public Engine {
public:
    ~NcnnEngine() override {
        net_.clear();
#if NCNN_VULKAN
        if (gpu_started_) ncnn::destroy_gpu_instance();
#endif
    }

    void open(const RunConfig& config) override {
        vulkan_ = config.backend == "vulkan";
        if (config.backend == "opencl") {
            throw HarnessError(kExitBackend, "ncnn has no OpenCL backend: use --backend cpu or vulkan");
        }
        ncnn::Option& opt = net_.opt;
        opt.lightmode = true;
        opt.num_threads = config.threads;
        apply_precision(opt, config.precision, vulkan_);
        if (vulkan_) start_vulkan();
        const std::string& param = config.model_files[0];
        const std::string& bin = config.model_files[1];
        if (net_.load_param(param.c_str()) != 0) {
            std::string unknown = unknown_layer_types(param);
            if (!unknown.empty()) {
                throw HarnessError(kExitModel, param + ": ncnn does not know the layer type(s) " + unknown +
                                                   ": the converter left them unconverted (pnnx keeps operators it cannot map to "
                                                   "ncnn layers under their PyTorch names); rewrite the model around them or run it "
                                                   "on an engine that implements them");
            }
            throw HarnessError(kExitModel, "ncnn cannot parse " + param + " (is it an ncnn .param built with layers this harness has?)");
        }
        if (net_.load_model(bin.c_str()) != 0) {
            throw HarnessError(kExitModel, "ncnn cannot load weights " + bin + " for " + param + " (file truncated or not matching?)");
        }
        facts_.engine = "ncnn";
        facts_.engine_version = ncnn_version();
        facts_.precision_effective = effective_precision(net_.opt, vulkan_);
        facts_.options_json = options_json(net_.opt);
#if NCNN_VULKAN
        if (vulkan_ && net_.opt.use_vulkan_compute) {  // the device exists now: its driver is mapped
            int device = ncnn::get_default_gpu_index();
            std::string extra = JsonObject()
                .add("vulkan_device", ncnn::get_gpu_info(device).device_name())
                .add_raw("vulkan_driver", vulkan_driver_json(device)).str();
            facts_.options_json = facts_.options_json.substr(0, facts_.options_json.size() - 1) + "," + extra.substr(1);
        }
#endif
        facts_.backends_actual = actual_backends();
    }

    EngineFacts facts() const override { return facts_; }
    int op_count() const override { return static_cast<int>(net_.layers().size()); }

    double run(const std::vector<NpyArray>& inputs, DumpWriter& out) override {
        ncnn::Extractor ex = net_.create_extractor();
        feed_inputs(ex, inputs, &out);
        double started = monotonic_ms();
        const std::vector<ncnn::Layer*>& layers = net_.layers();
        for (const ncnn::Layer* layer : layers) {
            if (!out.wants(layer->name)) continue;
            for (size_t k = 0; k < layer->tops.size(); ++k) dump_blob(ex, *layer, static_cast<int>(k), out);
        }
        // Layers after the last dumped one (filter, byte budget) still run: extract the outputs.
        for (const char* name : net_.output_names()) {
            ncnn::Mat ignored;
            if (ex.extract(name, ignored, 0) != 0) throw HarnessError(kExitRun, std::string("ncnn failed computing output ") + name);
        }
        return monotonic_ms() - started;
    }

    // ncnn's Extractor takes any blob as input: feeding a layer's bottoms and extracting its
    // tops runs that layer alone, on this net's backend and precision.
    double isolate(const std::vector<std::string>& targets, const InjectSource& source, DumpWriter& out) override {
        double total = 0;
        for (const ncnn::Layer* layer : target_layers(targets)) {
            ncnn::Extractor ex = net_.create_extractor();
            ex.set_light_mode(false);
            for (int bottom : layer->bottoms) {
                const std::string& name = net_.blobs()[bottom].name;
                if (!source.has(name)) {
                    throw HarnessError(kExitBadArgs, "inject dump " + source.dir() + " has no tensor '" + name +
                                                         "' that layer " + layer->name + " consumes");
                }
                std::vector<float> values = source.read(name);
                ex.input(bottom, mat_from_array(source.info(name).shape, values.data(), "inject tensor " + name));
            }
            double started = monotonic_ms();
            for (size_t k = 0; k < layer->tops.size(); ++k) dump_blob(ex, *layer, static_cast<int>(k), out);
            total += monotonic_ms() - started;
        }
        return total;
    }

private:
    // The layers named by tensor keys, each once, in the order first named.
    std::vector<const ncnn::Layer*> target_layers(const std::vector<std::string>& targets) const {
        std::vector<const ncnn::Layer*> chosen;
        for (const std::string& key : targets) {
            std::string op;
            int index = 0;
            split_tensor_key(key, &op, &index);
            const ncnn::Layer* found = nullptr;
            for (const ncnn::Layer* layer : net_.layers()) {
                if (layer->name == op) found = layer;
            }
            if (!found) throw HarnessError(kExitBadArgs, "--target " + key + ": the model has no layer '" + op + "'");
            if (index >= static_cast<int>(found->tops.size())) {
                throw HarnessError(kExitBadArgs, "--target " + key + ": layer " + op + " has " +
                                                     std::to_string(found->tops.size()) + " output(s)");
            }
            if (found->type == "Input") throw HarnessError(kExitBadArgs, "--target " + key + " is a model input, not an op");
            bool seen = false;
            for (const ncnn::Layer* layer : chosen) seen = seen || layer == found;
            if (!seen) chosen.push_back(found);
        }
        return chosen;
    }

    void start_vulkan() {
#if NCNN_VULKAN
        if (ncnn::create_gpu_instance() != 0 || ncnn::get_gpu_count() == 0) {
            gpu_started_ = true;
            throw HarnessError(kExitBackend, "no Vulkan device (ncnn found no GPU); check the Vulkan driver or use --backend cpu");
        }
        gpu_started_ = true;
        net_.opt.use_vulkan_compute = true;
        net_.set_vulkan_device(ncnn::get_default_gpu_index());
#else
        throw HarnessError(kExitBackend, "this harness was built without ncnn Vulkan (static builds are CPU only): use --backend cpu or an Android/host build");
#endif
    }

    // Vulkan layers ncnn cannot run on the GPU fall back to the CPU: say so in the header.
    std::vector<std::string> actual_backends() const {
        if (!vulkan_ || !net_.opt.use_vulkan_compute) return {"cpu"};
        for (const ncnn::Layer* layer : net_.layers()) {
            if (layer->type != "Input" && !layer->support_vulkan) return {"vulkan", "cpu"};
        }
        return {"vulkan"};
    }

    std::vector<std::string> output_names() const override {
        std::vector<std::string> names;
        for (const char* name : net_.output_names()) names.push_back(name);
        return names;
    }

    // A fresh extractor, the inputs fed, only the model's outputs extracted: as an app runs the net.
    std::vector<PlainOutput> plain_run(const std::vector<NpyArray>& inputs) override {
        ncnn::Extractor ex = net_.create_extractor();
        feed_inputs(ex, inputs);
        std::vector<PlainOutput> outputs;
        for (const char* name : net_.output_names()) {
            ncnn::Mat m;
            if (ex.extract(name, m, 0) != 0) throw HarnessError(kExitRun, std::string("ncnn failed computing output ") + name + " in a plain run");
            if (m.empty() || m.elemsize != 4 || m.elempack != 1) continue;
            PlainOutput output;
            output.name = name;
            std::string layout;
            blob_shape(m, &output.shape, &layout);
            size_t plane = size_t(m.w) * m.h * m.d;
            for (int q = 0; q < m.c; ++q) {
                const float* values = m.channel(q);
                output.values.insert(output.values.end(), values, values + plane);
            }
            outputs.push_back(std::move(output));
        }
        return outputs;
    }

    std::string observing() const override {
        return vulkan_ ? "every blob is extracted in layer order (light mode), each one's host copy downloaded and then "
                         "dropped; the plain run extracts only the model's outputs, as an app does"
                       : "every blob is extracted in layer order (light mode); the plain run extracts only the model's "
                         "outputs, as an app does";
    }

    // Each Mat handed to the extractor is recorded as read back (`input_fed`, with `out`): in the
    // given shape (ncnn has no batch axis), channel by channel (planes are cstep apart).
    void feed_inputs(ncnn::Extractor& ex, const std::vector<NpyArray>& inputs, DumpWriter* out = nullptr) {
        std::vector<std::string> model_inputs;
        for (const char* name : net_.input_names()) model_inputs.push_back(name);
        std::string listed;
        for (const std::string& name : model_inputs) listed += (listed.empty() ? "" : ", ") + name;
        for (const NpyArray& input : inputs) {
            bool known = false;
            for (const std::string& name : model_inputs) known = known || name == input.name;
            // Checked here: ex.input() on an unknown name prints ncnn's own multi-line hint.
            ncnn::Mat fed = known ? mat_from_npy(input) : ncnn::Mat();
            if (!known || ex.input(input.name.c_str(), fed) != 0) {
                throw HarnessError(kExitRun, "model has no input blob '" + input.name + "' (its inputs: " + listed + ")");
            }
            if (out) record_fed(input, fed, *out);
        }
        for (const std::string& name : model_inputs) {
            bool given = false;
            for (const NpyArray& input : inputs) given = given || input.name == name;
            if (!given) throw HarnessError(kExitRun, "model input '" + name + "' was not given: add --input " + name + "=FILE.npy");
        }
    }

    void record_fed(const NpyArray& input, const ncnn::Mat& fed, DumpWriter& out) {
        std::vector<int64_t> shape;
        std::string layout;
        blob_shape(fed, &shape, &layout);
        size_t plane = size_t(fed.w) * fed.h * fed.d;
        if (static_cast<size_t>(fed.c) * plane == input.data.size()) shape = input.shape;
        std::vector<float> values(static_cast<size_t>(fed.c) * plane);
        for (int q = 0; q < fed.c; ++q) std::memcpy(values.data() + q * plane, fed.channel(q).data, plane * sizeof(float));
        out.write_fed(input.name, shape, "float32", layout + " (ncnn dims " + std::to_string(fed.dims) + ")", values.data(),
                      values.size() * sizeof(float));
    }

    void dump_blob(ncnn::Extractor& ex, const ncnn::Layer& layer, int top, DumpWriter& out) {
        const std::vector<ncnn::Blob>& blobs = net_.blobs();
        int blob_index = layer.tops[top];
        double t0 = monotonic_ms();
        ncnn::Mat m;
        if (ex.extract(blob_index, m, 0) != 0) {
            throw HarnessError(kExitRun, "ncnn layer " + layer.name + " (" + layer.type + ") failed");
        }
        double elapsed = monotonic_ms() - t0;
        if (m.empty()) return;
        if (m.elemsize != 4 || m.elempack != 1) {
            throw HarnessError(kExitRun, "ncnn layer " + layer.name + " gave elemsize " + std::to_string(m.elemsize) +
                                             " elempack " + std::to_string(m.elempack) + " after unpacking");
        }
        TensorInfo info;
        info.op = layer.name;
        info.op_type = layer.type;
        info.output_index = top;
        info.name = blobs[blob_index].name;
        for (int b : layer.bottoms) info.inputs.push_back(blobs[b].name);
        blob_shape(m, &info.shape, &info.layout);
        info.memory = vulkan_ && layer.support_vulkan && layer.type != "Input" ? "device" : "host";
        info.time_ms = elapsed;
        size_t plane_bytes = size_t(m.w) * m.h * m.d * sizeof(float);
        if (out.begin(info, plane_bytes * m.c)) {
            // Channels are cstep apart (padded for alignment): copy each plane, not the whole buffer.
            for (int q = 0; q < m.c; ++q) out.append(m.channel(q).data, plane_bytes);
            out.end();
        }
        m.release();
        if (info.memory == "device") ex.input(blob_index, ncnn::Mat());  // drop the downloaded host copy
    }

    ncnn::Net net_;
    EngineFacts facts_;
    bool vulkan_ = false;
    bool gpu_started_ = false;
};

}  // namespace

std::unique_ptr<Engine> make_ncnn_engine() { return std::unique_ptr<Engine>(new NcnnEngine()); }

std::string ncnn_version() {
#ifdef NCNN_VERSION_STRING
    return NCNN_VERSION_STRING;
#else
    return "unknown";
#endif
}

std::string ncnn_probe_json() {
    JsonObject cpu;
    cpu.add("ok", true)
        .add("fp16", cpu_has_fp16_arith())
        .add("fp16_storage", cpu_has_fp16_arith() || cpu_has_fp16_storage_only())
        .add("bf16", ncnn::cpu_support_arm_bf16() != 0)
        .add("low", cpu_low_precision());
    JsonObject vulkan;
#if NCNN_VULKAN
    if (ncnn::create_gpu_instance() != 0 || ncnn::get_gpu_count() == 0) {
        vulkan.add("ok", false).add("reason", "no Vulkan device");
    } else {
        const ncnn::GpuInfo& gpu = ncnn::get_gpu_info(ncnn::get_default_gpu_index());
        vulkan.add("ok", true)
            .add("device", gpu.device_name())
            .add("fp16_storage", gpu.support_fp16_storage())
            .add("fp16_arithmetic", gpu.support_fp16_arithmetic());
    }
    ncnn::destroy_gpu_instance();
#else
    vulkan.add("ok", false).add("reason", "built without Vulkan (static build)");
#endif
    JsonObject opencl;
    opencl.add("ok", false).add("reason", "ncnn has no OpenCL backend");
    JsonObject backends;
    backends.add_raw("cpu", cpu.str()).add_raw("opencl", opencl.str()).add_raw("vulkan", vulkan.str());
    return JsonObject().add("version", ncnn_version()).add_raw("backends", backends.str()).str();
}

}  // namespace ld
