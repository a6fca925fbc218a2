// Position-wise feed-forward network ("Attention Is All You Need", section 3.3), applied to each
// position separately:  FFN(x) = W₂ · dropout(act(W₁ x + b₁)) + b₂,  act = ReLU (paper) or GELU.
#pragma once
#include <string>

#include "tapeformer/nn/linear.h"

TF_NAMESPACE_BEGIN

enum class Activation { ReLU, GELU };

struct FeedForward {
    static constexpr const char* kType = "FeedForward";
    Linear linear1;  // (F, C)
    Linear linear2;  // (C, F)
    Activation activation = Activation::ReLU;
    real dropout_p = 0;  // between the two layers, as PyTorch's Transformer layers do

    FeedForward() = default;
    FeedForward(std::int64_t C, std::int64_t F, Activation activation, real dropout);
    // (B, T, C) -> (B, T, F) -> (B, T, C); probes "ffn_hidden" (what linear2 reads: after the activation and,
    // in training, its dropout) and "ffn_out".
    Tensor forward(const Tensor& x, const Pass& pass) const;
    void visit(ModuleWalk& walk) const;  // linear1, linear2
    void init(Rng& rng);
};

TF_NAMESPACE_END
