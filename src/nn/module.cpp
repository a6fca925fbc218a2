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

TF_NAMESPACE_END
