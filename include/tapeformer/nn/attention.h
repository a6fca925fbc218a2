// Multi-head attention ("Attention Is All You Need", section 3.2):
//   Attention(Q, K, V) = softmax(Q Kᵀ / √D + mask) V      (or additive scores v·tanh(q_i + k_j), below;
//                                                          or, to break it, Q Kᵀ without the 1/√D;
//                                                          or linear / local attention, at AttentionScore)
//   head_h = Attention(x_q W_qʰ, x_kv W_kʰ, x_kv W_vʰ),   MultiHead = concat_h(ξ_h · head_h) W_o
// with H heads of width D = C / H (or fewer heads of the same D, where heads were removed: heads prune
// --save; then the heads' width together, HD = H·D, is less than C). ξ_h is the head gate (1 by default):
// ∂L/∂ξ_h is the head importance of
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

// Rows from[0], from[1], ... of x along its first axis: (N, ...) -> (M, ...), M = from.size(). A row lookup
// (the embedding op on x seen as a table of N rows), for reordering what belongs to beam hypotheses.
Tensor gather_rows(const Tensor& x, const std::vector<std::int64_t>& from);

// The keys and values an attention has computed in earlier calls, for decoding one position at a time
// (inference only: nothing written here carries a gradient). Two uses:
//   self-attention:  every call appends the K, V of its new positions, and its queries see every position
//                    fed so far up to their own (the causal mask, implied);
//   cross-attention: the first call projects the memory (the encoder output) into K, V; later calls reuse
//                    them and do not read the memory again.
// K and V are stored with room to spare, as std::vector does: a full cache doubles its capacity (one copy),
// so appending a position writes D values per (row, head) in place. Attention runs over the whole capacity,
// the positions not filled yet masked out (−∞), which keeps K and V one contiguous tensor each for the
// matmuls of attend().
// Row n of the cache belongs to row n of the query batch; select_rows reorders, copies and drops rows as
// beam search prunes and extends its hypotheses.
struct KVCache {
    Tensor k, v;              // (N, H, capacity, D): positions [0, length) are filled, the rest are zeros or stale
    std::int64_t length = 0;  // positions filled
    // Linear attention's causal self-attention keeps no keys: its whole past is two running sums,
    // s = Σ_j φ(k_j) v_jᵀ (N, H, D, D) and z = Σ_j φ(k_j) (N, H, 1, D), each step adding its own.
    Tensor s, z;

    bool empty() const { return length == 0; }
    std::int64_t rows() const { return k.defined() ? k.size(0) : s.defined() ? s.size(0) : 0; }  // N
    std::int64_t capacity() const { return k.defined() ? k.size(2) : 0; }

    // Positions [length, length + Tq) of every row, read from the in-projection's output x (N, Tq, W): K
    // from columns [k_col, k_col + H·D), V from [v_col, v_col + H·D), head after head. Grows the capacity
    // when it is full.
    void append(const Tensor& x, std::int64_t k_col, std::int64_t v_col, std::int64_t H, std::int64_t D);
    // K, V of a whole sequence at once (cross-attention's projected memory): (N, H, Tk, D) each, length = Tk.
    void assign(const Tensor& k_all, const Tensor& v_all);
    // (1, 1, Tq, capacity) additive mask for the last Tq positions appended: the query at position p sees
    // the keys at positions 0..p; positions not filled yet get −∞. (Local attention: window_slice.)
    Tensor causal_mask(std::int64_t Tq) const;
    // Local attention's step: the keys and values a window W reaches from the last Tq positions appended,
    // positions [from, length) with from = max(0, length − Tq − W + 1), copied out as (N, H, n, D) each, and
    // the (1, 1, Tq, n) mask that leaves the query at p the keys p − W + 1..p. O(W + Tq) a step, not O(length).
    struct Window {
        Tensor k, v, mask;
    };
    Window window_slice(std::int64_t Tq, std::int64_t window) const;
    // New row i is old row from[i], for every filled position. from may repeat, reorder and drop rows.
    void select_rows(const std::vector<std::int64_t>& from);
};

// How a query scores a key: the paper's scaled dot product q·k/√D, or Bahdanau et al.'s (2015) additive
// v·tanh(W_q q + W_k k), where W_q q and W_k k are the query and key projections Q and K. Two efficient
// variants change which keys a query weighs, and how:
//   Linear (Katharopoulos et al. 2020): exp(q·k) replaced by the kernel φ(q)·φ(k), φ(x) = elu(x) + 1, so
//     out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j)): the sums over j are computed once (causal:
//     as prefix sums over j ≤ i), O(T·D²) instead of O(T²·D), and no T×T weight matrix exists. The mask it
//     is given must be a key padding mask (B, 1, 1, Tk) or a causal one (B, 1, T, T, as causal_padding_mask
//     makes); padded keys are dropped from both sums. No dropout on weights (there are none).
//   Local (sliding window, the sparse pattern of Child et al. 2019 / Beltagy et al. 2020): scaled dot
//     product, but in self-attention query i sees only the keys j with |i − j| < W (with the causal mask:
//     the last W positions, itself included). Cross-attention stays full. Built as a band mask on the full
//     T×T scores: the same O(T²) time and memory as Dot (see docs/lesson-efficient-attention.md).
enum class AttentionScore { Dot, Additive, Linear, Local };
const char* to_string(AttentionScore s);
AttentionScore parse_attention_score(const std::string& s);

struct MultiHeadAttention {
    static constexpr const char* kType = "MultiHeadAttention";
    std::int64_t C = 0, H = 0, D = 0;  // HD = H·D is C unless heads were removed
    AttentionScore score = AttentionScore::Dot;
    bool scaled = true;     // dot scores divided by √D (false: Q Kᵀ as it is, to watch softmax saturate)
    std::int64_t window = 0;  // W, local attention's window (AttentionScore::Local only, then ≥ 1)
    Tensor in_proj_weight;  // (3HD, C): rows [0, HD) are W_q, [HD, 2HD) W_k, [2HD, 3HD) W_v — PyTorch's layout
    Tensor in_proj_bias;    // (3HD)
    Linear out_proj;        // W_o (C, HD) and its bias (C)
    Tensor score_v;         // v (H, D): each head's additive scoring vector (AttentionScore::Additive only)
    real dropout_p = 0;     // on the attention weights
    Tensor gate;            // ξ (1, H, 1, 1): not a parameter; set_requires_grad(true) to get ∂L/∂ξ

    MultiHeadAttention() = default;
    // D = C / H, or `D` where given (> 0): a model whose heads were removed keeps its heads' width.
    MultiHeadAttention(std::int64_t C, std::int64_t H, real dropout, AttentionScore score = AttentionScore::Dot,
                       bool scaled = true, std::int64_t window = 0, std::int64_t D = 0);

    // query (B, Tq, C), key_value (B, Tk, C) -> (B, Tq, C). mask broadcasts to (B, H, Tq, Tk).
    // When query and key_value are the same tensor (self-attention), Q, K and V come from one fused (C -> 3C)
    // product. With a cache (decoding, under NoGradGuard), as described at KVCache: self-attention appends
    // its K, V to the cache and needs no mask (it must be undefined); cross-attention projects key_value on
    // the first call only, and `mask` (B, 1, 1, Tk) masks the memory's padding as without a cache.
    // Probes, in order: "qkv" (B, Tq, 3C) for self-attention, or "q_proj" (B, Tq, C) and "kv_proj" (B, Tk, 2C);
    // then "q" (B, H, Tq, D), "k", "v" (B, H, Tk, D), "scores" (B, H, Tq, Tk), "mask" (as given), "weights"
    // (B, H, Tq, Tk), "context" (B, H, Tq, D, each head's Σ_j a_ij v_j before its gate), "gate" (after ξ, only
    // when a gate is not 1 or is trained), "merge" (B, Tq, C) and "out_proj" (B, Tq, C). With a cache, Tk is
    // the cache's capacity. A pass with an observer runs the composed form, whose steps the probes name.
    // Linear attention reports "q", "k", "v", "phi_q", "phi_k" (B, H, T, D), and, only when an observer
    // listens, the weights its sums imply, a_ij = φ(q_i)·φ(k_j) / Σ_j' φ(q_i)·φ(k_j') over the keys it sees, as
    // "scores" (the kernel values φ(q_i)·φ(k_j)) and "weights" (B, H, Tq, Tk); then "context" onwards as above.
    Tensor forward(const Tensor& query, const Tensor& key_value, const Tensor& mask, const Pass& pass,
                   KVCache* cache = nullptr);

    void visit(ModuleWalk& walk) const;  // in_proj_weight, in_proj_bias, out_proj, score_v (additive only)
    void init(Rng& rng);  // Xavier-uniform in_proj (as one (3C, C) matrix) and out_proj, zero biases, v ~ N(0, 1/D)

private:
    Tensor project_q(const Tensor& x, const Pass& pass) const;                      // (B, T, C) -> (B, H, T, D)
    std::pair<Tensor, Tensor> project_kv(const Tensor& x, const Pass& pass) const;  // (B, T, C) -> K, V (B, H, T, D)
    // softmax(scores(Q, K) + mask) V, gated, heads merged and projected: -> (B, Tq, C)
    Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Pass& pass) const;
    // Linear attention's φ(Q) (Σ φ(K) Vᵀ) / (φ(Q) Σ φ(K)), gated, merged and projected: -> (B, Tq, C). With
    // a cache (causal self-attention, decoding), k and v are the new positions' and the sums continue it.
    Tensor attend_linear(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, const Pass& pass,
                         KVCache* cache = nullptr) const;
    // Local self-attention over the band of x (B, T, C) as one op (ops.h band_attention): the context
    // (B, H, T, D), or undefined when the mask is not a key padding or causal + padding mask.
    Tensor attend_band(const Tensor& x, const Tensor& mask, const Pass& pass) const;
    Tensor output(Tensor context, const Pass& pass) const;  // (B, H, Tq, D) -> gate, merge, W_o -> (B, Tq, C)
};

// The same attention in its "theory" form: separate W_qʰ, W_kʰ, W_vʰ (D, C) for every head, each head
// computed on its own, then concatenated. Slower; here to show that it is the fused form above.
struct PerHeadAttention {
    static constexpr const char* kType = "PerHeadAttention";
    std::int64_t C = 0, H = 0, D = 0;
    std::vector<Linear> wq, wk, wv;  // H of each, (D, C) with bias (D)
    Linear out_proj;
    Tensor gate;                      // (H) values, one per head

    PerHeadAttention() = default;
    PerHeadAttention(std::int64_t C, std::int64_t H);
    // Copies the slices of a fused module's weights: W_qʰ = in_proj_weight[hD : (h+1)D], and so on.
    void load_from(const MultiHeadAttention& fused);
    Tensor forward(const Tensor& query, const Tensor& key_value, const Tensor& mask) const;
    void visit(ModuleWalk& walk) const;  // heads.<h>.q_proj, k_proj, v_proj; out_proj
};

TF_NAMESPACE_END
