// MNN engine: one session in debug mode; every op's outputs are copied in the after-callback of
// runSessionWithCallBackInfo (MNN reuses buffers, so later is too late).
//
// Why Tensor(t, CAFFE) + copyToHostTensor: it converts NC4HW4 and device memory to plain NCHW on
// the host (createHostTensorFromDevice would keep NC4HW4). Edges come from Tensor* identity:
// the after-callback records which op produced each tensor, the before-callback looks the
// op's inputs up, corrected by the model's graph where addresses mislead (mnn_edges.h). MNN falls back to the CPU silently when a GPU backend is missing, so the
// header's backends_actual comes from getSessionInfo(BACKENDS), never from the request.
// With --inject no session is made: mnn_isolate.cpp cuts each target out of the graph instead.
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <MNN/Interpreter.hpp>
#include <MNN/MNNDefine.h>
#include <MNN/Tensor.hpp>

#include "engine.h"
#include "errors.h"
#include "json.h"
#include "mnn_backend.h"
#include "mnn_edges.h"
#if LAYERDIFF_MNN_EXPRESS
#include "mnn_isolate.h"
#endif
#include "sysutil.h"

namespace ld {
namespace {

const char* const kOpenClLibraries[] = {"libOpenCL.so", "libOpenCL.so.1", "/system/vendor/lib64/libOpenCL.so",
                                        "/vendor/lib64/libOpenCL.so", "/system/lib64/libOpenCL.so", nullptr};
const char* const kVulkanLibraries[] = {"libvulkan.so", "libvulkan.so.1", nullptr};

std::string layout_of(size_t dims) {
    if (dims == 4) return "NCHW";
    if (dims == 2) return "NC";
    return "flat";
}

class MnnEngine : public Engine {
public:
    ~MnnEngine() override {
        if (net_ && session_) net_->releaseSession(session_);
        if (net_) MNN::Interpreter::destroy(net_);
    }

    void open(const RunConfig& config) override {
        if (config.isolate) return open_isolation(config);
        std::string library_error = mnn_load_backend_library(config.backend);
        const std::string& model = config.model_files[0];
        net_ = MNN::Interpreter::createFromFile(model.c_str());
        if (!net_) throw HarnessError(kExitModel, "MNN cannot load " + model + " (is it an .mnn file from a compatible MNNConvert?)");
        net_->setSessionMode(MNN::Interpreter::Session_Debug);
        MNN::BackendConfig backend_config;
        MNN::ScheduleConfig schedule = mnn_schedule(config.backend, config.precision, config.threads, &backend_config);
        session_ = net_->createSession(schedule);
        if (!session_) throw HarnessError(kExitBackend, "MNN could not create a " + config.backend + " session for " + model);
        facts_.engine = "mnn";
        facts_.engine_version = mnn_version();
        facts_.backends_actual = session_backends();
        facts_.precision_effective = mnn_effective_precision(facts_.backends_actual.front(), config.precision);
        facts_.options_json = mnn_options(schedule, config.backend, library_error).add("session_mode", "Session_Debug").str();
        edges_ = MnnGraphEdges::load(model);
    }

    EngineFacts facts() const override { return facts_; }
    int op_count() const override { return ops_seen_; }

    double run(const std::vector<NpyArray>& inputs, DumpWriter& out) override {
        if (!session_) throw HarnessError(kExitBadArgs, "this MNN engine was opened for --inject; run without it");
        feed_inputs(inputs);
        std::map<const MNN::Tensor*, std::string> producer;
        for (const auto& entry : net_->getSessionInputAll(session_)) producer[entry.second] = entry.first;
        std::set<std::string> known;  // the inputs and names dumped so far: what graph edges may map to
        for (const NpyArray& input : inputs) known.insert(input.name);
        std::set<std::string> used_names;
        std::vector<std::string> pending_inputs;
        std::string failure;
        double op_started = 0;
        int ops = 0;

        MNN::TensorCallBackWithInfo before = [&](const std::vector<MNN::Tensor*>& tensors, const MNN::OperatorInfo* info) {
            std::vector<std::string> by_address;
            for (size_t i = 0; i < tensors.size(); ++i) {  // constants get a placeholder, as on the host
                auto found = producer.find(tensors[i]);
                by_address.push_back(found != producer.end() ? found->second
                                                             : "<" + info->name() + " input " + std::to_string(i) + ">");
            }
            pending_inputs = edges_.op_inputs(info->name(), known, by_address);
            op_started = monotonic_ms();
            return true;
        };
        MNN::TensorCallBackWithInfo after = [&](const std::vector<MNN::Tensor*>& tensors, const MNN::OperatorInfo* info) {
            ++ops;
            double elapsed = monotonic_ms() - op_started;
            try {
                for (size_t i = 0; i < tensors.size(); ++i) {
                    // Named like the host MNN engine: the op for output 0, `<op>:<i>` for others.
                    std::string name = unique_name(i == 0 ? info->name() : info->name() + ":" + std::to_string(i), used_names);
                    producer[tensors[i]] = name;
                    if (tensors[i]->elementSize() > 0) known.insert(name);  // empty outputs are not dumped
                    if (out.wants(info->name())) dump_output(*tensors[i], *info, static_cast<int>(i), name, pending_inputs, elapsed, out);
                }
            } catch (const HarnessError& err) {
                failure = err.what();
                failure_code_ = err.code();
                return false;  // interrupt the session; rethrown below
            }
            return true;
        };
        double started = monotonic_ms();
        MNN::ErrorCode code = net_->runSessionWithCallBackInfo(session_, before, after, true);
        double infer_ms = monotonic_ms() - started;
        if (!failure.empty()) throw HarnessError(failure_code_, failure);
        if (code != MNN::NO_ERROR) throw HarnessError(kExitRun, "MNN run failed with error code " + std::to_string(code));
        ops_seen_ = ops;
        return infer_ms;
    }

    double isolate(const std::vector<std::string>& targets, const InjectSource& source, DumpWriter& out) override {
#if LAYERDIFF_MNN_EXPRESS
        if (isolator_) return isolator_->isolate(targets, source, out);
#endif
        (void)targets; (void)source; (void)out;
        throw HarnessError(kExitBadArgs, "the MNN engine was not opened for --inject");
    }

private:
    // --inject runs need no whole-model session: each target is cut out of the graph (Express).
    void open_isolation(const RunConfig& config) {
#if LAYERDIFF_MNN_EXPRESS
        isolator_ = make_mnn_isolator(config);
        facts_ = isolator_->facts();
#else
        (void)config;
        throw HarnessError(kExitBackend, "MNN built without Express: this harness found no libMNN_Express under MNN_ROOT "
                                         "(nor Express inside libMNN); --inject needs it: rebuild against an MNN with libMNN_Express");
#endif
    }

    std::vector<std::string> session_backends() {
        int types[16];
        for (int& t : types) t = -1;
        std::vector<std::string> names;
        if (net_->getSessionInfo(session_, MNN::Interpreter::BACKENDS, types)) {
            for (int t : types) {
                if (t < 0) break;
                std::string name = mnn_backend_name(t);
                bool seen = false;
                for (const auto& n : names) seen = seen || n == name;
                if (!seen) names.push_back(name);
            }
        }
        if (names.empty()) names.push_back("unknown");
        return names;
    }

    static std::string unique_name(const std::string& name, std::set<std::string>& used) {
        std::string candidate = name;
        for (int k = 1; used.count(candidate); ++k) candidate = name + "#" + std::to_string(k);
        used.insert(candidate);
        return candidate;
    }

    void feed_inputs(const std::vector<NpyArray>& inputs) {
        bool resized = false;
        for (const NpyArray& input : inputs) {
            MNN::Tensor* t = net_->getSessionInput(session_, input.name.c_str());
            if (!t || net_->getSessionInputAll(session_).count(input.name) == 0) {
                throw HarnessError(kExitRun, "MNN model has no input named '" + input.name + "'");
            }
            std::vector<int> shape(input.shape.begin(), input.shape.end());
            if (t->getDimensionType() != MNN::Tensor::TENSORFLOW && t->shape() != shape) {
                net_->resizeTensor(t, shape);
                resized = true;
            }
        }
        if (resized) net_->resizeSession(session_);
        for (const NpyArray& input : inputs) {
            MNN::Tensor* t = net_->getSessionInput(session_, input.name.c_str());
            MNN::Tensor host(t, MNN::Tensor::CAFFE);
            if (static_cast<size_t>(host.elementSize()) != input.data.size()) {
                throw HarnessError(kExitRun, "input " + input.file + " has " + std::to_string(input.data.size()) +
                                                 " values but MNN input '" + input.name + "' takes " + std::to_string(host.elementSize()));
            }
            std::memcpy(host.host<float>(), input.data.data(), input.data.size() * sizeof(float));
            t->copyFromHostTensor(&host);
        }
    }

    void dump_output(const MNN::Tensor& t, const MNN::OperatorInfo& info, int index, const std::string& name,
                     const std::vector<std::string>& inputs, double elapsed, DumpWriter& out) {
        if (t.elementSize() <= 0) return;
        MNN::Tensor host(&t, MNN::Tensor::CAFFE);
        t.copyToHostTensor(&host);
        TensorInfo record;
        record.op = info.name();
        record.op_type = info.type();
        record.output_index = index;
        record.name = name;
        record.inputs = inputs;
        for (int dim : host.shape()) record.shape.push_back(dim);
        record.dtype = mnn_dtype_name(host.getType());
        if (record.dtype.empty()) return;  // a type the raw format has no name for
        record.layout = layout_of(record.shape.size());
        record.memory = t.host<void>() == nullptr && t.deviceId() != 0 ? "device" : "host";
        record.time_ms = elapsed;
        out.write(record, host.host<void>(), static_cast<uint64_t>(host.usize()));
    }

    MNN::Interpreter* net_ = nullptr;
    MNN::Session* session_ = nullptr;
    EngineFacts facts_;
    MnnGraphEdges edges_;  // empty without Express: edges from addresses alone
    int ops_seen_ = 0;
    ExitCode failure_code_ = kExitRun;
#if LAYERDIFF_MNN_EXPRESS
    std::unique_ptr<MnnIsolator> isolator_;
#endif
};

}  // namespace

std::unique_ptr<Engine> make_mnn_engine() { return std::unique_ptr<Engine>(new MnnEngine()); }

std::string mnn_version() { return MNN::getVersion(); }

std::string mnn_probe_json() {
    JsonObject backends;
    backends.add_raw("cpu", JsonObject().add("ok", true).add("fp16", mnn_cpu_has_fp16_arith()).str());
    struct Gpu { const char* backend; const char* const* system_libraries; const char* what; };
    for (const Gpu& gpu : {Gpu{"opencl", kOpenClLibraries, "OpenCL"}, Gpu{"vulkan", kVulkanLibraries, "Vulkan"}}) {
        JsonObject entry;
        std::string reason;
        std::string backend_error = mnn_load_backend_library(gpu.backend);
        if (!library_loadable_anywhere(gpu.system_libraries, &reason)) {
            entry.add("ok", false).add("reason", std::string("no ") + gpu.what + " driver: " + reason);
        } else if (!backend_error.empty()) {
            // Unless this libMNN has the backend built in (no MNN_SEP_BUILD), runs fall back to cpu.
            entry.add("ok", false)
                .add("reason", std::string(mnn_backend_library(gpu.backend)) + " not loadable: " + backend_error)
                .add("driver", true);
        } else {
            entry.add("ok", true).add("backend_library", mnn_backend_library(gpu.backend));
        }
        backends.add_raw(gpu.backend, entry.str());
    }
    return JsonObject().add("version", mnn_version()).add_raw("backends", backends.str()).str();
}

}  // namespace ld
