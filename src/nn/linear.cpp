// Linear layer and the weight initialisers.
#include "tapeformer/nn/linear.h"

#include <cmath>

#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

Linear::Linear(std::int64_t in, std::int64_t out, bool with_bias) : weight(make_param({out, in})) {
    if (with_bias) bias = make_param({out});
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    return affine(x, weight, bias);  // (..., in) @ (out, in)ᵀ + (out) -> (..., out), one fused op
}

Tensor Linear::forward(const Tensor& x) const { return linear(x, weight, bias); }

void Linear::visit(ModuleWalk& walk) const {
    walk.parameter("weight", weight);
    walk.parameter("bias", bias);  // left out when there is none
}

void Linear::init(Rng& rng) {
    init_xavier_uniform(weight, rng);
    if (bias.defined()) init_uniform(bias, rng, 1.0 / std::sqrt(double(weight.size(1))));
}

void init_xavier_uniform(Tensor& t, Rng& rng) {
    // For a (fan_out, fan_in) matrix; PyTorch's xavier_uniform_ with gain 1.
    const double fan_out = double(t.size(0)), fan_in = double(t.numel() / t.size(0));
    init_uniform(t, rng, std::sqrt(6.0 / (fan_in + fan_out)));
}

void init_uniform(Tensor& t, Rng& rng, double bound) {
    if (t.shape_only()) return;  // nothing to fill (ShapeOnly, tensor.h); the draws are not needed either
    real* p = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = real((2 * rng.uniform() - 1) * bound);
}

void init_normal(Tensor& t, Rng& rng, double std) {
    if (t.shape_only()) return;
    real* p = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = real(rng.normal() * std);
}

void init_constant(Tensor& t, real value) {
    if (t.shape_only()) return;
    real* p = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = value;
}

TF_NAMESPACE_END
