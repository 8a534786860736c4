// MNN op isolation through the Express API, mirroring the pymnn engine of the `local` device
// (collector/engines/mnn/engine.py: isolate, graph_tensor, injected_value).
//
// Why Express and not a Session with Path::Mode::Tensor: Module::load(inputs, outputs) cuts the
// graph between named graph tensors and takes any tensor as an input, which is exactly "this op,
// fed these tensors". Graph tensors are not always the tensors a dump names: MNN fuses an
// activation into a convolution (the graph tensor is `conv/relu`, the dump's op `conv`) and
// replaces some ops at run time (Concat -> Raster), whose inputs then have no reference value.
#include "mnn_isolate.h"

#include <map>
#include <memory>
#include <set>

#include <MNN/expr/Executor.hpp>
#include <MNN/expr/Expr.hpp>
#include <MNN/expr/ExprCreator.hpp>
#include <MNN/expr/Module.hpp>

#include "errors.h"
#include "mnn_backend.h"
#include "sysutil.h"

namespace ld {
namespace {

using MNN::Express::EXPRP;
using MNN::Express::Module;
using MNN::Express::VARP;
using MNN::Express::Variable;
using RuntimeManager = MNN::Express::Executor::RuntimeManager;

[[noreturn]] void refuse(const std::string& key, const std::string& why) {
    throw HarnessError(kExitBadArgs, "--target " + key + ": " + why);
}

std::string layout_of(size_t dims) {
    if (dims == 4) return "NCHW";
    if (dims == 2) return "NC";
    return "flat";
}

std::string joined(const std::vector<std::string>& names) {
    std::string text;
    for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
    return "[" + text + "]";
}

// Weights, axes and other constants are graph sources too; they stay inside the cut sub-graph
// (feeding them from the reference would need values no dump holds).
bool is_constant(const VARP& var) {
    EXPRP expr = var->expr().first;
    return expr && expr->get() == nullptr && expr->inputType() != VARP::INPUT;
}

class ExpressIsolator : public MnnIsolator {
public:
    explicit ExpressIsolator(const RunConfig& config) : config_(config), model_(config.model_files[0]) {
        MnnResolved resolved = mnn_resolve(config.backend, config.precision, config.threads, &backend_config_);
        graph_ = Variable::loadMap(model_.c_str());
        if (graph_.empty()) throw HarnessError(kExitModel, "MNN cannot load the graph of " + model_ + " (is it an .mnn file from a compatible MNNConvert?)");
        runtime_.reset(RuntimeManager::createRuntimeManager(resolved.schedule), RuntimeManager::destroy);
        if (!runtime_) throw HarnessError(kExitBackend, "MNN could not create a " + config.backend + " runtime for " + model_);
        MnnSessionFacts observed = session_facts(resolved.schedule);
        facts_.engine = "mnn";
        facts_.engine_version = mnn_version();
        facts_.backends_actual = {runtime_backend()};
        facts_.precision_effective = observed.precision;
        facts_.threads = observed.threads;
        facts_.options_json = mnn_options(resolved, config.backend).add("api", "Express Module (isolation)").str();
    }

    EngineFacts facts() const override { return facts_; }

    double isolate(const std::vector<std::string>& targets, const InjectSource& source, DumpWriter& out) override {
        double total = 0;
        std::set<std::string> done;
        for (const std::string& key : targets) {
            std::string op;
            int index = 0;
            split_tensor_key(key, &op, &index);
            if (!done.insert(op + ":" + std::to_string(index)).second) continue;  // each tensor once
            total += isolate_one(key, op, index, source, out);
        }
        return total;
    }

private:
    // What MNN resolved the requested backend to (CPU when the GPU backend is missing). MNN 3.6.1
    // fills the type in but returns false for BACKENDS (later versions return true): the value says.
    std::string runtime_backend() {
        int type = -1;
        runtime_->getInfo(MNN::Interpreter::BACKENDS, &type);
        return type < 0 ? "unknown" : mnn_backend_name(type);
    }

    // MNN reports threads and storage per session, and a Module's sessions are internal: a
    // whole-model session on the same schedule, released before any target runs, says the same.
    MnnSessionFacts session_facts(const MNN::ScheduleConfig& schedule) const {
        std::unique_ptr<MNN::Interpreter, void (*)(MNN::Interpreter*)> net(MNN::Interpreter::createFromFile(model_.c_str()),
                                                                           MNN::Interpreter::destroy);
        if (!net) throw HarnessError(kExitModel, "MNN cannot load " + model_ + " (is it an .mnn file from a compatible MNNConvert?)");
        MNN::Session* session = net->createSession(schedule);
        if (!session) throw HarnessError(kExitBackend, "MNN could not create a " + config_.backend + " session for " + model_);
        MnnSessionFacts facts = mnn_session_facts(net.get(), session, config_.precision);
        net->releaseSession(session);
        return facts;
    }

    double isolate_one(const std::string& key, const std::string& op, int index, const InjectSource& source, DumpWriter& out) {
        std::string output = output_tensor(key, op, index);
        std::vector<std::string> names = fed_tensors(key, output);
        std::vector<VARP> feeds;
        for (const std::string& name : names) feeds.push_back(injected_value(source, name, key));
        std::shared_ptr<Module> module(Module::load(names, {output}, model_.c_str(), runtime_, &module_config_), Module::destroy);
        if (!module) refuse(key, "MNN cannot cut the graph at " + joined(names) + " -> " + output);
        double started = monotonic_ms();
        std::vector<VARP> outputs = module->onForward(feeds);
        VARP result = outputs.empty() || outputs[0].get() == nullptr ? nullptr : MNN::Express::_Convert(outputs[0], MNN::Express::NCHW);
        const Variable::Info* info = result.get() ? result->getInfo() : nullptr;
        const void* values = info ? result->readMap<void>() : nullptr;
        double elapsed = monotonic_ms() - started;
        if (!values) throw HarnessError(kExitRun, "MNN failed running " + key + " alone on " + config_.backend + " (fed " + joined(names) + ")");
        write_output(op, index, names, *info, values, elapsed, out);
        return elapsed;
    }

    // The graph tensor the target writes: the op's own name, or `<op>/<activation>` when MNN
    // fused one in; output k > 0 is the k-th output of the same expression.
    std::string output_tensor(const std::string& key, const std::string& op, int index) const {
        std::string tensor = op;
        if (!graph_.count(op)) {
            std::vector<std::string> fused;
            for (const auto& entry : graph_) {
                if (entry.first.compare(0, op.size() + 1, op + "/") == 0) fused.push_back(entry.first);
            }
            if (fused.size() != 1) refuse(key, "no graph tensor of op '" + op + "' in the model (runtime-only ops such as rasters cannot be isolated)");
            tensor = fused[0];
        }
        EXPRP expr = graph_.at(tensor)->expr().first;
        if (!expr || expr->get() == nullptr) refuse(key, "'" + op + "' is a model input or constant, not an op");
        if (index == 0) return tensor;
        if (index >= expr->outputSize()) refuse(key, "op " + op + " has " + std::to_string(expr->outputSize()) + " output(s)");
        std::string name = expr->outputName(index);
        if (!graph_.count(name)) refuse(key, "output " + std::to_string(index) + " of op " + op + " has no graph tensor");
        return name;
    }

    // The target's non-constant input tensors, by graph name: the cut sub-graph's inputs.
    std::vector<std::string> fed_tensors(const std::string& key, const std::string& output) const {
        std::vector<std::string> names;
        for (const VARP& input : graph_.at(output)->expr().first->inputs()) {
            if (input.get() == nullptr || is_constant(input) || !graph_.count(input->name())) continue;
            bool seen = false;
            for (const std::string& name : names) seen = seen || name == input->name();
            if (!seen) names.push_back(input->name());
        }
        if (names.empty()) refuse(key, "the op has no input tensor to feed (only constants)");
        return names;
    }

    // A graph tensor's reference value: dumps name tensors by op, so `conv/relu` may be `conv`.
    VARP injected_value(const InjectSource& source, const std::string& tensor, const std::string& key) const {
        std::string name = tensor;
        while (!name.empty() && !source.has(name)) {
            size_t slash = name.rfind('/');
            name = slash == std::string::npos ? "" : name.substr(0, slash);
        }
        if (name.empty()) {
            refuse(key, "the reference has no value for its input tensor '" + tensor +
                            "' (produced by an op MNN replaced at run time); isolate the op that feeds it instead");
        }
        std::vector<float> values = source.read(name);
        std::vector<int> shape(source.info(name).shape.begin(), source.info(name).shape.end());
        return MNN::Express::_Const(values.data(), shape, MNN::Express::NCHW, halide_type_of<float>());
    }

    void write_output(const std::string& op, int index, const std::vector<std::string>& names, const Variable::Info& info,
                      const void* values, double elapsed, DumpWriter& out) const {
        TensorInfo record;
        record.op = op;
        record.op_type = "isolated";  // as the host engine: the op's type name is not in MNN's public API
        record.output_index = index;
        record.name = index == 0 ? op : op + ":" + std::to_string(index);
        record.inputs = names;
        for (int dim : info.dim) record.shape.push_back(dim);
        record.dtype = mnn_dtype_name(info.type);
        if (record.dtype.empty()) throw HarnessError(kExitRun, "op " + op + " gives a tensor type the raw dump format has no name for");
        record.layout = layout_of(record.shape.size());
        record.memory = facts_.backends_actual.front() == "cpu" ? "host" : "device";
        record.time_ms = elapsed;
        out.write(record, values, static_cast<uint64_t>(info.size) * info.type.bytes());
    }

    RunConfig config_;
    std::string model_;
    MNN::BackendConfig backend_config_;
    Module::Config module_config_;  // static, shape-mutable: what pymnn's load_module_from_file uses
    std::map<std::string, VARP> graph_;
    std::shared_ptr<RuntimeManager> runtime_;
    EngineFacts facts_;
};

}  // namespace

std::unique_ptr<MnnIsolator> make_mnn_isolator(const RunConfig& config) {
    return std::unique_ptr<MnnIsolator>(new ExpressIsolator(config));
}

}  // namespace ld
