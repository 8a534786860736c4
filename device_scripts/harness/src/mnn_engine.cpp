// MNN engine: one session in debug mode; every op's outputs are copied in the after-callback of
// runSessionWithCallBackInfo (MNN reuses buffers, so later is too late).
//
// Why Tensor(t, CAFFE) + copyToHostTensor: it converts NC4HW4 and device memory to plain NCHW on
// the host (createHostTensorFromDevice would keep NC4HW4). Edges come from Tensor* identity:
// the after-callback records which op produced each tensor, the before-callback looks the
// op's inputs up, corrected by the model's graph where addresses mislead (mnn_edges.h). MNN falls
// back to the CPU silently when a GPU backend is missing, so the header's backends_actual, threads
// and precision_effective are read from the session (mnn_backend.h), never from the request.
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
        MNN::BackendConfig backend_config;
        MnnResolved resolved = mnn_resolve(config.backend, config.precision, config.threads, &backend_config);
        const std::string& model = config.model_files[0];
        net_ = MNN::Interpreter::createFromFile(model.c_str());
        if (!net_) throw HarnessError(kExitModel, "MNN cannot load " + model + " (is it an .mnn file from a compatible MNNConvert?)");
        net_->setSessionMode(MNN::Interpreter::Session_Debug);
        session_ = net_->createSession(resolved.schedule);
        if (!session_) throw HarnessError(kExitBackend, "MNN could not create a " + config.backend + " session for " + model);
        MnnSessionFacts session_facts = mnn_session_facts(net_, session_, config.precision);
        facts_.engine = "mnn";
        facts_.engine_version = mnn_version();
        facts_.backends_actual = session_facts.backends;
        facts_.precision_effective = session_facts.precision;
        facts_.threads = session_facts.threads;
        facts_.options_json = mnn_options(resolved, config.backend).add("session_mode", "Session_Debug").str();
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

// One rule for every GPU entry (HARNESS_CLI.md): ok when MNN, asked for that backend, creates a
// runtime of that type, i.e. exactly when a run would not fall back to the CPU.
std::string mnn_probe_json() {
    JsonObject backends;
    backends.add_raw("cpu", JsonObject().add("ok", true).add("fp16", mnn_cpu_has_fp16_arith()).str());
    for (const char* backend : {"opencl", "vulkan"}) {
        MNN::BackendConfig backend_config;
        MnnResolved resolved = mnn_resolve(backend, "normal", 1, &backend_config);
        JsonObject entry;
        entry.add("ok", resolved.available).add("backend_library", resolved.library);
        if (!resolved.available) entry.add("reason", resolved.reason);
        backends.add_raw(backend, entry.str());
    }
    return JsonObject().add("version", mnn_version()).add_raw("backends", backends.str()).str();
}

}  // namespace ld
