// Greedy decoding and beam search over an incremental decoder with a key/value cache.
//
// The decoder step reuses the model's modules (embedding, positional encoding, the attention projections,
// gates and output projections, layer norms, FFN, generator); only the attention of one new query over
// the cached keys is a kernel of its own here (attend_one_query), because the cache is not a contiguous
// tensor. The tests compare every step's logits with model.decode on the whole prefix.
#include "tapeformer/decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"

TF_NAMESPACE_BEGIN

namespace {

constexpr std::int64_t kParallelGrain = 1 << 14;  // as in ops.cpp: below this, threads cost more than they save
const real kNegInf = -std::numeric_limits<real>::infinity();

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument("translate_batch: " + msg); }

// Keys and values of one attention: row r, head h starts at k + r·row_stride + h·head_stride, then one key
// of D values after another.
struct KeyValues {
    const real* k;
    const real* v;
    std::int64_t row_stride, head_stride;
};

// The model's attend() for a single query per row:
//   w = softmax(q Kᵀ / √D + mask),   out = w V
// over keys [0, len) of each (row, head). q: N rows of H·D values, ldq apart; out: (N, H, D). kv_row[n]
// picks the key/value row of query row n (nullptr: n itself); mask (nullable) holds `len` additive values
// per key/value row. scores is scratch of N·H·len values. Threads split the (row, head) pairs.
void attend_one_query(const real* q, std::int64_t ldq, std::int64_t N, std::int64_t H, std::int64_t D,
                      const KeyValues& kv, std::int64_t len, const std::int64_t* kv_row, const real* mask,
                      real* scores, real* out) {
    const real scale = real(1) / std::sqrt(real(D));
#pragma omp parallel for schedule(static) if (N * H * len * D >= kParallelGrain)
    for (std::int64_t nh = 0; nh < N * H; ++nh) {
        const std::int64_t n = nh / H, h = nh % H, r = kv_row ? kv_row[n] : n;
        const real* qh = q + n * ldq + h * D;                         // (D)
        const real* kh = kv.k + r * kv.row_stride + h * kv.head_stride;  // (len, D)
        const real* vh = kv.v + r * kv.row_stride + h * kv.head_stride;  // (len, D)
        const real* m = mask ? mask + r * len : nullptr;             // (len)
        real* s = scores + nh * len;                                 // (len)
        real* o = out + nh * D;                                      // (D)
        real mx = kNegInf;
        for (std::int64_t j = 0; j < len; ++j) {
            real dot = 0;
#pragma omp simd reduction(+ : dot)
            for (std::int64_t d = 0; d < D; ++d) dot += qh[d] * kh[j * D + d];
            s[j] = dot * scale + (m ? m[j] : real(0));
            mx = std::max(mx, s[j]);
        }
        std::fill(o, o + D, real(0));
        if (mx == kNegInf) continue;  // every key masked: zeros, as the softmax op gives
        real total = 0;
        for (std::int64_t j = 0; j < len; ++j) total += (s[j] = std::exp(s[j] - mx));
        const real inv = real(1) / total;
        for (std::int64_t j = 0; j < len; ++j) {
            const real w = s[j] * inv;
#pragma omp simd
            for (std::int64_t d = 0; d < D; ++d) o[d] += w * vh[j * D + d];
        }
    }
}

// Pad and BOS are inputs only: the search never generates them.
bool generable(std::int32_t v, const ModelConfig& c) { return v != c.pad_id && v != c.bos_id; }

// What the searches need from each row of logits (N, V): lse = log Σ_v exp(logit_v), in double, so that
// log p(v) = logit_v − lse; and the most probable generable id (greedy's choice, ties to the lowest id).
struct RowStats {
    std::vector<double> lse;         // (N)
    std::vector<std::int32_t> best;  // (N)
};

RowStats row_stats(const Tensor& logits, const ModelConfig& c) {
    const std::int64_t N = logits.size(0), V = logits.size(1);
    RowStats out{std::vector<double>(N), std::vector<std::int32_t>(N)};
    const real* x = logits.data();
#pragma omp parallel for schedule(static) if (N * V >= kParallelGrain)
    for (std::int64_t n = 0; n < N; ++n) {
        const real* row = x + n * V;  // (V)
        real mx = kNegInf;
#pragma omp simd reduction(max : mx)
        for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v]);
        std::int32_t arg = static_cast<std::int32_t>(std::find(row, row + V, mx) - row);
        if (arg == V || !generable(arg, c)) {  // the maximum is pad or BOS (or NaN): scan the generable ids
            arg = -1;
            for (std::int32_t v = 0; v < V; ++v)
                if (generable(v, c) && (arg < 0 || row[v] > row[arg])) arg = v;
        }
        double total = 0;
        for (std::int64_t v = 0; v < V; ++v) total += std::exp(row[v] - mx);
        out.lse[n] = double(mx) + std::log(total);
        out.best[n] = arg;
    }
    return out;
}

std::int64_t source_tokens(const std::vector<std::int32_t>& src, std::int64_t b, std::int64_t S, std::int32_t pad) {
    std::int64_t n = 0;
    for (std::int64_t s = 0; s < S; ++s) n += src[b * S + s] != pad;
    return n;
}

void finish_score(Translation& tr, double alpha) {
    const std::int64_t len = static_cast<std::int64_t>(tr.tokens.size()) + (tr.ended ? 1 : 0);
    tr.score = tr.log_prob / length_penalty(len, alpha);
}

}  // namespace

double length_penalty(std::int64_t len, double alpha) {
    return alpha == 0 ? 1.0 : std::pow((5.0 + double(len)) / 6.0, alpha);
}

std::int64_t max_output_length(std::int64_t n, const DecodeOptions& o, const ModelConfig& config) {
    const double by_ratio = std::floor(o.max_len_ratio * double(n) + double(o.max_len_offset));
    std::int64_t cap = std::min<std::int64_t>(o.max_len_abs, config.max_len);
    if (by_ratio < double(cap)) cap = static_cast<std::int64_t>(by_ratio);
    return std::max<std::int64_t>(cap, 0);
}

// ---- the incremental decoder ------------------------------------------------------------------------------

IncrementalDecoder::IncrementalDecoder(Transformer& model, const Tensor& memory, const std::vector<std::int32_t>& src,
                                       std::int64_t B, std::int64_t S, std::int64_t max_steps)
    : model_(model), S_(S), C_(model.config.d_model), H_(model.config.heads), D_(C_ / H_), Tmax_(max_steps) {
    if (memory.rank() != 3 || memory.size(0) != B || memory.size(1) != S || memory.size(2) != C_)
        throw std::invalid_argument("IncrementalDecoder: memory " + memory.shape().str() + " is not (B, S, C) = (" +
                                    std::to_string(B) + ", " + std::to_string(S) + ", " + std::to_string(C_) + ")");
    if (static_cast<std::int64_t>(src.size()) != B * S)
        throw std::invalid_argument("IncrementalDecoder: " + std::to_string(src.size()) + " source ids for a (" +
                                    std::to_string(B) + ", " + std::to_string(S) + ") batch");
    if (max_steps < 0 || max_steps > model.config.max_len)
        throw std::invalid_argument("IncrementalDecoder: max_steps " + std::to_string(max_steps) +
                                    " is outside [0, model max_len " + std::to_string(model.config.max_len) + "]");
    NoGradGuard no_grad;
    memory_mask_ = key_padding_mask(src, B, S, model.config.pad_id);  // (B, 1, 1, S)
    source_row_.resize(B);
    for (std::int64_t b = 0; b < B; ++b) source_row_[b] = b;
    layers_.resize(model.decoder.size());
    for (std::size_t l = 0; l < layers_.size(); ++l) {
        auto [k, v] = model.decoder[l].multihead_attn.project_kv(memory);  // (B, H, S, D) each, once per batch
        layers_[l].cross_k = k;
        layers_[l].cross_v = v;
    }
    reserve_rows(B);
}

void IncrementalDecoder::reserve_rows(std::int64_t n) {
    const std::size_t size = static_cast<std::size_t>(n * H_ * Tmax_ * D_);  // (n, H, Tmax, D)
    for (auto& layer : layers_)
        for (std::vector<real>* buffer : {&layer.k, &layer.v})
            if (buffer->size() < size) buffer->resize(size);  // keeps the rows already there
}

namespace {

bool is_all_ones(const Tensor& t) {
    for (std::int64_t i = 0; i < t.numel(); ++i)
        if (t.data()[i] != real(1)) return false;
    return true;
}

// The end of attend(): gate the heads, merge them and project. With a single query position the heads of
// (N, 1, C) are already laid out as (N, H, 1, D), so splitting and merging them are reshapes, not copies.
Tensor gate_and_project(MultiHeadAttention& attn, Tensor context) {  // (N, H, 1, D) -> (N, 1, C)
    const std::int64_t N = context.size(0);
    if (attn.gate.requires_grad() || !is_all_ones(attn.gate)) context = mul(context, attn.gate);  // ξ_h · head_h
    return attn.out_proj.forward(context.reshape({N, 1, attn.C}));  // (N, 1, C) @ W_oᵀ + b_o
}

}  // namespace

Tensor IncrementalDecoder::self_attention(MultiHeadAttention& attn, LayerCache& cache, const Tensor& x) {
    const std::int64_t N = rows();
    // Q, K, V of the new position from one (C -> 3C) product, as MultiHeadAttention::forward does.
    const Tensor qkv = linear(x, attn.in_proj_weight, attn.in_proj_bias);  // (N, 1, 3C)
    const real* p = qkv.data();
    // Append K and V to the cache at position t: K[n, h, t, :] = qkv[n, C + h·D : C + (h+1)·D].
    for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t h = 0; h < H_; ++h) {
            const std::int64_t at = ((n * H_ + h) * Tmax_ + t_) * D_;
            std::memcpy(&cache.k[at], p + n * 3 * C_ + C_ + h * D_, sizeof(real) * D_);
            std::memcpy(&cache.v[at], p + n * 3 * C_ + 2 * C_ + h * D_, sizeof(real) * D_);
        }
    // Only positions 0..t are in the cache, so no causal mask is needed; the fed tokens are never pad.
    const std::int64_t len = t_ + 1;
    scores_.resize(static_cast<std::size_t>(N * H_ * len));
    Tensor context = Tensor::empty({N, H_, 1, D_});  // (N, H, 1, D)
    attend_one_query(p, 3 * C_, N, H_, D_, {cache.k.data(), cache.v.data(), H_ * Tmax_ * D_, Tmax_ * D_}, len,
                     nullptr, nullptr, scores_.data(), context.data());
    return gate_and_project(attn, context);  // (N, 1, C)
}

Tensor IncrementalDecoder::cross_attention(MultiHeadAttention& attn, LayerCache& cache, const Tensor& x) {
    const std::int64_t N = rows();
    // project_q without its split_heads copy: (N, 1, C) is (N, H, 1, D) already.
    const Tensor q = linear(x, attn.in_proj_weight.rows(0, C_), attn.in_proj_bias.rows(0, C_));  // (N, 1, C)
    scores_.resize(static_cast<std::size_t>(N * H_ * S_));
    Tensor context = Tensor::empty({N, H_, 1, D_});  // (N, H, 1, D)
    attend_one_query(q.data(), C_, N, H_, D_, {cache.cross_k.data(), cache.cross_v.data(), H_ * S_ * D_, S_ * D_},
                     S_, source_row_.data(), memory_mask_.data(), scores_.data(), context.data());
    return gate_and_project(attn, context);  // (N, 1, C)
}

Tensor IncrementalDecoder::step(const std::vector<std::int32_t>& tokens) {
    const std::int64_t N = rows();
    if (static_cast<std::int64_t>(tokens.size()) != N)
        throw std::invalid_argument("IncrementalDecoder::step: " + std::to_string(tokens.size()) + " tokens for " +
                                    std::to_string(N) + " rows");
    if (t_ >= Tmax_)
        throw std::invalid_argument("IncrementalDecoder::step: position " + std::to_string(t_) +
                                    " is beyond max_steps " + std::to_string(Tmax_));
    NoGradGuard no_grad;
    const Pass pass{};  // evaluation: no dropout
    // x = E[token] · √C + PE[t]
    Tensor x = model_.positional.forward(model_.tgt_embed.forward(tokens, N, 1), t_);  // (N, 1, C)
    // Each layer as DecoderLayer::forward, with the self-attention over the cache.
    for (std::size_t l = 0; l < layers_.size(); ++l) {
        DecoderLayer& layer = model_.decoder[l];
        LayerCache& cache = layers_[l];
        if (layer.norm == NormPosition::Post) {
            Tensor h = layer.norm1.forward(add(x, self_attention(layer.self_attn, cache, x)));
            h = layer.norm2.forward(add(h, cross_attention(layer.multihead_attn, cache, h)));
            x = layer.norm3.forward(add(h, layer.ff.forward(h, pass)));
        } else {
            Tensor h = add(x, self_attention(layer.self_attn, cache, layer.norm1.forward(x)));
            h = add(h, cross_attention(layer.multihead_attn, cache, layer.norm2.forward(h)));
            x = add(h, layer.ff.forward(layer.norm3.forward(h), pass));
        }
    }
    if (model_.config.norm == NormPosition::Pre) x = model_.decoder_norm.forward(x);
    ++t_;
    return model_.project(x).reshape({N, model_.config.tgt_vocab});  // (N, 1, C) @ (V, C)ᵀ -> (N, V)
}

void IncrementalDecoder::select_rows(const std::vector<std::int64_t>& from) {
    const std::int64_t N = rows(), M = static_cast<std::int64_t>(from.size());
    bool increasing = true, identity = M <= N;
    for (std::int64_t i = 0; i < M; ++i) {
        if (from[i] < 0 || from[i] >= N)
            throw std::invalid_argument("IncrementalDecoder::select_rows: row " + std::to_string(from[i]) +
                                        " is outside [0, " + std::to_string(N) + ")");
        increasing = increasing && (i == 0 || from[i] > from[i - 1]);
        identity = identity && from[i] == i;
    }
    std::vector<std::int64_t> source(M);
    for (std::int64_t i = 0; i < M; ++i) source[i] = source_row_[from[i]];
    source_row_ = std::move(source);
    if (identity || t_ == 0) {  // nothing cached yet, or the same rows: only the bookkeeping changes
        reserve_rows(M);
        return;
    }
    // Copy the cached positions [0, t) of row from[i] into row i, for every head. A strictly increasing
    // `from` (dropping rows) has from[i] >= i and can be done in place, front to back; any other order
    // gathers into the spare buffer, which then swaps places with the cache.
    const std::int64_t row = H_ * Tmax_ * D_, used = t_ * D_;
    auto gather = [&](const real* src, real* dst) {
#pragma omp parallel for schedule(static) if (!increasing && M * H_ * used >= kParallelGrain)
        for (std::int64_t i = 0; i < M; ++i) {
            if (src == dst && from[i] == i) continue;
            for (std::int64_t h = 0; h < H_; ++h)
                std::memmove(dst + i * row + h * Tmax_ * D_, src + from[i] * row + h * Tmax_ * D_, sizeof(real) * used);
        }
    };
    for (auto& layer : layers_)
        for (std::vector<real>* buffer : {&layer.k, &layer.v}) {
            if (increasing) {
                gather(buffer->data(), buffer->data());
                continue;
            }
            if (spare_.size() < static_cast<std::size_t>(M * row)) spare_.resize(static_cast<std::size_t>(M * row));
            gather(buffer->data(), spare_.data());
            std::swap(*buffer, spare_);
        }
}

// ---- greedy -----------------------------------------------------------------------------------------------

namespace {

struct Batch {
    std::vector<std::int64_t> cap;  // (B): output length cap of each row
    std::int64_t max_cap = 0;
};

Batch plan(const Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B, std::int64_t S,
           const DecodeOptions& o) {
    if (B < 0 || S < 1) fail("a (" + std::to_string(B) + ", " + std::to_string(S) + ") source batch");
    if (static_cast<std::int64_t>(src.size()) != B * S)
        fail(std::to_string(src.size()) + " source ids for a (" + std::to_string(B) + ", " + std::to_string(S) + ") batch");
    if (o.beam < 1) fail("beam must be at least 1, got " + std::to_string(o.beam));
    if (!std::isfinite(o.length_penalty)) fail("length_penalty must be a finite number");
    if (!(o.max_len_ratio >= 0) || o.max_len_abs < 0)
        fail("max_len_abs and max_len_ratio must not be negative, got " + std::to_string(o.max_len_abs) + " and " +
             std::to_string(o.max_len_ratio));
    if (o.force_steps < 0) fail("force_steps must not be negative, got " + std::to_string(o.force_steps));
    if (o.force_steps > 0 && o.beam != 1) fail("force_steps needs beam 1 (greedy), got beam " + std::to_string(o.beam));
    if (o.force_steps > model.config.max_len)
        fail("force_steps " + std::to_string(o.force_steps) + " is beyond the model's max_len " +
             std::to_string(model.config.max_len));
    Batch p;
    p.cap.resize(B);
    for (std::int64_t b = 0; b < B; ++b) {
        p.cap[b] = o.force_steps > 0 ? o.force_steps
                                     : max_output_length(source_tokens(src, b, S, model.config.pad_id), o, model.config);
        p.max_cap = std::max(p.max_cap, p.cap[b]);
    }
    return p;
}

// Each row takes the most probable generable token until EOS or its cap. Finished rows leave the decoder
// (select_rows), except with force_steps, where every row runs every step and a finished row only stops
// changing.
std::vector<Translation> run_greedy(Transformer& model, IncrementalDecoder& dec, const Batch& plan,
                                    const DecodeOptions& o) {
    const ModelConfig& c = model.config;
    const std::int64_t B = dec.rows(), V = c.tgt_vocab;
    const bool forced = o.force_steps > 0;
    std::vector<Translation> out(B);
    std::vector<char> finished(B, 0);
    std::vector<std::int64_t> row_of;  // decoder row -> batch row
    for (std::int64_t b = 0; b < B; ++b)
        if (plan.cap[b] > 0) row_of.push_back(b);
        else finished[b] = 1;
    if (!forced && static_cast<std::int64_t>(row_of.size()) < B) dec.select_rows(row_of);
    if (forced) {
        row_of.resize(B);
        for (std::int64_t b = 0; b < B; ++b) row_of[b] = b;
    }
    std::vector<std::int32_t> tokens(row_of.size(), c.bos_id);
    std::vector<std::int64_t> keep;
    for (std::int64_t t = 0; !row_of.empty() && t < plan.max_cap; ++t) {
        const Tensor logits = dec.step(tokens);  // (N, V)
        const std::int64_t N = dec.rows();
        const RowStats stats = row_stats(logits, c);
        const std::vector<double>& lse = stats.lse;
        const std::vector<std::int32_t>& best = stats.best;
        const real* x = logits.data();
        keep.clear();
        for (std::int64_t r = 0; r < N; ++r) {
            const std::int64_t b = row_of[r];
            tokens[r] = best[r];
            if (finished[b]) continue;  // force_steps: the row keeps running but its output is fixed
            Translation& tr = out[b];
            tr.log_prob += double(x[r * V + best[r]]) - lse[r];
            if (best[r] == c.eos_id) {
                tr.ended = true;
                finished[b] = 1;
                continue;
            }
            tr.tokens.push_back(best[r]);
            if (static_cast<std::int64_t>(tr.tokens.size()) >= plan.cap[b]) {
                finished[b] = 1;
                continue;
            }
            keep.push_back(r);
        }
        if (forced || static_cast<std::int64_t>(keep.size()) == N) continue;
        dec.select_rows(keep);
        std::vector<std::int64_t> rows(keep.size());
        tokens.resize(keep.size());
        for (std::size_t i = 0; i < keep.size(); ++i) {
            rows[i] = row_of[keep[i]];
            tokens[i] = best[keep[i]];
        }
        row_of = std::move(rows);
    }
    for (auto& tr : out) finish_score(tr, o.length_penalty);
    return out;
}

// ---- beam search ------------------------------------------------------------------------------------------

struct Hypothesis {
    std::vector<std::int32_t> tokens;
    double log_prob = 0;
};

struct Candidate {
    double score;       // parent's log_prob + log p(v)
    std::int64_t flat;  // (row of the parent) · V + v: ties go to the smaller, as argmax would
};

bool ranks_before(const Candidate& a, const Candidate& b) {
    return a.score > b.score || (a.score == b.score && a.flat < b.flat);
}

// The best k generable ids of one row of logits (V), appended to `out` as candidates of decoder row r.
// The sentence's best K extensions are among the best K of each of its rows (a row's extensions rank in
// the order of its logits), so the search never sorts all K × V of them.
void top_k_of_row(const real* logits, std::int64_t V, std::int64_t k, std::int64_t r, double log_prob, double lse,
                  const ModelConfig& c, std::vector<Candidate>& out) {
    // A min-heap of (logit, id) on the weakest kept; ids come in increasing order, so a tie never replaces.
    std::vector<std::pair<real, std::int32_t>> heap;
    heap.reserve(static_cast<std::size_t>(k) + 1);
    auto weaker = [](const std::pair<real, std::int32_t>& a, const std::pair<real, std::int32_t>& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    for (std::int32_t v = 0; v < V; ++v) {
        if (static_cast<std::int64_t>(heap.size()) == k && !(logits[v] > heap.front().first)) continue;
        if (!generable(v, c)) continue;
        heap.push_back({logits[v], v});
        std::push_heap(heap.begin(), heap.end(), weaker);
        if (static_cast<std::int64_t>(heap.size()) > k) {
            std::pop_heap(heap.begin(), heap.end(), weaker);
            heap.pop_back();
        }
    }
    for (const auto& [logit, v] : heap) out.push_back({log_prob + (double(logit) - lse), r * V + v});
}

// The rule is in decode.h. Decoder rows are grouped by sentence, in order: the rows of one sentence are
// contiguous, and each sentence has between 1 and K of them while it is live.
std::vector<Translation> run_beam(Transformer& model, IncrementalDecoder& dec, const Batch& plan,
                                  const DecodeOptions& o) {
    const ModelConfig& c = model.config;
    const std::int64_t B = dec.rows(), V = c.tgt_vocab, K = o.beam;
    const double alpha = o.length_penalty;
    std::vector<std::vector<Translation>> finished(B);
    std::vector<double> best_done(B, -std::numeric_limits<double>::infinity());  // best finished score
    std::vector<Hypothesis> live;       // one per decoder row
    std::vector<std::int64_t> sentence;  // decoder row -> sentence
    for (std::int64_t b = 0; b < B; ++b)
        if (plan.cap[b] > 0) {
            live.push_back({});
            sentence.push_back(b);
        } else {
            finished[b].push_back(Translation{});
        }
    if (static_cast<std::int64_t>(sentence.size()) < B) dec.select_rows(sentence);

    std::vector<std::int32_t> tokens(live.size(), c.bos_id);
    for (std::int64_t t = 0; !live.empty(); ++t) {
        const Tensor logits = dec.step(tokens);  // (N, V)
        const std::int64_t N = dec.rows();
        const std::vector<double> lse = row_stats(logits, c).lse;
        const real* x = logits.data();
        // The rows of each sentence present now.
        std::vector<std::int64_t> group_begin;
        for (std::int64_t r = 0; r < N; ++r)
            if (r == 0 || sentence[r] != sentence[r - 1]) group_begin.push_back(r);
        const std::int64_t G = static_cast<std::int64_t>(group_begin.size());
        group_begin.push_back(N);

        // Per sentence: its best K extensions, best first.
        std::vector<std::vector<Candidate>> top(G);
#pragma omp parallel for schedule(dynamic) if (N * V >= kParallelGrain)
        for (std::int64_t g = 0; g < G; ++g) {
            std::vector<Candidate>& best = top[g];
            for (std::int64_t r = group_begin[g]; r < group_begin[g + 1]; ++r)
                top_k_of_row(x + r * V, V, K, r, live[r].log_prob, lse[r], c, best);
            std::sort(best.begin(), best.end(), ranks_before);
            if (static_cast<std::int64_t>(best.size()) > K) best.resize(static_cast<std::size_t>(K));
        }

        std::vector<Hypothesis> next;
        std::vector<std::int64_t> next_sentence, from;
        for (std::int64_t g = 0; g < G; ++g) {
            const std::int64_t b = sentence[group_begin[g]], cap = plan.cap[b];
            std::vector<Translation>& done = finished[b];
            const std::size_t first_live = next.size();
            for (const Candidate& cand : top[g]) {
                const std::int64_t r = cand.flat / V;
                const std::int32_t v = static_cast<std::int32_t>(cand.flat % V);
                if (v == c.eos_id) {  // set aside, ranked by its length-penalised score
                    Translation tr{live[r].tokens, cand.score, 0, true};
                    finish_score(tr, alpha);
                    best_done[b] = std::max(best_done[b], tr.score);
                    done.push_back(std::move(tr));
                    continue;
                }
                Hypothesis h{live[r].tokens, cand.score};
                h.tokens.push_back(v);
                next.push_back(std::move(h));
                next_sentence.push_back(b);
                from.push_back(r);
            }
            if (t + 1 >= cap) {  // the cap: the live hypotheses end here, without EOS
                for (std::size_t i = first_live; i < next.size(); ++i) {
                    Translation tr{std::move(next[i].tokens), next[i].log_prob, 0, false};
                    finish_score(tr, alpha);
                    done.push_back(std::move(tr));
                }
                next.resize(first_live);
            } else if (!done.empty()) {
                // Drop the live hypotheses that cannot beat the best finished one any more. One of m tokens
                // ends with len in [m + 1, cap] (EOS counted) and its log-prob sum can only fall, so its best
                // possible score is sum / max lp(len) (sums are <= 0; lp is monotone in len).
                const std::int64_t m = t + 1;
                const double lp_max = std::max(length_penalty(m + 1, alpha), length_penalty(cap, alpha));
                std::size_t kept = first_live;
                for (std::size_t i = first_live; i < next.size(); ++i) {
                    if (!(next[i].log_prob / lp_max > best_done[b])) continue;
                    if (kept != i) {
                        next[kept] = std::move(next[i]);
                        from[kept] = from[i];
                    }
                    ++kept;
                }
                next.resize(kept);
            }
            next_sentence.resize(next.size());
            from.resize(next.size());
        }
        live = std::move(next);
        sentence = std::move(next_sentence);
        if (live.empty()) break;
        dec.select_rows(from);
        tokens.resize(live.size());
        for (std::size_t i = 0; i < live.size(); ++i) tokens[i] = live[i].tokens.back();
    }

    std::vector<Translation> out(B);
    for (std::int64_t b = 0; b < B; ++b) {
        const Translation* best = nullptr;
        for (const auto& tr : finished[b])
            if (!best || tr.score > best->score) best = &tr;  // ties: the first found
        if (best) out[b] = *best;
    }
    return out;
}

}  // namespace

namespace {

// Encodes the batch once, then runs `search` over an incremental decoder sized for the longest cap.
template <class Search>
std::vector<Translation> translate_with(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                        std::int64_t S, const DecodeOptions& options, Search search) {
    const Batch p = plan(model, src, B, S, options);
    if (B == 0) return {};
    NoGradGuard no_grad;
    const Tensor memory = model.encode(src, B, S, Pass{});  // (B, S, C)
    IncrementalDecoder dec(model, memory, src, B, S, p.max_cap);
    return search(model, dec, p, options);
}

}  // namespace

std::vector<Translation> greedy_search(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                       std::int64_t S, const DecodeOptions& options) {
    return translate_with(model, src, B, S, options, run_greedy);
}

std::vector<Translation> beam_search(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                     std::int64_t S, const DecodeOptions& options) {
    if (options.force_steps > 0) fail("force_steps is for greedy decoding only");
    return translate_with(model, src, B, S, options, run_beam);
}

std::vector<Translation> translate_batch_scored(Transformer& model, const std::vector<std::int32_t>& src,
                                                std::int64_t B, std::int64_t S, const DecodeOptions& options) {
    return options.beam == 1 ? greedy_search(model, src, B, S, options) : beam_search(model, src, B, S, options);
}

std::vector<std::vector<std::int32_t>> translate_batch(Transformer& model, const std::vector<std::int32_t>& src,
                                                       std::int64_t B, std::int64_t S, const DecodeOptions& options) {
    std::vector<std::vector<std::int32_t>> out;
    for (auto& tr : translate_batch_scored(model, src, B, S, options)) out.push_back(std::move(tr.tokens));
    return out;
}

TF_NAMESPACE_END
