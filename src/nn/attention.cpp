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

const char* to_string(AttentionScore s) {
    switch (s) {
        case AttentionScore::Dot: return "dot";
        case AttentionScore::Additive: return "additive";
        case AttentionScore::Linear: return "linear";
        case AttentionScore::Local: return "local";
    }
    return "?";
}

AttentionScore parse_attention_score(const std::string& s) {
    if (s == "dot") return AttentionScore::Dot;
    if (s == "additive") return AttentionScore::Additive;
    if (s == "linear") return AttentionScore::Linear;
    if (s == "local") return AttentionScore::Local;
    throw std::invalid_argument("attention scoring '" + s + "' is not one of: dot, additive, linear, local");
}

namespace {
// Local attention's band (1, 1, T, T): 0 where |i − j| < W, −∞ elsewhere, added to `mask` (a constant).
Tensor with_band(const Tensor& mask, std::int64_t T, std::int64_t W) {
    NoGradGuard constant;
    Tensor band = Tensor::full({1, 1, T, T}, kNegInf);
    for (std::int64_t i = 0; i < T; ++i)
        std::fill(band.data() + i * T + std::max<std::int64_t>(0, i - W + 1), band.data() + i * T + std::min(T, i + W), real(0));
    return mask.defined() ? add(mask, band) : band;  // (B, 1, T|1, T) + (1, 1, T, T) -> (B, 1, T, T)
}

// What linear attention reads from an additive mask: which keys exist, and whether query i sees only the
// keys j ≤ i. keep (B, 1, Tk, 1) is 1 for a key and 0 for a padded one (undefined: every key).
struct LinearMask {
    Tensor keep;
    bool causal = false;
};

LinearMask linear_mask(const Tensor& mask, std::int64_t Tq, std::int64_t Tk) {
    LinearMask out;
    if (!mask.defined()) return out;
    auto refuse = [&] {
        throw std::invalid_argument("attention: linear attention takes a key padding mask (B, 1, 1, " + std::to_string(Tk) +
                                    ") or a causal + padding mask (B, 1, T, T) as causal_padding_mask makes, got " +
                                    mask.shape().str() + (mask.rank() == 4 ? " of another pattern" : ""));
    };
    if (mask.rank() != 4 || mask.size(1) != 1 || mask.size(3) != Tk) refuse();
    const std::int64_t B = mask.size(0), R = mask.size(2);
    if (R != 1 && (R != Tq || Tq != Tk)) refuse();
    const real* m = mask.data();
    // Row R − 1 sees every key it can: a key padding mask's only row, or a causal mask's last query.
    out.keep = Tensor::empty({B, 1, Tk, 1});
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t j = 0; j < Tk; ++j) out.keep.data()[b * Tk + j] = m[(b * R + R - 1) * Tk + j] == kNegInf ? 0 : 1;
    out.causal = R > 1;
    // A causal mask must be exactly that: −∞ above the diagonal, the last row's padding on and below it.
    for (std::int64_t b = 0; out.causal && b < B; ++b)
        for (std::int64_t i = 0; i < R; ++i)
            for (std::int64_t j = 0; j < Tk; ++j) {
                const real x = m[(b * R + i) * Tk + j], last = m[(b * R + R - 1) * Tk + j];
                if (j > i ? x != kNegInf : x != last) refuse();
            }
    return out;
}
}  // namespace

MultiHeadAttention::MultiHeadAttention(std::int64_t C_, std::int64_t H_, real dropout, AttentionScore score_, bool scaled_,
                                       std::int64_t window_, std::int64_t D_)
    : C(C_), H(H_), D(D_ > 0 ? D_ : H_ > 0 ? C_ / H_ : 0), score(score_), scaled(scaled_), window(window_), dropout_p(dropout) {
    if (H <= 0 || (D_ <= 0 && C % H != 0))
        throw std::invalid_argument("attention: d_model " + std::to_string(C) + " is not divisible by heads " +
                                    std::to_string(H));
    in_proj_weight = make_param({3 * H * D, C});
    in_proj_bias = make_param({3 * H * D});
    out_proj = Linear(H * D, C, true);
    gate = Tensor::full({1, H, 1, 1}, 1);
    if (score == AttentionScore::Additive) score_v = make_param({H, D});
    if (!scaled && score != AttentionScore::Dot)
        throw std::invalid_argument(std::string("attention: only dot-product scores are scaled by 1/sqrt(D), not ") + to_string(score));
    if ((score == AttentionScore::Local) != (window > 0))
        throw std::invalid_argument("attention: a window (" + std::to_string(window) + ") goes with local attention and local "
                                    "attention needs one >= 1; attention is " + to_string(score));
}

Tensor MultiHeadAttention::project_q(const Tensor& x, const Pass& pass) const {
    const std::int64_t HD = H * D;  // C, unless heads were removed
    Tensor q = linear(x, in_proj_weight.rows(0, HD), in_proj_bias.rows(0, HD));  // (B, Tq, HD)
    pass.probe(this, "q_proj", q);
    return split_heads(q, H);  // (B, H, Tq, D)
}

std::pair<Tensor, Tensor> MultiHeadAttention::project_kv(const Tensor& x, const Pass& pass) const {
    const std::int64_t HD = H * D;
    Tensor kv = linear(x, in_proj_weight.rows(HD, 3 * HD), in_proj_bias.rows(HD, 3 * HD));  // (B, Tk, 2HD)
    pass.probe(this, "kv_proj", kv);
    return {slice_heads(kv, 0, HD, H), slice_heads(kv, HD, 2 * HD, H)};  // K, V: (B, H, Tk, D) each
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
    Tensor scores = score == AttentionScore::Additive ? additive_scores(q, k, score_v) : matmul(q, k, false, true, s);
    pass.probe(this, "scores", scores);
    if (mask.defined()) pass.probe(this, "mask", mask);  // added inside softmax
    Tensor weights = softmax(scores, mask);  // (B, H, Tq, Tk), each row sums to 1 over the keys
    pass.probe(this, "weights", weights);
    Tensor context = matmul(dropout(weights, dropout_p, pass), v);  // (B, H, Tq, D)
    return output(context, pass);
}

Tensor MultiHeadAttention::output(Tensor context, const Pass& pass) const {
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

Tensor MultiHeadAttention::forward(const Tensor& query, const Tensor& key_value, const Tensor& mask_given,
                                   const Pass& pass, KVCache* cache) {
    const bool self = query.same_storage(key_value) && query.shape() == key_value.shape();
    const std::int64_t HD = H * D;  // the heads' width together: C, unless heads were removed
    const bool memory_cached = cache && !self && !cache->empty();  // key_value is not read
    if (query.rank() != 3 || query.size(2) != C ||
        (!memory_cached && (key_value.rank() != 3 || key_value.size(2) != C || key_value.size(0) != query.size(0))))
        throw std::invalid_argument("attention: query " + query.shape().str() + " and key/value " +
                                    key_value.shape().str() + " must be (B, T, " + std::to_string(C) + ")");
    if (cache && tape().recording())
        throw std::logic_error("attention: a key/value cache is for inference only (run it under NoGradGuard)");
    // Local self-attention, uncached: the band op, O(T·W), unless a probe listens (it is shown the full
    // (T, T) weights, so it gets the composition below under a band mask) or the mask is not a key padding
    // or causal + padding one.
    if (score == AttentionScore::Local && self && !cache && scaled && !pass.observer) {
        const Tensor context = attend_band(query, mask_given, pass);
        if (context.defined()) return output(context, pass);
    }
    // Otherwise local self-attention is dot-product attention under a band mask (the cache makes its own).
    const Tensor mask = score == AttentionScore::Local && self && !cache ? with_band(mask_given, query.size(1), window)
                                                                           : mask_given;
    // (attention_heads computes the paper's scaled scores only)
    const bool dot = score == AttentionScore::Dot || score == AttentionScore::Local;
    const bool fused = pass.fuse_attention && dot && scaled && !cache && !pass.observer &&
                       !gate.requires_grad() && is_all_ones(gate);
    if (fused) {  // the same numbers as attend() below, in one op (ops.h attention_heads)
        Rng unused;
        Rng& rng = pass.training() ? *pass.dropout_rng : unused;
        if (self) {
            Tensor qkv = linear(query, in_proj_weight, in_proj_bias);  // (B, T, 3HD)
            return out_proj.forward(attention_heads(qkv, 0, qkv, HD, 2 * HD, H, D, mask, dropout_p, rng, pass.training()));
        }
        Tensor q = linear(query, in_proj_weight.rows(0, HD), in_proj_bias.rows(0, HD));               // (B, Tq, HD)
        Tensor kv = linear(key_value, in_proj_weight.rows(HD, 3 * HD), in_proj_bias.rows(HD, 3 * HD));  // (B, Tk, 2HD)
        return out_proj.forward(attention_heads(q, 0, kv, 0, HD, H, D, mask, dropout_p, rng, pass.training()));
    }
    if (self) {
        // Self-attention: Q, K, V from one (B, T, C) @ (3HD, C)ᵀ product.
        Tensor qkv = linear(query, in_proj_weight, in_proj_bias);  // (B, T, 3HD)
        pass.probe(this, "qkv", qkv);
        Tensor q = slice_heads(qkv, 0, HD, H);                        // (B, H, T, D)
        if (!cache && score == AttentionScore::Linear)
            return attend_linear(q, slice_heads(qkv, HD, 2 * HD, H), slice_heads(qkv, 2 * HD, 3 * HD, H), mask, pass);
        if (!cache) return attend(q, slice_heads(qkv, HD, 2 * HD, H), slice_heads(qkv, 2 * HD, 3 * HD, H), mask, pass);
        // Decoding: the new positions' K, V join the cached ones, and each query sees the keys up to its own.
        if (mask.defined())
            throw std::invalid_argument("attention: self-attention with a cache masks by position itself; got a mask " +
                                        mask.shape().str());
        if (score == AttentionScore::Linear)  // the running sums continue; no keys are kept
            return attend_linear(q, slice_heads(qkv, HD, 2 * HD, H), slice_heads(qkv, 2 * HD, 3 * HD, H), Tensor(), pass, cache);
        cache->append(qkv, HD, 2 * HD, H, D);
        if (score == AttentionScore::Local) {  // only the last W keys: each step O(W), whatever the length
            const KVCache::Window w = cache->window_slice(query.size(1), window);
            return attend(q, w.k, w.v, w.mask, pass);  // over (B, H, ≤ W + Tq − 1, D)
        }
        const Tensor causal = cache->causal_mask(query.size(1));
        return attend(q, cache->k, cache->v, causal, pass);  // over (B, H, capacity, D)
    }
    Tensor q = project_q(query, pass);  // (B, H, Tq, D)
    if (cache && cache->empty()) {  // cross-attention, first call: the memory's K, V, kept for the later calls
        auto [k, v] = project_kv(key_value, pass);  // (B, H, Tk, D) each
        cache->assign(k, v);
    }
    if (cache) return score == AttentionScore::Linear ? attend_linear(q, cache->k, cache->v, mask, pass)
                                                      : attend(q, cache->k, cache->v, mask, pass);
    auto [k, v] = project_kv(key_value, pass);  // (B, H, Tk, D) each
    return score == AttentionScore::Linear ? attend_linear(q, k, v, mask, pass) : attend(q, k, v, mask, pass);
}

// Local self-attention as one op over the band (ops.h band_attention): the in-projection, then
// softmax(q_i·k_j/√D + mask_j) over the keys |i − j| < W (causal: i − W < j ≤ i), weighted sum of their values.
// Undefined when the mask is of another pattern than linear_mask reads (the caller then composes).
Tensor MultiHeadAttention::attend_band(const Tensor& x, const Tensor& mask, const Pass& pass) const {
    const std::int64_t B = x.size(0), T = x.size(1);
    LinearMask m;
    try {
        m = linear_mask(mask, T, T);
    } catch (const std::invalid_argument&) {
        return Tensor();
    }
    Tensor key_mask;  // (B, 1, 1, T): 0 for a key, −∞ for a padded one
    if (m.keep.defined()) {
        NoGradGuard constant;
        key_mask = Tensor::zeros({B, 1, 1, T});
        const std::int64_t Bm = m.keep.size(0);
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t j = 0; j < T; ++j)
                if (m.keep.data()[(Bm == 1 ? 0 : b) * T + j] == 0) key_mask.data()[b * T + j] = kNegInf;
    }
    const std::int64_t HD = H * D;
    Tensor qkv = linear(x, in_proj_weight, in_proj_bias);  // (B, T, 3HD)
    pass.probe(this, "qkv", qkv);
    Tensor q = slice_heads(qkv, 0, HD, H), k = slice_heads(qkv, HD, 2 * HD, H), v = slice_heads(qkv, 2 * HD, 3 * HD, H);  // (B, H, T, D)
    Rng unused;
    Rng& rng = pass.training() ? *pass.dropout_rng : unused;
    return band_attention(q, k, v, key_mask, window, m.causal, real(1) / std::sqrt(real(D)), dropout_p, rng,
                          pass.training());  // (B, H, T, D)
}

// Linear attention, composed: with φ(x) = elu(x) + 1 in place of exp(q·k),
//   out_i = φ(q_i)ᵀ S / φ(q_i)ᵀ z,   S = Σ_j φ(k_j) v_jᵀ (D, D),   z = Σ_j φ(k_j) (D)
// over every key (encoder self-attention, cross-attention), or, causal, over j ≤ i: S_i and z_i are prefix
// sums, which cost T·D² values per head instead of the T² of a weight matrix.
Tensor MultiHeadAttention::attend_linear(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                         const Pass& pass, KVCache* cache) const {
    pass.probe(this, "q", q);
    pass.probe(this, "k", k);
    pass.probe(this, "v", v);
    const std::int64_t B = q.size(0), Tq = q.size(2), Tk = k.size(2);
    const LinearMask m = linear_mask(mask, Tq, Tk);
    const bool causal = m.causal || cache;
    Tensor phi_q = elu_plus_one(q);  // (B, H, Tq, D)
    Tensor phi_k = elu_plus_one(k);  // (B, H, Tk, D)
    if (m.keep.defined()) phi_k = mul(phi_k, m.keep);  // (B, H, Tk, D) · (B, 1, Tk, 1): padded keys add nothing
    pass.probe(this, "phi_q", phi_q);
    pass.probe(this, "phi_k", phi_k);
    Tensor num, den;  // (B, H, Tq, D) and (B, H, Tq, 1)
    if (!causal) {
        Tensor S = matmul(phi_k, v, true, false);  // Σ_j φ(k_j) v_jᵀ: (B, H, Tk, D)ᵀ @ (B, H, Tk, D) -> (B, H, D, D)
        Tensor z = sum(phi_k, 2, true);           // Σ_j φ(k_j): (B, H, 1, D)
        num = matmul(phi_q, S);                   // φ(q_i)ᵀ S: (B, H, Tq, D) @ (B, H, D, D) -> (B, H, Tq, D)
        den = matmul(phi_q, z, false, true);      // φ(q_i)ᵀ z: (B, H, Tq, D) @ (B, H, 1, D)ᵀ -> (B, H, Tq, 1)
    } else {
        // S_i = S_0 + Σ_{j ≤ i} φ(k_j) v_jᵀ, with (B·H) heads as one axis (tensors have rank 4 at most);
        // S_0, z_0 are the cache's sums of the positions before (zero without a cache).
        const std::int64_t BH = B * q.size(1), D_ = q.size(3);
        Tensor outer = mul(phi_k.reshape({BH, Tk, D_, 1}), v.reshape({BH, Tk, 1, D_}));  // φ(k_j) v_jᵀ: (BH, T, D, D)
        Tensor S = cumsum(outer, 1);                                                     // (BH, T, D, D)
        Tensor z = cumsum(phi_k, 2);                                                     // (B, H, T, D)
        if (cache && cache->s.defined()) {
            S = add(S, cache->s.reshape({BH, 1, D_, D_}));  // (BH, T, D, D) + (BH, 1, D, D)
            z = add(z, cache->z);                           // (B, H, T, D) + (B, H, 1, D)
        }
        num = matmul(phi_q.reshape({BH, Tq, 1, D_}), S).reshape({B, q.size(1), Tq, D_});  // φ(q_i)ᵀ S_i: (B, H, T, D)
        den = sum(mul(phi_q, z), 3, true);                                                // φ(q_i)ᵀ z_i: (B, H, T, 1)
        if (cache) {  // the sums after the last position, for the next step
            Tensor s_step = sum(outer, 1).reshape({B, q.size(1), D_, D_});  // (B, H, D, D)
            Tensor z_step = sum(phi_k, 2, true);                            // (B, H, 1, D)
            cache->s = cache->s.defined() ? add(cache->s, s_step) : s_step;
            cache->z = cache->z.defined() ? add(cache->z, z_step) : z_step;
            cache->length += Tq;
        }
    }
    if (pass.observer && !cache) {  // the weights the sums imply, computed only for someone who listens
        NoGradGuard constant;
        Tensor kernel = matmul(phi_q, phi_k, false, true);  // φ(q_i)·φ(k_j): (B, H, Tq, Tk), padded keys 0
        if (causal) {  // keys j ≤ i only
            Tensor lower = Tensor::zeros({1, 1, Tq, Tk});  // (1, 1, T, T): 1 on and below the diagonal
            for (std::int64_t i = 0; i < Tq; ++i) std::fill(lower.data() + i * Tk, lower.data() + i * Tk + i + 1, real(1));
            kernel = mul(kernel, lower);
        }
        pass.probe(this, "scores", kernel);
        pass.probe(this, "weights", div(kernel, sum(kernel, 3, true)));  // each row sums to 1 over its keys
    }
    return output(div(num, den), pass);  // (B, H, Tq, D)
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
    for (std::int64_t i = 0; i < Tq; ++i)
        std::fill(m.data() + i * cap, m.data() + i * cap + first + i + 1, real(0));  // keys 0..p, p = first + i
    return m;
}

KVCache::Window KVCache::window_slice(std::int64_t Tq, std::int64_t window) const {
    const std::int64_t N = k.size(0), H = k.size(1), cap = capacity(), D = k.size(3);
    const std::int64_t from = std::max<std::int64_t>(0, length - Tq - window + 1), n = length - from;
    Window w{Tensor::empty({N, H, n, D}), Tensor::empty({N, H, n, D}), Tensor::full({1, 1, Tq, n}, kNegInf)};
    for (std::int64_t nh = 0; nh < N * H; ++nh) {  // K[nh, from:length, :], V alike: (N, H, n, D)
        std::memcpy(w.k.data() + nh * n * D, k.data() + (nh * cap + from) * D, sizeof(real) * n * D);
        std::memcpy(w.v.data() + nh * n * D, v.data() + (nh * cap + from) * D, sizeof(real) * n * D);
    }
    for (std::int64_t i = 0; i < Tq; ++i) {  // the query at p = length − Tq + i sees keys p − W + 1..p
        const std::int64_t p = length - Tq + i, lo = std::max<std::int64_t>(from, p - window + 1);
        std::fill(w.mask.data() + i * n + (lo - from), w.mask.data() + i * n + (p + 1 - from), real(0));
    }
    return w;
}

void KVCache::select_rows(const std::vector<std::int64_t>& from) {
    if (!k.defined() && !s.defined()) return;  // nothing cached yet
    bool identity = static_cast<std::int64_t>(from.size()) == rows();
    for (std::size_t i = 0; identity && i < from.size(); ++i) identity = from[i] == static_cast<std::int64_t>(i);
    if (identity) return;
    if (k.defined()) k = gather_rows(k, from);  // (M, H, capacity, D)
    if (v.defined()) v = gather_rows(v, from);  // (M, H, capacity, D)
    if (s.defined()) s = gather_rows(s, from);  // (M, H, D, D)
    if (z.defined()) z = gather_rows(z, from);  // (M, H, 1, D)
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
