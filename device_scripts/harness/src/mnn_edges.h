// Graph edges for the MNN engine, mirroring the pymnn engine of the `local` device
// (collector/engines/mnn/engine.py: graph_edges, op_inputs, _graph_tensor, _resolve, _dumped_name).
//
// Why: edges recorded from buffer addresses see what really ran (including MNN's runtime-only
// Raster ops), but mislead where MNN computed in place, reused memory or fed a tensor it never
// reported (underflow.mnn: `dec/up` and `image` get `<op input 0>`). The model's own graph,
// read with MNN's Express API, corrects those ops. Without Express the graph is empty and the
// addresses are used as they are.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ld {

class MnnGraphEdges {
public:
    // Graph tensor -> its non-constant input tensors (graph names). Empty: addresses only.
    using EdgeMap = std::map<std::string, std::vector<std::string>>;

    MnnGraphEdges() = default;
    explicit MnnGraphEdges(EdgeMap edges) : edges_(std::move(edges)) {}

    // The model's edges via Express (Variable::loadMap); empty when this build has no Express
    // or MNN cannot read the graph, so a run never fails over edges alone.
    static MnnGraphEdges load(const std::string& model);

    // An op's inputs: `by_address` unless one names no producer (`<...>`) or names a model op the
    // graph says this op does not read; then the graph's inputs, as names the dump already holds
    // (`known`), looking through tensors MNN never dumps (layout conversions) up to depth 4.
    std::vector<std::string> op_inputs(const std::string& op, const std::set<std::string>& known,
                                       const std::vector<std::string>& by_address) const;

private:
    const std::string* graph_tensor(const std::string& op) const;
    void resolve(const std::string& tensor, const std::set<std::string>& known, int depth,
                 std::vector<std::string>* out) const;

    EdgeMap edges_;
};

}  // namespace ld
