// Position-wise feed-forward network.
#include "tapeformer/nn/feed_forward.h"

#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

FeedForward::FeedForward(std::int64_t C, std::int64_t F, Activation act, real dropout)
    : linear1(C, F, true), linear2(F, C, true), activation(act), dropout_p(dropout) {}

Tensor FeedForward::forward(const Tensor& x, const Pass& pass) const {
    // (B, T, F). With ReLU, linear1, the activation and its dropout are one op (affine_relu_dropout in ops.h),
    // which keeps no pre-activation for backward.
    const Tensor h = activation == Activation::ReLU
                         ? affine_relu_dropout(x, linear1.weight, linear1.bias, dropout_p, pass)
                         : dropout(gelu(linear1.forward(x)), dropout_p, pass);
    pass.probe(this, "ffn_hidden", h);  // (B, T, F), what linear2 reads
    Tensor out = linear2.forward(h);  // (B, T, C)
    pass.probe(this, "ffn_out", out);
    return out;
}

void FeedForward::visit(ModuleWalk& walk) const {
    walk.child("linear1", linear1);
    walk.child("linear2", linear2);
}

void FeedForward::init(Rng& rng) {
    linear1.init(rng);
    linear2.init(rng);
}

TF_NAMESPACE_END
