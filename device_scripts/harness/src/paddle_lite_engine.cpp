// Paddle-Lite engine (`--engine paddle-lite`, `.nb` models from Paddle-Lite's opt): one
// MobileConfig predictor; after Run() every variable of the optimised program is read with
// GetTensor, in runtime order, under its Paddle name (the name the `paddle` golden dumps it by).
//
// Why the program is read from the .nb first (paddle_lite_model.h): the API lists no ops, GetTensor
// aborts the process for a variable fusion removed, and a .nb optimised for another target loads and
// "runs" (rc 0) with uninitialised garbage, so the kernels' targets are checked against the
// requested backend and this CPU before anything runs. Tensors that live in OpenCL memory cannot be
// read through the public API (Tensor::CopyToCpu serves host/ARM memory only): they are listed in
// the header as not observable, never dumped as zeros; Paddle-Lite's precision profiler dumps them
// (analyze imports its directory). Precision: on OpenCL low/normal/high set CL_PRECISION_FP16/AUTO/
// FP32; on the CPU the .nb decides (opt --enable_fp16), and the header says which it was. The plain run
// (docs/fidelity.md) feeds the inputs again, calls Run() and reads only the outputs with GetOutput.
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <paddle_api.h>

#include "engine.h"
#include "errors.h"
#include "json.h"
#include "paddle_lite_model.h"
#include "sysutil.h"

namespace ld {
namespace {

using paddle::lite_api::MobileConfig;
using paddle::lite_api::PaddlePredictor;
using paddle::lite_api::PrecisionType;
using paddle::lite_api::TargetType;

#if defined(__aarch64__) || defined(__arm__)
const int kThisCpu = kNbARM;
#else
const int kThisCpu = kNbX86;
#endif

std::string base_name(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::set<int> kernel_targets(const NbProgram& program) {
    std::set<int> targets;
    for (const NbOp& op : program.ops) {
        if (op.type != "feed" && op.type != "fetch" && op.target > kNbHost) targets.insert(op.target);
    }
    return targets;
}

std::string target_list(const std::set<int>& targets) {
    std::string out;
    for (int t : targets) out += (out.empty() ? "" : ", ") + nb_target_name(t);
    return out.empty() ? "host only" : out;
}

// The one-line refusal of a .nb whose kernels were picked for another target than this run's.
void check_targets(const NbProgram& program, const std::string& model, const std::string& backend) {
    std::set<int> targets = kernel_targets(program);
    std::string name = base_name(model), cpu = nb_target_name(kThisCpu);
    std::string have = name + " was optimised for " + target_list(targets);
    if (backend == "vulkan") throw HarnessError(kExitBackend, "Paddle-Lite has no Vulkan backend; use --backend cpu or opencl");
    if (backend == "opencl" && !targets.count(kNbOpenCL)) {
        throw HarnessError(kExitModel, have + ", not OpenCL: optimise it with opt --valid_targets=opencl," + cpu + " for --backend opencl");
    }
    if (backend == "cpu" && targets.count(kNbOpenCL)) {
        throw HarnessError(kExitModel, have + ": for --backend cpu optimise it with opt --valid_targets=" + cpu);
    }
    for (int t : targets) {
        if (t != kNbOpenCL && t != kThisCpu) {
            throw HarnessError(kExitModel, have + " but this harness runs " + cpu + " kernels (" + build_abi() +
                                                 "): optimise it with opt --valid_targets=" +
                                                 (backend == "opencl" ? "opencl," + cpu : cpu) + " (a foreign .nb runs on garbage)");
        }
    }
}

std::string dtype_of(PrecisionType p) {
    switch (p) {
        case PrecisionType::kFloat: return "float32";
        case PrecisionType::kInt32: return "int32";
        case PrecisionType::kInt64: return "int64";
        case PrecisionType::kInt8: return "int8";
        case PrecisionType::kUInt8: return "uint8";
        case PrecisionType::kBool: return "uint8";
        case PrecisionType::kFP16: return "float16";  // an fp16 .nb (opt --enable_fp16): the values it holds
        case PrecisionType::kFP64: return "float64";
        default: return "";
    }
}

// Variables written by OpenCL kernels other than io_copy device_to_host: they stay in OpenCL
// images or buffers, which GetTensor's Tensor cannot copy to the host.
std::vector<std::string> in_device_memory(const NbProgram& program) {
    std::vector<std::string> names;
    for (const NbOp& op : program.ops) {
        if (op.target != kNbOpenCL || op.alias.find("device_to_host") != std::string::npos) continue;
        for (const auto& slot : op.outputs) for (const std::string& n : slot.second) names.push_back(n);
    }
    return names;
}

class PaddleLiteEngine : public Engine {
public:
    void open(const RunConfig& config) override {
        if (config.isolate) throw HarnessError(kExitBadArgs, "--inject is not supported by the paddle-lite engine");
        model_ = config.model_files[0];
        program_ = read_nb_program(model_);
        check_targets(program_, model_, config.backend);
        MobileConfig mobile;
        mobile.set_model_from_file(model_);
        mobile.set_threads(config.threads);
        std::string effective = "fp32";
        if (config.backend == "opencl") {
            if (!paddle::lite_api::IsOpenCLBackendValid()) {
                throw HarnessError(kExitBackend, "Paddle-Lite found no usable OpenCL device (IsOpenCLBackendValid is false); use --backend cpu");
            }
            bool fp16 = paddle::lite_api::IsOpenCLBackendValid(true);
            auto precision = config.precision == "low" ? paddle::lite_api::CL_PRECISION_FP16
                             : config.precision == "high" ? paddle::lite_api::CL_PRECISION_FP32
                                                          : paddle::lite_api::CL_PRECISION_AUTO;
            mobile.set_opencl_precision(precision);
            effective = (config.precision == "low" || (config.precision == "normal" && fp16)) && fp16 ? "fp16" : "fp32";
        } else {
            for (const NbOp& op : program_.ops) {
                if (op.precision == kNbFP16) effective = "fp16";  // the .nb carries fp16 kernels (opt --enable_fp16)
            }
        }
        predictor_ = paddle::lite_api::CreatePaddlePredictor<MobileConfig>(mobile);
        if (!predictor_) throw HarnessError(kExitModel, "Paddle-Lite cannot load " + model_);
        std::set<int> targets = kernel_targets(program_);
        facts_.engine = "paddle-lite";
        facts_.engine_version = paddle_lite_version();
        facts_.backends_actual = targets.count(kNbOpenCL) ? std::vector<std::string>{"opencl"} : std::vector<std::string>{"cpu"};
        if (targets.count(kNbOpenCL) && targets.count(kThisCpu)) facts_.backends_actual.push_back("cpu");
        facts_.precision_effective = effective;
        facts_.threads = config.threads;
        not_observable_ = in_device_memory(program_);
        facts_.options_json = JsonObject().add("predictor", "MobileConfig").add("nb_opt_version", program_.opt_version)
                                  .add("nb_kernel_targets", target_list(targets))
                                  .add("not_observable", not_observable_).str();
    }

    EngineFacts facts() const override { return facts_; }

    int op_count() const override { return static_cast<int>(program_.ops.size()); }

    double run(const std::vector<NpyArray>& inputs, DumpWriter& out) override {
        for (const NpyArray& input : inputs) feed(input);
        for (const NpyArray& input : inputs) record_fed(input, out);
        double started = monotonic_ms();
        predictor_->Run();
        double infer_ms = monotonic_ms() - started;
        dump_variables(out, infer_ms);
        return infer_ms;
    }

    // The plain run (docs/fidelity.md): the program's own outputs, as the predictor names them.
    std::vector<std::string> output_names() const override { return predictor_ ? predictor_->GetOutputNames() : std::vector<std::string>(); }

    // The inputs fed again, Run(), and only the outputs read with GetOutput, as an app reads them. Outputs that
    // are not float32 (ids, fp16) are left out: the footer then has no entry for them.
    std::vector<PlainOutput> plain_run(const std::vector<NpyArray>& inputs) override {
        for (const NpyArray& input : inputs) feed(input);
        predictor_->Run();
        std::vector<std::string> names = predictor_->GetOutputNames();
        std::vector<PlainOutput> outputs;
        for (size_t i = 0; i < names.size(); ++i) {
            std::unique_ptr<const paddle::lite_api::Tensor> t = predictor_->GetOutput(static_cast<int>(i));
            if (!t || t->precision() != PrecisionType::kFloat || t->target() == TargetType::kOpenCL) continue;
            PlainOutput output;
            output.name = names[i];
            output.shape = t->shape();
            int64_t numel = 1;
            for (int64_t d : output.shape) numel *= d;
            if (numel <= 0) continue;
            const float* values = t->data<float>();
            output.values.assign(values, values + numel);
            outputs.push_back(std::move(output));
        }
        return outputs;
    }

    std::string observing() const override {
        return "after Run() every variable of the optimised program is read back with GetTensor; the plain run "
               "reads only the program's outputs with GetOutput, as an app reads them";
    }

private:
    void feed(const NpyArray& input) {
        std::vector<std::string> names = predictor_->GetInputNames();
        bool known = false;
        for (const std::string& n : names) known = known || n == input.name;
        if (!known) throw HarnessError(kExitRun, "the .nb model has no input named '" + input.name + "'");
        std::unique_ptr<paddle::lite_api::Tensor> tensor = predictor_->GetInputByName(input.name);
        tensor->Resize(std::vector<int64_t>(input.shape.begin(), input.shape.end()));
        std::memcpy(tensor->mutable_data<float>(), input.data.data(), input.data.size() * sizeof(float));
    }

    // The input tensor read back after feeding (`input_fed`): the values Paddle-Lite computes on.
    void record_fed(const NpyArray& input, DumpWriter& out) {
        std::unique_ptr<const paddle::lite_api::Tensor> t = predictor_->GetInputByName(input.name);
        if (!t) return;
        std::vector<int64_t> shape = t->shape();
        int64_t numel = 1;
        for (int64_t d : shape) numel *= d;
        if (numel <= 0) return;
        out.write_fed(input.name, shape, "float32", shape.size() == 4 ? "NCHW" : "", t->data<float>(),
                      static_cast<uint64_t>(numel) * sizeof(float));
    }

    // Every op output in runtime order, once; weights and feed/fetch are not layers.
    void dump_variables(DumpWriter& out, double infer_ms) {
        std::set<std::string> weights, done;
        for (const NbVar& v : program_.vars) if (v.persistable) weights.insert(v.name);
        std::set<std::string> skip(not_observable_.begin(), not_observable_.end());
        double per_op = program_.ops.empty() ? 0 : infer_ms / program_.ops.size();
        for (const NbOp& op : program_.ops) {
            if (op.type == "feed" || op.type == "fetch") continue;
            std::vector<std::string> inputs;
            for (const auto& slot : op.inputs) for (const std::string& n : slot.second) if (!weights.count(n)) inputs.push_back(n);
            for (const auto& slot : op.outputs) {
                for (const std::string& name : slot.second) {
                    if (weights.count(name) || skip.count(name) || !done.insert(name).second || !out.wants(name)) continue;
                    dump_one(name, op.type, inputs, per_op, out);
                }
            }
        }
    }

    void dump_one(const std::string& name, const std::string& op_type, const std::vector<std::string>& inputs,
                  double time_ms, DumpWriter& out) {
        std::unique_ptr<const paddle::lite_api::Tensor> t = predictor_->GetTensor(name);
        if (!t) return;
        std::vector<int64_t> shape = t->shape();
        int64_t numel = 1;
        for (int64_t d : shape) numel *= d;
        if (numel <= 0) return;  // bookkeeping outputs (XShape) hold no values
        if (t->target() == TargetType::kOpenCL) return;  // device memory the program did not say: never read as host
        std::string dtype = dtype_of(t->precision());
        if (dtype.empty()) return;  // strings and other non-numeric variables are not layers
        TensorInfo info;
        info.op = name;
        info.op_type = op_type;
        info.name = name;
        info.inputs = inputs;
        info.shape = shape;
        info.dtype = dtype;
        info.layout = shape.size() == 4 ? "NCHW" : "";
        info.time_ms = time_ms;
        out.write(info, t->data<void>(), static_cast<uint64_t>(numel) * dtype_size(dtype));
    }

    std::string model_;
    NbProgram program_;
    std::shared_ptr<PaddlePredictor> predictor_;
    EngineFacts facts_;
    std::vector<std::string> not_observable_;
};

}  // namespace

std::unique_ptr<Engine> make_paddle_lite_engine() { return std::unique_ptr<Engine>(new PaddleLiteEngine()); }

std::string paddle_lite_version() {
#ifdef LAYERDIFF_PADDLE_LITE_VERSION
    return LAYERDIFF_PADDLE_LITE_VERSION;
#else
    return "unknown";
#endif
}

std::string paddle_lite_probe_json() {
    JsonObject backends;
    backends.add_raw("cpu", JsonObject().add("ok", true).add("kernels", nb_target_name(kThisCpu)).str());
    bool opencl = paddle::lite_api::IsOpenCLBackendValid();
    JsonObject cl;
    cl.add("ok", opencl);
    if (opencl) cl.add("fp16", paddle::lite_api::IsOpenCLBackendValid(true));
    else cl.add("reason", "Paddle-Lite found no usable OpenCL device (or this library was built without OpenCL)");
    backends.add_raw("opencl", cl.str());
    backends.add_raw("vulkan", JsonObject().add("ok", false).add("reason", "Paddle-Lite has no Vulkan backend").str());
    return JsonObject().add("version", paddle_lite_version()).add_raw("backends", backends.str()).str();
}

}  // namespace ld
