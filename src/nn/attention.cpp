// Multi-head attention, composed from the primitive ops: no backward code here.
#include "tapeformer/nn/attention.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

namespace {
const real kNegInf = -std::numeric_limits<real>::infinity();

bool is_all_ones(const Tensor& t) {
    const real* p = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i)
        if (p[i] != real(1)) return false;
    return true;
}
}  // namespace

Tensor key_padding_mask(const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T, std::int32_t pad) {
    Tensor m = Tensor::zeros({B, 1, 1, T});
    real* p = m.data();
    for (std::int64_t i = 0; i < B * T; ++i)
        if (ids[i] == pad) p[i] = kNegInf;
    return m;
}

Tensor causal_mask(std::int64_t T) {
    Tensor m = Tensor::zeros({1, 1, T, T});
    real* p = m.data();
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t s = t + 1; s < T; ++s) p[t * T + s] = kNegInf;
    return m;
}

Tensor causal_padding_mask(const std::vector<std::int32_t>& ids, std::int64_t B, std::int64_t T, std::int32_t pad) {
    NoGradGuard constant;
    return add(causal_mask(T), key_padding_mask(ids, B, T, pad));  // (1,1,T,T) + (B,1,1,T) -> (B,1,T,T)
}

Tensor split_heads(const Tensor& x, std::int64_t H) {
    return slice_heads(x, 0, x.size(2), H);  // (B, T, C) -> (B, T, H, D) -> (B, H, T, D)
}

Tensor merge_heads(const Tensor& x) {
    const std::int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
    return permute(x, {0, 2, 1, 3}).reshape({B, T, H * D});  // (B, H, T, D) -> (B, T, H, D) -> (B, T, C)
}

MultiHeadAttention::MultiHeadAttention(std::int64_t C_, std::int64_t H_, real dropout)
    : C(C_), H(H_), D(C_ / H_), in_proj_weight(make_param({3 * C_, C_})), in_proj_bias(make_param({3 * C_})),
      out_proj(C_, C_, true), dropout_p(dropout), gate(Tensor::full({1, H_, 1, 1}, 1)) {
    if (H <= 0 || C % H != 0)
        throw std::invalid_argument("attention: d_model " + std::to_string(C) + " is not divisible by heads " +
                                    std::to_string(H));
}

Tensor MultiHeadAttention::project_q(const Tensor& x) const {
    return split_heads(linear(x, in_proj_weight.rows(0, C), in_proj_bias.rows(0, C)), H);  // (B, H, Tq, D)
}

std::pair<Tensor, Tensor> MultiHeadAttention::project_kv(const Tensor& x) const {
    Tensor kv = linear(x, in_proj_weight.rows(C, 3 * C), in_proj_bias.rows(C, 3 * C));  // (B, Tk, 2C)
    return {slice_heads(kv, 0, C, H), slice_heads(kv, C, 2 * C, H)};  // K, V: (B, H, Tk, D) each
}

Tensor MultiHeadAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                  const Pass& pass) {
    // scores = Q Kᵀ / √D + mask: (B, H, Tq, D) @ (B, H, Tk, D)ᵀ -> (B, H, Tq, Tk), the 1/√D inside the product
    Tensor scores = matmul(q, k, false, true, real(1) / std::sqrt(real(D)));
    Tensor weights = softmax(scores, mask);  // (B, H, Tq, Tk), each row sums to 1 over the keys
    if (pass.keep_attention) last_weights = weights;
    Tensor context = matmul(dropout(weights, dropout_p, pass), v);  // (B, H, Tq, D)
    if (gate.requires_grad() || !is_all_ones(gate)) context = mul(context, gate);  // ξ_h · head_h
    return out_proj.forward(merge_heads(context));  // (B, Tq, C) @ W_oᵀ
}

Tensor MultiHeadAttention::forward(const Tensor& query, const Tensor& key_value, const Tensor& mask, const Pass& pass) {
    if (query.rank() != 3 || query.size(2) != C || key_value.rank() != 3 || key_value.size(2) != C ||
        key_value.size(0) != query.size(0))
        throw std::invalid_argument("attention: query " + query.shape().str() + " and key/value " +
                                    key_value.shape().str() + " must be (B, T, " + std::to_string(C) + ")");
    if (query.same_storage(key_value) && query.shape() == key_value.shape()) {
        // Self-attention: Q, K, V from one (B, T, C) @ (3C, C)ᵀ product.
        Tensor qkv = linear(query, in_proj_weight, in_proj_bias);  // (B, T, 3C)
        return attend(slice_heads(qkv, 0, C, H), slice_heads(qkv, C, 2 * C, H), slice_heads(qkv, 2 * C, 3 * C, H), mask,
                      pass);  // Q, K, V: (B, H, T, D) each
    }
    auto [k, v] = project_kv(key_value);
    return attend(project_q(query), k, v, mask, pass);
}

void MultiHeadAttention::parameters(ParamList& out, const std::string& prefix) const {
    out.push_back({prefix + "in_proj_weight", in_proj_weight});
    out.push_back({prefix + "in_proj_bias", in_proj_bias});
    out_proj.parameters(out, prefix + "out_proj.");
}

void MultiHeadAttention::init(Rng& rng) {
    init_xavier_uniform(in_proj_weight, rng);
    init_constant(in_proj_bias, 0);
    init_xavier_uniform(out_proj.weight, rng);
    init_constant(out_proj.bias, 0);
}

// ---- the per-head form ------------------------------------------------------------------------------------

PerHeadAttention::PerHeadAttention(std::int64_t C_, std::int64_t H_)
    : C(C_), H(H_), D(C_ / H_), out_proj(C_, C_, true), gate(Tensor::full({H_}, 1)) {
    if (H <= 0 || C % H != 0)
        throw std::invalid_argument("attention: d_model " + std::to_string(C) + " is not divisible by heads " +
                                    std::to_string(H));
    for (std::int64_t h = 0; h < H; ++h) {
        wq.emplace_back(C, D, true);
        wk.emplace_back(C, D, true);
        wv.emplace_back(C, D, true);
    }
}

void PerHeadAttention::load_from(const MultiHeadAttention& fused) {
    auto copy = [](const Tensor& from, Tensor& to) { std::copy(from.data(), from.data() + to.numel(), to.data()); };
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t q0 = h * D, k0 = C + h * D, v0 = 2 * C + h * D;
        copy(fused.in_proj_weight.rows(q0, q0 + D), wq[h].weight);
        copy(fused.in_proj_bias.rows(q0, q0 + D), wq[h].bias);
        copy(fused.in_proj_weight.rows(k0, k0 + D), wk[h].weight);
        copy(fused.in_proj_bias.rows(k0, k0 + D), wk[h].bias);
        copy(fused.in_proj_weight.rows(v0, v0 + D), wv[h].weight);
        copy(fused.in_proj_bias.rows(v0, v0 + D), wv[h].bias);
    }
    copy(fused.out_proj.weight, out_proj.weight);
    copy(fused.out_proj.bias, out_proj.bias);
    copy(fused.gate, gate);
}

Tensor PerHeadAttention::forward(const Tensor& query, const Tensor& key_value, const Tensor& mask) const {
    const std::int64_t B = query.size(0), Tq = query.size(1), Tk = key_value.size(1);
    std::vector<Tensor> heads;
    for (std::int64_t h = 0; h < H; ++h) {
        Tensor q = wq[h].forward(query).reshape({B, 1, Tq, D});      // (B, 1, Tq, D)
        Tensor k = wk[h].forward(key_value).reshape({B, 1, Tk, D});  // (B, 1, Tk, D)
        Tensor v = wv[h].forward(key_value).reshape({B, 1, Tk, D});  // (B, 1, Tk, D)
        Tensor weights = softmax(scale(matmul(q, k, false, true), real(1) / std::sqrt(real(D))), mask);  // (B, 1, Tq, Tk)
        Tensor head = matmul(weights, v).reshape({B, Tq, D});        // (B, Tq, D)
        heads.push_back(gate.data()[h] == real(1) ? head : scale(head, gate.data()[h]));
    }
    return out_proj.forward(concat_last(heads));  // (B, Tq, H·D) @ W_oᵀ
}

void PerHeadAttention::parameters(ParamList& out, const std::string& prefix) const {
    for (std::int64_t h = 0; h < H; ++h) {
        wq[h].parameters(out, prefix + "heads." + std::to_string(h) + ".q_proj.");
        wk[h].parameters(out, prefix + "heads." + std::to_string(h) + ".k_proj.");
        wv[h].parameters(out, prefix + "heads." + std::to_string(h) + ".v_proj.");
    }
    out_proj.parameters(out, prefix + "out_proj.");
}

TF_NAMESPACE_END
