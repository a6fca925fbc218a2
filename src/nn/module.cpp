// What every module shares (module.h): the module walk, fresh parameters, the list of distinct parameters,
// dropout by pass.
#include "tapeformer/nn/module.h"

#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

void ModuleWalk::enter(const std::string& name, const char* type, const char* role, const void* module, bool flat,
                       int layer) {
    ModuleEntry e;
    e.type = type, e.role = role, e.module = module;
    std::string prefix;
    if (!open_.empty()) {
        const ModuleEntry& parent = modules[open_.back().entry];
        e.name = parent.name.empty() ? name : parent.name + "." + name;
        e.depth = parent.depth + 1;
        e.stack = parent.depth == 0 ? name.substr(0, name.find('.')) : parent.stack;
        e.layer = layer >= 0 ? layer : parent.layer;
        e.layer_name = layer >= 0 ? e.name : parent.layer_name;
        prefix = open_.back().param_prefix + (flat ? "" : name + ".");
    }
    modules.push_back(std::move(e));
    open_.push_back({modules.size() - 1, prefix});
}

void ModuleWalk::leave() { open_.pop_back(); }

void ModuleWalk::parameter(const std::string& name, const Tensor& t) {
    if (!t.defined()) return;
    parameters.push_back({open_.back().param_prefix + name, t});
    for (const Open& o : open_) modules[o.entry].parameters.push_back(parameters.size() - 1);
}

const ModuleEntry* ModuleWalk::find(const void* module, const char* type) const {
    for (const ModuleEntry& e : modules)
        if (e.module == module && e.type == type) return &e;
    return nullptr;
}

Tensor make_param(const Shape& shape) {
    Tensor t = Tensor::zeros(shape);
    t.set_requires_grad(true);
    return t;
}

ParamList unique_parameters(const ParamList& params) {
    ParamList out;
    for (const NamedTensor& p : params) {
        if (!p.tensor.defined()) continue;
        bool seen = false;
        for (const NamedTensor& kept : out) seen = seen || kept.tensor.same_storage(p.tensor);
        if (!seen) out.push_back(p);
    }
    return out;
}

Tensor dropout(const Tensor& x, real p, const Pass& pass) {
    if (!pass.training() || p == 0) return x;
    return dropout(x, p, *pass.dropout_rng, true);
}

Tensor affine_relu_dropout(const Tensor& x, const Tensor& weight, const Tensor& bias, real p, const Pass& pass) {
    if (!pass.training() || p == 0) return relu(affine(x, weight, bias));
    return affine_relu_dropout(x, weight, bias, p, *pass.dropout_rng, true);
}

Tensor add_dropout_layer_norm(const Tensor& x, const Tensor& residual, real p, const Pass& pass, const Tensor& gamma,
                              const Tensor& beta, real eps) {
    if (!pass.training() || p == 0) return add_layer_norm(x, residual, gamma, beta, eps);
    return add_dropout_layer_norm(x, residual, p, *pass.dropout_rng, gamma, beta, eps, true);
}

void let_go_of(const Pass& pass, Tensor value, const Tensor& next) {
    if (pass.may_drop_values() && !value.is_leaf() && !value.same_storage(next)) value.drop_values();
}

TF_NAMESPACE_END
