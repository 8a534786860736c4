// MNN engine: one session in debug mode; every op's outputs are copied in the after-callback of
// runSessionWithCallBackInfo (MNN reuses buffers, so later is too late), keyed by the tensor the
// op writes, read from the model file (mnn_model.h), like the host engine of the `local` device.
//
// Why Tensor(t, CAFFE) + copyToHostTensor: it converts NC4HW4 and device memory to plain NCHW on
// the host (createHostTensorFromDevice would keep NC4HW4). A tensor MNN holds channels-last (the
// inputs and outputs of a TFLite-origin model, TENSORFLOW dimension type) is copied through a host
// tensor of its own type instead: its image is NHWC, as the model declares and the user gives it.
// Each input is read back after feeding and recorded (`input_fed`). Edges come from Tensor* identity:
// the after-callback records which op produced each tensor, the before-callback looks the
// op's inputs up, corrected by the model's graph where addresses mislead (mnn_edges.h). MNN falls
// back to the CPU silently when a GPU backend is missing, so the header's backends_actual, threads
// and precision_effective are read from the session (mnn_backend.h), never from the request; ops
// MNN hands to its CPU backup inside a GPU session are observed before the run (mnn_placement.h).
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
#include "mnn_model.h"
#include "mnn_placement.h"
#if LAYERDIFF_MNN_EXPRESS
#include "mnn_isolate.h"
#endif
#include "sysutil.h"

namespace ld {
namespace {

// The host tensor's dimension type for copies in and out: the tensor's own (NHWC stays NHWC),
// CAFFE (NCHW) for NCHW and packed NC4HW4 tensors.
MNN::Tensor::DimensionType host_type_of(const MNN::Tensor* t) {
    return t->getDimensionType() == MNN::Tensor::TENSORFLOW ? MNN::Tensor::TENSORFLOW : MNN::Tensor::CAFFE;
}

std::string layout_of(size_t dims, MNN::Tensor::DimensionType type = MNN::Tensor::CAFFE) {
    if (dims == 4 && type == MNN::Tensor::TENSORFLOW) return "NHWC";
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
        options_ = mnn_options(resolved, config.backend).add("session_mode", "Session_Debug");
        facts_.options_json = options_.str();
        adapter_ = mnn_adapter(resolved, config.backend);
        edges_ = MnnGraphEdges::load(model);
        std::pair<const void*, size_t> buffer = net_->getModelBuffer();
        ops_ = read_mnn_ops(buffer.first, buffer.second);
    }

    // Inputs fed (the session resized to them), then, on a GPU session, which ops MNN gave to its CPU
    // backup: recorded as options.placement, and "cpu" joins backends_actual (mnn_placement.h).
    void prepare(const std::vector<NpyArray>& inputs) override {
        if (!session_) return;
        feed_inputs(inputs);
        if (facts_.backends_actual.front() == "cpu") return;  // a CPU session has nothing to fall back from
        MnnPlacement placement = mnn_placement(net_, session_, ops_);
        if (!placement.read) return;  // nothing to record; the run itself will fail and say why
        if (placement.all_cpu()) facts_.backends_actual = {"cpu"};
        if (placement.split()) facts_.backends_actual.push_back("cpu");
        facts_.options_json = JsonObject(options_).add_raw("placement", mnn_placement_json(placement, adapter_).str()).str();
    }

    EngineFacts facts() const override { return facts_; }
    int op_count() const override { return ops_seen_; }

    double run(const std::vector<NpyArray>& inputs, DumpWriter& out) override {
        if (!session_) throw HarnessError(kExitBadArgs, "this MNN engine was opened for --inject; run without it");
        feed_inputs(inputs);
        record_fed(inputs, out);
        std::map<const MNN::Tensor*, std::string> producer;
        for (const auto& entry : net_->getSessionInputAll(session_)) producer[entry.second] = entry.first;
        std::set<std::string> known;  // the inputs and names dumped so far: what graph edges may map to
        for (const NpyArray& input : inputs) known.insert(input.name);
        MnnDumpKeys keys(ops_);
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
            pending_inputs = edges_.op_inputs(keys.graph_op(info->name()), known, by_address);
            op_started = monotonic_ms();
            return true;
        };
        MNN::TensorCallBackWithInfo after = [&](const std::vector<MNN::Tensor*>& tensors, const MNN::OperatorInfo* info) {
            ++ops;
            double elapsed = monotonic_ms() - op_started;
            try {
                for (size_t i = 0; i < tensors.size(); ++i) {
                    if (tensors[i]->elementSize() <= 0) continue;  // empty outputs get no key, as on the host
                    std::pair<std::string, std::string> key = keys.key(info->name(), i);
                    overwrite_if_replaced(tensors[i], key.first, static_cast<int>(i), key.second);
                    producer[tensors[i]] = key.second;
                    known.insert(key.second);
                    if (out.wants(key.first)) {
                        dump_output(*tensors[i], key.first, info->type(), static_cast<int>(i), key.second, pending_inputs, elapsed, out);
                    }
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
        if (!replace_.empty()) {
            throw HarnessError(kExitBadArgs, "--replace " + replace_.begin()->first.first + ":" +
                                                 std::to_string(replace_.begin()->first.second) +
                                                 ": no op of the model wrote that output");
        }
        dump_model_outputs(keys, producer, out);
        ops_seen_ = ops;
        return infer_ms;
    }

    std::vector<std::string> output_names() const override {
        std::vector<std::string> names;
        if (!session_) return names;
        for (const auto& entry : net_->getSessionOutputAll(session_)) names.push_back(entry.first);
        return names;
    }

    // The same session run as an app runs it: runSession, no per-op callback, only the outputs read.
    std::vector<PlainOutput> plain_run(const std::vector<NpyArray>& inputs) override {
        feed_inputs(inputs);
        MNN::ErrorCode code = net_->runSession(session_);
        if (code != MNN::NO_ERROR) throw HarnessError(kExitRun, "MNN's plain run (runSession) failed with error code " + std::to_string(code));
        std::vector<PlainOutput> outputs;
        for (const auto& entry : net_->getSessionOutputAll(session_)) {
            const MNN::Tensor* t = entry.second;
            if (t->elementSize() <= 0) continue;
            MNN::Tensor host(t, MNN::Tensor::CAFFE);
            t->copyToHostTensor(&host);
            if (host.getType() != halide_type_of<float>()) continue;  // compared where the dump holds float32
            PlainOutput output;
            output.name = entry.first;
            for (int dim : host.shape()) output.shape.push_back(dim);
            output.values.assign(host.host<float>(), host.host<float>() + host.elementSize());
            outputs.push_back(std::move(output));
        }
        return outputs;
    }

    std::string observing() const override {
        return "the session runs through runSessionWithCallBackInfo, every op's output copied to the host inside the "
               "after-callback; the plain run is runSession of the same session without callbacks, as an app runs it";
    }

    void replace_outputs(const std::vector<std::string>& keys, const InjectSource& source) override {
        replace_.clear();
        replace_source_ = &source;
        for (const std::string& key : keys) {
            std::string op;
            int index = 0;
            split_tensor_key(key, &op, &index);
            std::string name = index == 0 ? op : op + ":" + std::to_string(index);  // the dump's name for it
            if (!source.has(name)) throw HarnessError(kExitBadArgs, "--replace " + key + ": the inject dump has no tensor " + name);
            replace_[{op, index}] = name;
        }
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
            MNN::Tensor host(t, host_type_of(t));
            if (static_cast<size_t>(host.elementSize()) != input.data.size()) {
                throw HarnessError(kExitRun, "input " + input.file + " has " + std::to_string(input.data.size()) +
                                                 " values but MNN input '" + input.name + "' takes " + std::to_string(host.elementSize()));
            }
            std::memcpy(host.host<float>(), input.data.data(), input.data.size() * sizeof(float));
            t->copyFromHostTensor(&host);
        }
    }

    // Each input read back from the session's own input tensor after feeding, the way outputs are
    // read: the bytes MNN computes on, recorded for the collector to check against the input given.
    void record_fed(const std::vector<NpyArray>& inputs, DumpWriter& out) {
        for (const NpyArray& input : inputs) {
            MNN::Tensor* t = net_->getSessionInput(session_, input.name.c_str());
            MNN::Tensor host(t, host_type_of(t));
            t->copyToHostTensor(&host);
            std::vector<int64_t> shape;
            for (int dim : host.shape()) shape.push_back(dim);
            std::string dtype = mnn_dtype_name(host.getType());
            if (dtype.empty()) continue;
            out.write_fed(input.name, shape, dtype, layout_of(shape.size(), host_type_of(t)), host.host<void>(),
                          static_cast<uint64_t>(host.usize()));
        }
    }

    // --replace: writes the reference value into an op's output inside the after-callback, so the
    // ops after it read it (each key once: a repeated name's `#k` copies keep what MNN computed).
    void overwrite_if_replaced(MNN::Tensor* t, const std::string& op, int index, const std::string& name) {
        auto found = replace_.find({op, index});
        if (found == replace_.end()) return;
        std::vector<float> values = replace_source_->read(found->second);
        MNN::Tensor host(t, host_type_of(t));
        if (host.getType() != halide_type_of<float>() || static_cast<size_t>(host.elementSize()) != values.size()) {
            throw HarnessError(kExitBadArgs, "--replace " + name + ": the injected tensor has " + std::to_string(values.size()) +
                                                 " float values, the op writes " + std::to_string(host.elementSize()) +
                                                 (host.getType() == halide_type_of<float>() ? " float values" : " non-float values"));
        }
        std::memcpy(host.host<float>(), values.data(), values.size() * sizeof(float));
        t->copyFromHostTensor(&host);
        replace_.erase(found);
    }

    // The model's outputs under their own names, when no model op was keyed by them: MNN often
    // writes an output through a runtime raster (a layout conversion), which alignment sets aside
    // as engine-made. Read after the run, they are the values the model returns; the producer is
    // the last op that wrote the output tensor.
    void dump_model_outputs(MnnDumpKeys& keys, const std::map<const MNN::Tensor*, std::string>& producer, DumpWriter& out) {
        for (const auto& entry : net_->getSessionOutputAll(session_)) {
            if (keys.used(entry.first)) continue;
            const MNN::Tensor* t = entry.second;
            if (t->elementSize() <= 0) {
                throw HarnessError(kExitRun, "MNN computed no value for model output '" + entry.first + "'; models with "
                                             "control flow (If/Loop) need MNN's Module API, which this engine does not use");
            }
            keys.use(entry.first);
            auto found = producer.find(t);
            std::vector<std::string> inputs;
            if (found != producer.end()) inputs.push_back(found->second);
            if (out.wants(entry.first)) dump_output(*t, entry.first, "Output", 0, entry.first, inputs, 0.0, out);
        }
    }

    void dump_output(const MNN::Tensor& t, const std::string& op, const std::string& op_type, int index,
                     const std::string& name, const std::vector<std::string>& inputs, double elapsed, DumpWriter& out) {
        MNN::Tensor host(&t, host_type_of(&t));
        t.copyToHostTensor(&host);
        TensorInfo record;
        record.op = op;
        record.op_type = op_type;
        record.output_index = index;
        record.name = name;
        record.inputs = inputs;
        for (int dim : host.shape()) record.shape.push_back(dim);
        record.dtype = mnn_dtype_name(host.getType());
        if (record.dtype.empty()) return;  // a type the raw format has no name for
        record.layout = layout_of(record.shape.size(), host_type_of(&t));
        record.memory = t.host<void>() == nullptr && t.deviceId() != 0 ? "device" : "host";
        record.time_ms = elapsed;
        out.write(record, host.host<void>(), static_cast<uint64_t>(host.usize()));
    }

    MNN::Interpreter* net_ = nullptr;
    MNN::Session* session_ = nullptr;
    EngineFacts facts_;
    JsonObject options_;   // the header's options before placement is known
    std::string adapter_;  // the GPU backend and device, as options.placement names it
    MnnGraphEdges edges_;  // empty without Express: edges from addresses alone
    MnnOps ops_;           // the tensors each model op writes: the dump's keys
    std::map<std::pair<std::string, int>, std::string> replace_;  // (dump op, output index) -> inject tensor name
    const InjectSource* replace_source_ = nullptr;
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
        if (resolved.opencl.found) entry.add("device", resolved.opencl.name).add("fp16", resolved.opencl.fp16);
        if (!resolved.available) entry.add("reason", resolved.reason);
        backends.add_raw(backend, entry.str());
    }
    return JsonObject().add("version", mnn_version()).add_raw("backends", backends.str()).str();
}

}  // namespace ld
