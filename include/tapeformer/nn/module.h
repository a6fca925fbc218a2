// What every module shares: a way to list its parameters under the names users see in checkpoints
// (PyTorch's state-dict names), and the switch between training and evaluation behaviour (dropout).
#pragma once
#include <string>
#include <vector>

#include "tapeformer/random.h"
#include "tapeformer/tensor.h"

TF_NAMESPACE_BEGIN

struct NamedTensor {
    std::string name;   // "encoder.layers.0.self_attn.in_proj_weight"
    Tensor tensor;
};
using ParamList = std::vector<NamedTensor>;

// `params` with every storage once: a tied parameter, listed under several names, keeps its first name
// (what the optimizer updates, what gradient clipping and parameter counts see). Undefined tensors are
// left out.
ParamList unique_parameters(const ParamList& params);

// How one forward pass runs. Passed down through every module's forward().
struct Pass {
    Rng* dropout_rng = nullptr;   // training: dropout masks come from here; nullptr: evaluation, no dropout
    bool keep_attention = false;  // attention modules keep their weights (B, H, Tq, Tk) for inspection
    // Attention as one op over heads read in place (ops.h attention_heads: the same numbers, faster) instead
    // of the composed ops a reader of the tape sees; where it applies (dot-product scores, no cache, no
    // kept weights, every head's gate 1 and not trained). Training and bench train turn it on.
    bool fuse_attention = false;
    bool training() const { return dropout_rng != nullptr; }
};

// Dropout with probability p when the pass is training, the identity otherwise; and the fused forms
// (ops.h) of dropout(relu(x)) and layer_norm(x + dropout(residual)), which fall back to relu and
// add_layer_norm the same way.
Tensor dropout(const Tensor& x, real p, const Pass& pass);
Tensor relu_dropout(const Tensor& x, real p, const Pass& pass);
Tensor add_dropout_layer_norm(const Tensor& x, const Tensor& residual, real p, const Pass& pass, const Tensor& gamma,
                              const Tensor& beta, real eps);

// A fresh parameter: zero-filled leaf tensor that requires grad. Modules initialise it afterwards.
Tensor make_param(const Shape& shape);

TF_NAMESPACE_END
