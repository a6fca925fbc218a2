// What every module shares (module.h): fresh parameters, the list of distinct parameters, dropout by pass.
#include "tapeformer/nn/module.h"

#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

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

Tensor relu_dropout(const Tensor& x, real p, const Pass& pass) {
    if (!pass.training() || p == 0) return relu(x);
    return relu_dropout(x, p, *pass.dropout_rng, true);
}

Tensor add_dropout_layer_norm(const Tensor& x, const Tensor& residual, real p, const Pass& pass, const Tensor& gamma,
                              const Tensor& beta, real eps) {
    if (!pass.training() || p == 0) return add_layer_norm(x, residual, gamma, beta, eps);
    return add_dropout_layer_norm(x, residual, p, *pass.dropout_rng, gamma, beta, eps, true);
}

TF_NAMESPACE_END
