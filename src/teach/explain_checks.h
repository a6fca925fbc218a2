// The invariants explain() checks at its stages (explain.h StageCheck): what a reader may verify by hand
// about the numbers a stage shows. Each reads the stage's tensor; none recomputes the model.
#pragma once
#include <vector>

#include "tapeformer/teach/explain.h"

TF_NAMESPACE_BEGIN

// Rows of a softmax output p (…, N) sum to 1.
StageCheck rows_sum_to_one(const Tensor& p, const char* what);
// Attention weights w (B, H, Tq, Tk) are exactly 0 wherever the additive mask (B|1, 1, Tq|1, Tk) is −∞.
StageCheck masked_weights_zero(const Tensor& w, const Tensor& mask);
// A LayerNorm's output y = x̂ · γ + β (…, C): each row's x̂ = (y − β) / γ has mean 0 and variance
// 1 (var / (var + eps): a hair under 1).
StageCheck layer_norm_rows(const Tensor& y, const Tensor& gamma, const Tensor& beta);
// The split into heads copies: parts Q, K, V (B, H, T, D) are the fused projection qkv (B, T, 3C) at column
// offsets 0, C and 2C.
StageCheck split_check(const Tensor& qkv, const std::vector<Tensor>& parts);

TF_NAMESPACE_END
