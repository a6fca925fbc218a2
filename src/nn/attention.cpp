// Multi-head attention, composed from the primitive ops: no backward code here. The same forward serves
// training and decoding; for decoding it reads and extends a key/value cache (KVCache, at the end). With
// Pass::fuse_attention (training's and bench train's passes) the part between the projections runs as one
// op, ops.h's attention_heads, which computes exactly what attend() composes, without copying the heads.
#include "tapeformer/nn/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// With a single position (decoding), (B, 1, H, D) and (B, H, 1, D) are the same memory: splitting and
// merging the heads are then views, not copies.
Tensor split_heads(const Tensor& x, std::int64_t H) {
    const std::int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    if (T == 1) return x.reshape({B, H, 1, C / H});  // (B, 1, C) -> (B, H, 1, D)
    return slice_heads(x, 0, C, H);  // (B, T, C) -> (B, T, H, D) -> (B, H, T, D)
}

Tensor merge_heads(const Tensor& x) {
    const std::int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
    if (T == 1) return x.reshape({B, 1, H * D});  // (B, H, 1, D) -> (B, 1, C)
    return permute(x, {0, 2, 1, 3}).reshape({B, T, H * D});  // (B, H, T, D) -> (B, T, H, D) -> (B, T, C)
}

const char* to_string(AttentionScore s) { return s == AttentionScore::Dot ? "dot" : "additive"; }

AttentionScore parse_attention_score(const std::string& s) {
    if (s == "dot") return AttentionScore::Dot;
    if (s == "additive") return AttentionScore::Additive;
    throw std::invalid_argument("attention scoring '" + s + "' is not one of: dot, additive");
}

MultiHeadAttention::MultiHeadAttention(std::int64_t C_, std::int64_t H_, real dropout, AttentionScore score_, bool scaled_)
    : C(C_), H(H_), D(C_ / H_), score(score_), scaled(scaled_), in_proj_weight(make_param({3 * C_, C_})), in_proj_bias(make_param({3 * C_})),
      out_proj(C_, C_, true), dropout_p(dropout), gate(Tensor::full({1, H_, 1, 1}, 1)) {
    if (H <= 0 || C % H != 0)
        throw std::invalid_argument("attention: d_model " + std::to_string(C) + " is not divisible by heads " +
                                    std::to_string(H));
    if (score == AttentionScore::Additive) score_v = make_param({H, D});
    if (!scaled && score != AttentionScore::Dot)
        throw std::invalid_argument(std::string("attention: only dot-product scores are scaled by 1/sqrt(D), not ") + to_string(score));
}

Tensor MultiHeadAttention::project_q(const Tensor& x, const Pass& pass) const {
    Tensor q = linear(x, in_proj_weight.rows(0, C), in_proj_bias.rows(0, C));  // (B, Tq, C)
    pass.probe(this, "q_proj", q);
    return split_heads(q, H);  // (B, H, Tq, D)
}

std::pair<Tensor, Tensor> MultiHeadAttention::project_kv(const Tensor& x, const Pass& pass) const {
    Tensor kv = linear(x, in_proj_weight.rows(C, 3 * C), in_proj_bias.rows(C, 3 * C));  // (B, Tk, 2C)
    pass.probe(this, "kv_proj", kv);
    return {slice_heads(kv, 0, C, H), slice_heads(kv, C, 2 * C, H)};  // K, V: (B, H, Tk, D) each
}

Tensor MultiHeadAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                  const Pass& pass) const {
    pass.probe(this, "q", q);
    pass.probe(this, "k", k);
    pass.probe(this, "v", v);
    // scores = Q Kᵀ / √D: (B, H, Tq, D) @ (B, H, Tk, D)ᵀ -> (B, H, Tq, Tk), the 1/√D inside the product
    // (unscaled: Q Kᵀ, whose entries grow like √D, so softmax saturates);
    // or additive: s_ij = v · tanh(q_i + k_j), (B, H, Tq, D), (B, H, Tk, D), (H, D) -> (B, H, Tq, Tk)
    const real s = scaled ? real(1) / std::sqrt(real(D)) : real(1);
    Tensor scores = score == AttentionScore::Dot ? matmul(q, k, false, true, s) : additive_scores(q, k, score_v);
    pass.probe(this, "scores", scores);
    if (mask.defined()) pass.probe(this, "mask", mask);  // added inside softmax
    Tensor weights = softmax(scores, mask);  // (B, H, Tq, Tk), each row sums to 1 over the keys
    pass.probe(this, "weights", weights);
    Tensor context = matmul(dropout(weights, dropout_p, pass), v);  // (B, H, Tq, D)
    pass.probe(this, "context", context);
    if (gate.requires_grad() || !is_all_ones(gate)) {
        context = mul(context, gate);  // ξ_h · head_h
        pass.probe(this, "gate", context);
    }
    Tensor merged = merge_heads(context);  // (B, H, Tq, D) -> (B, Tq, C)
    pass.probe(this, "merge", merged);
    Tensor out = out_proj.forward(merged);  // (B, Tq, C) @ W_oᵀ + b_o
    pass.probe(this, "out_proj", out);
    return out;
}

Tensor MultiHeadAttention::forward(const Tensor& query, const Tensor& key_value, const Tensor& mask, const Pass& pass,
                                   KVCache* cache) {
    const bool self = query.same_storage(key_value) && query.shape() == key_value.shape();
    const bool memory_cached = cache && !self && !cache->empty();  // key_value is not read
    if (query.rank() != 3 || query.size(2) != C ||
        (!memory_cached && (key_value.rank() != 3 || key_value.size(2) != C || key_value.size(0) != query.size(0))))
        throw std::invalid_argument("attention: query " + query.shape().str() + " and key/value " +
                                    key_value.shape().str() + " must be (B, T, " + std::to_string(C) + ")");
    if (cache && tape().recording())
        throw std::logic_error("attention: a key/value cache is for inference only (run it under NoGradGuard)");
    // (attention_heads computes the paper's scaled scores only)
    const bool fused = pass.fuse_attention && score == AttentionScore::Dot && scaled && !cache && !pass.observer &&
                       !gate.requires_grad() && is_all_ones(gate);
    if (fused) {  // the same numbers as attend() below, in one op (ops.h attention_heads)
        Rng unused;
        Rng& rng = pass.training() ? *pass.dropout_rng : unused;
        if (self) {
            Tensor qkv = linear(query, in_proj_weight, in_proj_bias);  // (B, T, 3C)
            return out_proj.forward(attention_heads(qkv, 0, qkv, C, 2 * C, H, D, mask, dropout_p, rng, pass.training()));
        }
        Tensor q = linear(query, in_proj_weight.rows(0, C), in_proj_bias.rows(0, C));              // (B, Tq, C)
        Tensor kv = linear(key_value, in_proj_weight.rows(C, 3 * C), in_proj_bias.rows(C, 3 * C));  // (B, Tk, 2C)
        return out_proj.forward(attention_heads(q, 0, kv, 0, C, H, D, mask, dropout_p, rng, pass.training()));
    }
    if (self) {
        // Self-attention: Q, K, V from one (B, T, C) @ (3C, C)ᵀ product.
        Tensor qkv = linear(query, in_proj_weight, in_proj_bias);  // (B, T, 3C)
        pass.probe(this, "qkv", qkv);
        Tensor q = slice_heads(qkv, 0, C, H);                        // (B, H, T, D)
        if (!cache) return attend(q, slice_heads(qkv, C, 2 * C, H), slice_heads(qkv, 2 * C, 3 * C, H), mask, pass);
        // Decoding: the new positions' K, V join the cached ones, and each query sees the keys up to its own.
        if (mask.defined())
            throw std::invalid_argument("attention: self-attention with a cache masks by position itself; got a mask " +
                                        mask.shape().str());
        cache->append(qkv, C, 2 * C, H, D);
        return attend(q, cache->k, cache->v, cache->causal_mask(query.size(1)), pass);  // over (B, H, capacity, D)
    }
    Tensor q = project_q(query, pass);  // (B, H, Tq, D)
    if (cache && cache->empty()) {  // cross-attention, first call: the memory's K, V, kept for the later calls
        auto [k, v] = project_kv(key_value, pass);  // (B, H, Tk, D) each
        cache->assign(k, v);
    }
    if (cache) return attend(q, cache->k, cache->v, mask, pass);
    auto [k, v] = project_kv(key_value, pass);  // (B, H, Tk, D) each
    return attend(q, k, v, mask, pass);
}

// ---- the key/value cache ----------------------------------------------------------------------------------

namespace {
constexpr std::int64_t kMinCapacity = 16;  // positions a self-attention cache starts with

// (N, H, capacity, D) zeros with positions [0, length) copied from t (N, H, old capacity, D).
Tensor with_capacity(const Tensor& t, std::int64_t N, std::int64_t H, std::int64_t D, std::int64_t length,
                     std::int64_t capacity) {
    Tensor out = Tensor::zeros({N, H, capacity, D});  // zeros: masked keys must still be finite (0 · NaN = NaN)
    for (std::int64_t nh = 0; nh < N * H && length > 0; ++nh)
        std::memcpy(out.data() + nh * capacity * D, t.data() + nh * t.size(2) * D, sizeof(real) * length * D);
    return out;
}
}  // namespace

Tensor gather_rows(const Tensor& x, const std::vector<std::int64_t>& from) {
    const std::int64_t N = x.size(0), M = static_cast<std::int64_t>(from.size());
    std::vector<std::int32_t> ids(from.size());
    for (std::int64_t i = 0; i < M; ++i) {
        if (from[i] < 0 || from[i] >= N)
            throw std::invalid_argument("gather_rows: row " + std::to_string(from[i]) + " is outside [0, " +
                                        std::to_string(N) + ")");
        ids[i] = static_cast<std::int32_t>(from[i]);
    }
    Shape shape = x.shape();
    shape[0] = M;
    return embedding(x.reshape({N, x.numel() / N}), ids, {M}).reshape(shape);  // (M, ...)
}

void KVCache::append(const Tensor& x, std::int64_t k_col, std::int64_t v_col, std::int64_t H, std::int64_t D) {
    const std::int64_t N = x.size(0), Tq = x.size(1), W = x.size(2);
    if (k.defined() && rows() != N)
        throw std::invalid_argument("KVCache: " + std::to_string(N) + " new rows for a cache of " +
                                    std::to_string(rows()) + " (select_rows first)");
    if (length + Tq > capacity()) {  // full: double the capacity, as std::vector does
        const std::int64_t grown = std::max({2 * capacity(), length + Tq, kMinCapacity});
        k = with_capacity(k, N, H, D, length, grown);
        v = with_capacity(v, N, H, D, length, grown);
    }
    // K[n, h, length + t, :] = x[n, t, k_col + h·D : k_col + (h+1)·D], and V alike from v_col
    const std::int64_t cap = capacity();
    const real* px = x.data();
    for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t t = 0; t < Tq; ++t) {
                const std::int64_t at = ((n * H + h) * cap + length + t) * D, from = (n * Tq + t) * W + h * D;
                std::memcpy(k.data() + at, px + from + k_col, sizeof(real) * D);
                std::memcpy(v.data() + at, px + from + v_col, sizeof(real) * D);
            }
    length += Tq;
}

void KVCache::assign(const Tensor& k_all, const Tensor& v_all) {
    k = k_all;  // (N, H, Tk, D)
    v = v_all;  // (N, H, Tk, D)
    length = k_all.size(2);
}

Tensor KVCache::causal_mask(std::int64_t Tq) const {
    const std::int64_t cap = capacity(), first = length - Tq;  // the position of the first of the Tq queries
    Tensor m = Tensor::full({1, 1, Tq, cap}, kNegInf);       // (1, 1, Tq, capacity)
    for (std::int64_t i = 0; i < Tq; ++i) std::fill(m.data() + i * cap, m.data() + i * cap + first + i + 1, real(0));
    return m;
}

void KVCache::select_rows(const std::vector<std::int64_t>& from) {
    if (!k.defined()) return;  // nothing cached yet
    bool identity = static_cast<std::int64_t>(from.size()) == rows();
    for (std::size_t i = 0; identity && i < from.size(); ++i) identity = from[i] == static_cast<std::int64_t>(i);
    if (identity) return;
    k = gather_rows(k, from);  // (M, H, capacity, D)
    v = gather_rows(v, from);  // (M, H, capacity, D)
}

void MultiHeadAttention::visit(ModuleWalk& walk) const {
    walk.parameter("in_proj_weight", in_proj_weight);
    walk.parameter("in_proj_bias", in_proj_bias);
    walk.child("out_proj", out_proj);
    walk.parameter("score_v", score_v);  // additive scoring only (undefined otherwise: left out)
}

void MultiHeadAttention::init(Rng& rng) {
    init_xavier_uniform(in_proj_weight, rng);
    init_constant(in_proj_bias, 0);
    init_xavier_uniform(out_proj.weight, rng);
    init_constant(out_proj.bias, 0);
    if (score == AttentionScore::Additive) init_normal(score_v, rng, 1 / std::sqrt(double(D)));  // s_ij starts O(1)
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

void PerHeadAttention::visit(ModuleWalk& walk) const {
    for (std::int64_t h = 0; h < H; ++h) {
        walk.child("heads." + std::to_string(h) + ".q_proj", wq[h]);
        walk.child("heads." + std::to_string(h) + ".k_proj", wk[h]);
        walk.child("heads." + std::to_string(h) + ".v_proj", wv[h]);
    }
    walk.child("out_proj", out_proj);
}

TF_NAMESPACE_END
