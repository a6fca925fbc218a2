// Linear layer: y = x Wᵀ + b, with W stored (out, in) as in PyTorch, so checkpoints map one to one.
#pragma once
#include <string>

#include "tapeformer/nn/module.h"
#include "tapeformer/random.h"

TF_NAMESPACE_BEGIN

struct Linear {
    static constexpr const char* kType = "Linear";
    Tensor weight;  // (out, in)
    Tensor bias;    // (out), undefined when the layer has none

    Linear() = default;
    Linear(std::int64_t in, std::int64_t out, bool with_bias);
    // x: (..., in) -> (..., out)
    Tensor forward(const Tensor& x) const;
    void visit(ModuleWalk& walk) const;  // weight, bias
    // Xavier-uniform weight, bias uniform in ±1/√in (PyTorch's Linear default for the bias).
    void init(Rng& rng);
};

// y = x Wᵀ + b for any weight and bias (views of a fused projection, too).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// Initialisers; each draws from rng in element order, so a seed gives the same model on any machine. A
// shape-only tensor (ShapeOnly, tensor.h) is left as it is.
void init_xavier_uniform(Tensor& t, Rng& rng);              // U(±√(6 / (fan_in + fan_out)))
void init_uniform(Tensor& t, Rng& rng, double bound);       // U(±bound)
void init_normal(Tensor& t, Rng& rng, double std);          // N(0, std²)
void init_constant(Tensor& t, real value);

TF_NAMESPACE_END
