// Multi-head attention ("Attention Is All You Need", section 3.2):
//   Attention(Q, K, V) = softmax(Q Kᵀ / √D + mask) V
//   head_h = Attention(x_q W_qʰ, x_kv W_kʰ, x_kv W_vʰ),   MultiHead = concat_h(ξ_h · head_h) W_o
// with H heads of width D = C / H. ξ_h is the head gate (1 by default): ∂L/∂ξ_h is the head importance of
// Michel et al. (2019), and ξ_h = 0 masks the head. One module serves the three uses: encoder
// self-attention (key padding mask), decoder self-attention (causal + key padding mask) and encoder–decoder
// cross-attention (queries from the decoder, keys and values from the encoder output).
#pragma once
#include <string>
#include <vector>

#include "tapeformer/nn/linear.h"
#include "tapeformer/nn/module.h"

TF_NAMESPACE_BEGIN

// Masks are additive: 0 keeps a key, −∞ drops it. They are constants (no gradient).
// ids (B, T) -> (B, 1, 1, T): −∞ where ids[b, t] == pad.
Tensor key_padding_mask(const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T, std::int32_t pad);
// (1, 1, T, T): −∞ above the diagonal, so position t sees keys 0..t.
Tensor causal_mask(std::int64_t T);
// The causal mask combined with a key padding mask: (B, 1, T, T).
Tensor causal_padding_mask(const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T, std::int32_t pad);

// (B, T, C) -> (B, H, T, D) and back.
Tensor split_heads(const Tensor& x, std::int64_t H);
Tensor merge_heads(const Tensor& x);

struct MultiHeadAttention {
    std::int64_t C = 0, H = 0, D = 0;
    Tensor in_proj_weight;  // (3C, C): rows [0, C) are W_q, [C, 2C) W_k, [2C, 3C) W_v — PyTorch's layout
    Tensor in_proj_bias;    // (3C)
    Linear out_proj;        // W_o (C, C) and its bias
    real dropout_p = 0;     // on the attention weights
    Tensor gate;            // ξ (1, H, 1, 1): not a parameter; set_requires_grad(true) to get ∂L/∂ξ
    Tensor last_weights;    // (B, H, Tq, Tk), kept when the pass asks for it

    MultiHeadAttention() = default;
    MultiHeadAttention(std::int64_t C, std::int64_t H, real dropout);

    // query (B, Tq, C), key_value (B, Tk, C) -> (B, Tq, C). mask broadcasts to (B, H, Tq, Tk).
    // When query and key_value are the same tensor, Q, K and V come from one fused (C -> 3C) product.
    Tensor forward(const Tensor& query, const Tensor& key_value, const Tensor& mask, const Pass& pass);

    // The pieces of forward, for decoding with a cache.
    Tensor project_q(const Tensor& x) const;                      // (B, T, C) -> (B, H, T, D)
    std::pair<Tensor, Tensor> project_kv(const Tensor& x) const;  // (B, T, C) -> K, V (B, H, T, D)
    // softmax(Q Kᵀ/√D + mask) V, gated, heads merged and projected: -> (B, Tq, C)
    Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Pass& pass);

    void parameters(ParamList& out, const std::string& prefix) const;
    void init(Rng& rng);  // Xavier-uniform in_proj (as one (3C, C) matrix) and out_proj, zero biases
};

// The same attention in its "theory" form: separate W_qʰ, W_kʰ, W_vʰ (D, C) for every head, each head
// computed on its own, then concatenated. Slower; here to show that it is the fused form above.
struct PerHeadAttention {
    std::int64_t C = 0, H = 0, D = 0;
    std::vector<Linear> wq, wk, wv;  // H of each, (D, C) with bias (D)
    Linear out_proj;
    Tensor gate;                      // (H) values, one per head

    PerHeadAttention() = default;
    PerHeadAttention(std::int64_t C, std::int64_t H);
    // Copies the slices of a fused module's weights: W_qʰ = in_proj_weight[hD : (h+1)D], and so on.
    void load_from(const MultiHeadAttention& fused);
    Tensor forward(const Tensor& query, const Tensor& key_value, const Tensor& mask) const;
    void parameters(ParamList& out, const std::string& prefix) const;
};

TF_NAMESPACE_END
