// MNN graph edges: see mnn_edges.h. The rule is the pymnn engine's, step for step, so the C++
// harness and the `local` device record the same edges for the same model.
#include "mnn_edges.h"

#include <algorithm>
#include <utility>

#if LAYERDIFF_MNN_EXPRESS
#include <MNN/expr/Expr.hpp>
#endif

namespace ld {
namespace {

// A graph tensor as the dump names it: a fused activation `conv/relu` is dumped as op `conv`.
// Empty when no prefix of it is a dumped name (no dumped name is empty).
std::string dumped_name(const std::string& tensor, const std::set<std::string>& known) {
    std::string name = tensor;
    while (!name.empty()) {
        if (known.count(name)) return name;
        size_t slash = name.rfind('/');
        name = slash == std::string::npos ? "" : name.substr(0, slash);
    }
    return "";
}

#if LAYERDIFF_MNN_EXPRESS
// Weights, scales and axes: never dumped, so never an edge (pymnn's op_type "Const").
bool is_constant(const MNN::Express::VARP& var) {
    MNN::Express::EXPRP expr = var->expr().first;
    return expr && expr->get() == nullptr && expr->inputType() == MNN::Express::VARP::CONSTANT;
}
#endif

}  // namespace

MnnGraphEdges MnnGraphEdges::load(const std::string& model) {
    EdgeMap edges;
#if LAYERDIFF_MNN_EXPRESS
    std::map<std::string, MNN::Express::VARP> graph = MNN::Express::Variable::loadMap(model.c_str());
    for (const auto& entry : graph) {
        std::vector<std::string>& inputs = edges[entry.first];
        MNN::Express::EXPRP expr = entry.second.get() ? entry.second->expr().first : nullptr;
        if (!expr) continue;
        for (const MNN::Express::VARP& input : expr->inputs()) {
            if (input.get() == nullptr || !graph.count(input->name()) || is_constant(input)) continue;
            inputs.push_back(input->name());
        }
    }
#else
    (void)model;
#endif
    return MnnGraphEdges(std::move(edges));
}

std::vector<std::string> MnnGraphEdges::op_inputs(const std::string& op, const std::set<std::string>& known,
                                                  const std::vector<std::string>& by_address) const {
    const std::string* tensor = graph_tensor(op);
    if (tensor == nullptr) return by_address;  // a runtime-only op (Raster): addresses are all there is
    std::vector<std::string> mapped;
    for (const std::string& input : edges_.at(*tensor)) resolve(input, known, 0, &mapped);
    bool unresolved = std::find(mapped.begin(), mapped.end(), std::string()) != mapped.end();
    if (mapped.empty() || unresolved) return by_address;
    std::set<std::string> graph_inputs(mapped.begin(), mapped.end());
    bool misleading = false;
    for (const std::string& name : by_address) {
        bool no_producer = !name.empty() && name[0] == '<';
        bool unread_model_op = !graph_inputs.count(name) && graph_tensor(name) != nullptr;
        misleading = misleading || no_producer || unread_model_op;
    }
    if (!misleading) return by_address;
    std::vector<std::string> unique;  // graph order, each input once
    for (const std::string& name : mapped) {
        if (std::find(unique.begin(), unique.end(), name) == unique.end()) unique.push_back(name);
    }
    return unique;
}

// The graph tensor an op writes: its name, or the first `<op>/<fused activation>`; null for
// runtime-only ops. The map's order is the one pymnn's dict has (both come from a std::map).
const std::string* MnnGraphEdges::graph_tensor(const std::string& op) const {
    auto exact = edges_.find(op);
    if (exact != edges_.end()) return &exact->first;
    std::string prefix = op + "/";
    auto first = edges_.lower_bound(prefix);  // names under `op/` sort together, from here on
    if (first != edges_.end() && first->first.compare(0, prefix.size(), prefix) == 0) return &first->first;
    return nullptr;
}

// Dumped names behind a graph tensor, looking through tensors MNN never dumps (layout converts
// such as `x___tr4y`); an empty name marks a tensor that leads to no dumped op.
void MnnGraphEdges::resolve(const std::string& tensor, const std::set<std::string>& known, int depth,
                            std::vector<std::string>* out) const {
    std::string name = dumped_name(tensor, known);
    if (!name.empty()) {
        out->push_back(name);
        return;
    }
    auto found = edges_.find(tensor);
    if (depth >= 4 || found == edges_.end() || found->second.empty()) {
        out->push_back("");
        return;
    }
    for (const std::string& input : found->second) resolve(input, known, depth + 1, out);
}

}  // namespace ld
