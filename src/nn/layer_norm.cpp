// LayerNorm module: a thin wrapper over the fused layer_norm op (which holds the hand-derived backward).
#include "tapeformer/nn/layer_norm.h"

#include "tapeformer/nn/linear.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

LayerNorm::LayerNorm(std::int64_t C) : weight(make_param({C})), bias(make_param({C})) { init_constant(weight, 1); }

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }

void LayerNorm::visit(ModuleWalk& walk) const {
    walk.parameter("weight", weight);
    walk.parameter("bias", bias);
}

TF_NAMESPACE_END
