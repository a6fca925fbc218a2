// Layer normalisation over the model width C (Ba, Kiros & Hinton 2016):
//   y = (x − mean(x)) / sqrt(var(x) + eps) · γ + β,   var biased, eps inside the square root.
#pragma once
#include <string>

#include "tapeformer/nn/module.h"

TF_NAMESPACE_BEGIN

struct LayerNorm {
    static constexpr const char* kType = "LayerNorm";
    Tensor weight;  // γ (C), initialised to 1
    Tensor bias;    // β (C), initialised to 0
    real eps = real(1e-5);

    LayerNorm() = default;
    explicit LayerNorm(std::int64_t C);
    Tensor forward(const Tensor& x) const;  // (..., C) -> (..., C)
    void visit(ModuleWalk& walk) const;  // weight, bias
};

TF_NAMESPACE_END
