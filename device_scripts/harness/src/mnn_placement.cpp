#include "mnn_placement.h"

#include <set>

#include <MNN/Tensor.hpp>

#include "sysutil.h"

namespace ld {
namespace {

// A GPU backend keeps a tensor in device memory (deviceId set, no host pointer); the CPU writes host memory.
bool on_host(const MNN::Tensor* t) { return t->host<void>() != nullptr || t->deviceId() == 0; }

const char* const kCpuReason = "MNN's GPU backend has no execution for this op type or its inputs on this device "
                               "(MNN's CPU backup backend runs it)";

}  // namespace

MnnPlacement mnn_placement(MNN::Interpreter* net, MNN::Session* session, const MnnOps& ops) {
    MnnPlacement placement;
    MnnDumpKeys keys(ops);  // a fresh key table: names come out as the run's will, in the same order
    int index = 0;
    MNN::TensorCallBackWithInfo skip = [](const std::vector<MNN::Tensor*>&, const MNN::OperatorInfo*) { return false; };
    MNN::TensorCallBackWithInfo look = [&](const std::vector<MNN::Tensor*>& outputs, const MNN::OperatorInfo* info) {
        std::string key;
        bool any = false, host = true;
        for (size_t i = 0; i < outputs.size(); ++i) {
            if (outputs[i]->elementSize() <= 0) continue;
            std::string name = keys.key(info->name(), i).first;
            if (!any) key = name;
            any = true;
            host = host && on_host(outputs[i]);
        }
        if (any) {
            if (host) placement.cpu.push_back({key, info->type(), index});
            ++placement.ops;
        }
        ++index;
        return true;
    };
    StdoutToStderr quiet;  // nothing of MNN's chatter on our stdout
    placement.read = net->runSessionWithCallBackInfo(session, skip, look, true) == MNN::NO_ERROR;
    return placement;
}

JsonObject mnn_placement_json(const MnnPlacement& placement, const std::string& adapter) {
    std::vector<std::string> rejected, cpu;
    std::set<std::string> types;
    for (const MnnPlacedOp& op : placement.cpu) {
        if (types.insert(op.op_type).second) {
            rejected.push_back(JsonObject().add("op_type", op.op_type).add("reason", kCpuReason).str());
        }
        cpu.push_back(JsonObject().add("index", op.index).add("name", op.name).add("op_type", op.op_type).str());
    }
    JsonObject per_op;
    per_op.add("derived", true)
        .add("how", "observed in MNN's session: these ops write host tensors, every other op writes OpenCL/Vulkan "
                    "device tensors")
        .add_raw("cpu", json_array(cpu));
    return JsonObject()
        .add("split", placement.split())
        .add("adapter", adapter)
        .add("ops", placement.ops)
        .add("gpu_ops", placement.ops - static_cast<int>(placement.cpu.size()))
        .add("cpu_ops", static_cast<int>(placement.cpu.size()))
        .add_raw("rejected", json_array(rejected))
        .add_raw("per_op", per_op.str());
}

}  // namespace ld
