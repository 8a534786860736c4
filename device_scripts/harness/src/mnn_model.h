// What a `.mnn` file says about its ops: each op's name, the tensors it writes, and the model's
// outputs. The C++ twin of collector/engines/mnn/model.py: both engines key an op's outputs by
// the tensor the op writes (HARNESS_CLI.md, "Tensor keys and edges"), so a Conv+BN+ReLU that
// MNN's converter fused into op `conv2d_450.tmp_0` is dumped as the `batch_norm_67.tmp_2` it
// writes, the name an ONNX golden has.
//
// Why a reader of our own: MNN's public API names ops, never the tensors they write, and MNN
// installs neither its FlatBuffers headers nor its generated schema (include/MNN has only the
// API), so the few fields needed are read from the model buffer by their slot in MNN.fbs, the
// same slots the Python reader uses (tests/test_mnn_model_keys.py checks the two agree).
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ld {

struct MnnOps {
    std::map<std::string, std::vector<std::string>> writes;  // op name -> tensors it writes, in output order
    std::vector<std::string> outputs;                        // the model's output tensors

    // (dump op, tensor name) of output `index` of a model op into *key; false for runtime-only ops
    // (rasters) and indexes past the op's outputs. A tensor in the op's own name scope (`head/conv`
    // writing `head/conv/relu`: a fused activation) keeps the op's name, as ncnn's fused layers do.
    bool key(const std::string& op, size_t index, std::pair<std::string, std::string>* key) const;
};

// Parses op and tensor names from a .mnn model buffer; an unreadable buffer gives an empty table
// (every op then keeps its own name, as in older harnesses).
MnnOps read_mnn_ops(const void* data, size_t size);

// How each op output is keyed in one run's dump: by the tensor it writes, runtime-only ops by
// their own name (`<op>:<index>` for index > 0), a name already used with `#k` appended.
class MnnDumpKeys {
public:
    explicit MnnDumpKeys(const MnnOps& ops) : ops_(ops) {}
    // The name an op's output 0 has in the dump (what graph edges are looked up by).
    std::string graph_op(const std::string& op) const;
    // (dump op, tensor name) for output `index` of `op`, now used.
    std::pair<std::string, std::string> key(const std::string& op, size_t index);
    // Whether a name is used, and marks it used (model outputs dumped after the run).
    bool used(const std::string& name) const { return used_.count(name) > 0; }
    void use(const std::string& name) { used_.insert(name); }

private:
    const MnnOps& ops_;
    std::set<std::string> used_;
};

}  // namespace ld
