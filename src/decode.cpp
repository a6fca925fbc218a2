// Greedy decoding and beam search over an incremental decoder with a key/value cache.
//
// A decoder step is Transformer::decode_step: the model's own layers, attention included, run over the
// key/value caches of nn/attention.h. What is here is the search: which token each row takes, which
// hypotheses live on, and which cache rows they continue. The tests compare every step's logits with
// model.decode on the whole prefix.
#include "tapeformer/decode.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>

#include <omp.h>

#include "tapeformer/autograd.h"
#include "tapeformer/error.h"
#include "tapeformer/lanes.h"
#include "tapeformer/parallel.h"
#include "tapeformer/ops.h"
#include "tapeformer/reference_ops.h"

TF_NAMESPACE_BEGIN

namespace {

const real kNegInf = -std::numeric_limits<real>::infinity();


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
        // Σ exp in 16 fixed float lanes with exp_fast (lanes.h): vectorised, the same on any thread count;
        // in reference mode with std::exp, in order.
        real total = 0;
        if (reference_mode())
            for (std::int64_t v = 0; v < V; ++v) total += std::exp(row[v] - mx);
        else
            total = lane_sum(V, [&](std::int64_t v) { return exp_fast(row[v] - mx); });
        out.lse[n] = double(mx) + std::log(double(total));
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

FrozenWeights::FrozenWeights(const Transformer& model) {
    for (const NamedTensor& p : model.parameters())
        if (p.tensor.rank() == 2) matrices_.add(p.tensor.data(), p.tensor.size(0), p.tensor.size(1));
}

// ---- the incremental decoder ------------------------------------------------------------------------------

IncrementalDecoder::IncrementalDecoder(Transformer& model, const Tensor& memory, const std::vector<std::int32_t>& src,
                                       std::int64_t B, std::int64_t S, std::int64_t max_steps)
    : model_(model), max_steps_(max_steps), source_row_(B), memory_(memory) {
    const std::int64_t C = model.config.d_model;
    if (memory.rank() != 3 || memory.size(0) != B || memory.size(1) != S || memory.size(2) != C)
        throw std::invalid_argument("IncrementalDecoder: memory " + memory.shape().str() + " is not (B, S, C) = (" +
                                    std::to_string(B) + ", " + std::to_string(S) + ", " + std::to_string(C) + ")");
    if (static_cast<std::int64_t>(src.size()) != B * S)
        throw std::invalid_argument("IncrementalDecoder: " + std::to_string(src.size()) + " source ids for a (" +
                                    std::to_string(B) + ", " + std::to_string(S) + ") batch");
    if (max_steps < 0 || max_steps > model.config.max_len)
        throw std::invalid_argument("IncrementalDecoder: max_steps " + std::to_string(max_steps) +
                                    " is outside [0, model max_len " + std::to_string(model.config.max_len) + "]");
    memory_mask_ = key_padding_mask(src, B, S, model.config.pad_id);  // (B, 1, 1, S)
    for (std::int64_t b = 0; b < B; ++b) source_row_[b] = b;
}

Tensor IncrementalDecoder::step(const std::vector<std::int32_t>& tokens) {
    const std::int64_t N = rows();
    if (static_cast<std::int64_t>(tokens.size()) != N)
        throw std::invalid_argument("IncrementalDecoder::step: " + std::to_string(tokens.size()) + " tokens for " +
                                    std::to_string(N) + " rows");
    if (position() >= max_steps_)
        throw std::invalid_argument("IncrementalDecoder::step: position " + std::to_string(position()) +
                                    " is beyond max_steps " + std::to_string(max_steps_));
    NoGradGuard no_grad;
    const Tensor hidden = model_.decode_step(tokens, N, 1, memory_, memory_mask_, cache_);  // (N, 1, C)
    memory_ = Tensor();  // projected into every layer's cross-attention cache: not read again
    return model_.project(hidden).reshape({N, model_.config.tgt_vocab});  // (N, 1, C) @ (V, C)ᵀ -> (N, V)
}

void IncrementalDecoder::select_rows(const std::vector<std::int64_t>& from) {
    const std::int64_t N = rows(), M = static_cast<std::int64_t>(from.size());
    std::vector<std::int64_t> source(M);
    for (std::int64_t i = 0; i < M; ++i) {
        if (from[i] < 0 || from[i] >= N)
            throw std::invalid_argument("IncrementalDecoder::select_rows: row " + std::to_string(from[i]) +
                                        " is outside [0, " + std::to_string(N) + ")");
        source[i] = source_row_[from[i]];
    }
    // The rows of one source hold the same memory, mask and cross-attention K, V: when every row keeps its
    // source (beam search reordering hypotheses within their sentences), only the self-attention caches move.
    const bool same_sources = source == source_row_;
    source_row_ = std::move(source);
    NoGradGuard no_grad;
    if (memory_.defined()) memory_ = gather_rows(memory_, from);  // before the first step: (M, S, C)
    if (!same_sources) memory_mask_ = gather_rows(memory_mask_, from);  // (M, 1, 1, S)
    for (DecoderLayerCache& layer : cache_.layers) {
        layer.self_attn.select_rows(from);
        if (!same_sources) layer.multihead_attn.select_rows(from);
    }
}

// ---- greedy -----------------------------------------------------------------------------------------------

namespace {

// How long each row's output may grow: the caps L(n) of decode.h, checked options included.
struct OutputLengths {
    std::vector<std::int64_t> cap;  // (B): output length cap of each row
    std::int64_t max_cap = 0;       // the longest: the decoder's max_steps
};

OutputLengths plan_output_lengths(const Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                  std::int64_t S, const DecodeOptions& o) {
    if (B < 0 || S < 1) fail("translate_batch", "a (" + std::to_string(B) + ", " + std::to_string(S) + ") source batch");
    if (static_cast<std::int64_t>(src.size()) != B * S)
        fail("translate_batch", std::to_string(src.size()) + " source ids for a (" + std::to_string(B) + ", " + std::to_string(S) + ") batch");
    if (o.beam < 1) fail("translate_batch", "beam must be at least 1, got " + std::to_string(o.beam));
    if (!std::isfinite(o.length_penalty)) fail("translate_batch", "length_penalty must be a finite number");
    if (!(o.max_len_ratio >= 0) || o.max_len_abs < 0)
        fail("translate_batch", "max_len_abs and max_len_ratio must not be negative, got " + std::to_string(o.max_len_abs) + " and " +
             std::to_string(o.max_len_ratio));
    if (o.force_steps < 0) fail("translate_batch", "force_steps must not be negative, got " + std::to_string(o.force_steps));
    if (o.force_steps > 0 && o.beam != 1) fail("translate_batch", "force_steps needs beam 1 (greedy), got beam " + std::to_string(o.beam));
    if (o.force_steps > model.config.max_len)
        fail("translate_batch", "force_steps " + std::to_string(o.force_steps) + " is beyond the model's max_len " +
             std::to_string(model.config.max_len));
    OutputLengths p;
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
std::vector<Translation> run_greedy(Transformer& model, IncrementalDecoder& dec, const OutputLengths& lengths,
                                    const DecodeOptions& o) {
    const ModelConfig& c = model.config;
    const std::int64_t B = dec.rows(), V = c.tgt_vocab;
    const bool forced = o.force_steps > 0;
    std::vector<Translation> out(B);
    std::vector<char> finished(B, 0);
    std::vector<std::int64_t> row_of;  // decoder row -> batch row
    for (std::int64_t b = 0; b < B; ++b)
        if (lengths.cap[b] > 0) row_of.push_back(b);
        else finished[b] = 1;
    if (!forced && static_cast<std::int64_t>(row_of.size()) < B) dec.select_rows(row_of);
    if (forced) {
        row_of.resize(B);
        for (std::int64_t b = 0; b < B; ++b) row_of[b] = b;
    }
    std::vector<std::int32_t> tokens(row_of.size(), c.bos_id);
    std::vector<std::int64_t> keep;
    for (std::int64_t t = 0; !row_of.empty() && t < lengths.max_cap; ++t) {
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
            if (static_cast<std::int64_t>(tr.tokens.size()) >= lengths.cap[b]) {
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

// One live hypothesis: a decoder row.
struct Hypothesis {
    std::vector<std::int32_t> tokens;  // generated so far
    double log_prob = 0;               // their summed log-probability
    std::int64_t sentence = 0;         // the source row it translates
    std::int64_t parent = 0;           // the decoder row of the previous step it extends (its cache rows)
};

// What the decoder needs from the live hypotheses: the row each continues, and the token it feeds next.
std::vector<std::int64_t> parents(const std::vector<Hypothesis>& live) {
    std::vector<std::int64_t> out;
    for (const Hypothesis& h : live) out.push_back(h.parent);
    return out;
}

std::vector<std::int32_t> last_tokens(const std::vector<Hypothesis>& live, std::int32_t bos) {
    std::vector<std::int32_t> out;
    for (const Hypothesis& h : live) out.push_back(h.tokens.empty() ? bos : h.tokens.back());
    return out;
}

// A sentence's finished hypotheses (ended by EOS or by the cap) and the best score among those that ended
// by EOS while the sentence was live: what a live hypothesis must be able to beat to stay.
struct Finished {
    std::vector<Translation> all;
    double best_score = -std::numeric_limits<double>::infinity();
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

// Step 0: one empty hypothesis per sentence that may generate anything; the others are finished empty.
std::vector<Hypothesis> start_beams(const OutputLengths& lengths, std::vector<Finished>& finished) {
    std::vector<Hypothesis> live;
    for (std::int64_t b = 0; b < static_cast<std::int64_t>(lengths.cap.size()); ++b)
        if (lengths.cap[b] > 0) live.push_back({{}, 0, b, b});
        else finished[b].all.push_back(Translation{});
    return live;
}

// The first decoder row of each sentence's group, and the row count N at the end (rows of a sentence are
// contiguous).
std::vector<std::int64_t> sentence_starts(const std::vector<Hypothesis>& live) {
    std::vector<std::int64_t> starts;
    for (std::size_t r = 0; r < live.size(); ++r)
        if (r == 0 || live[r].sentence != live[r - 1].sentence) starts.push_back(static_cast<std::int64_t>(r));
    starts.push_back(static_cast<std::int64_t>(live.size()));
    return starts;
}

// Per sentence: the best K extensions of its live hypotheses (K × V candidates), best first.
std::vector<std::vector<Candidate>> best_extensions(const Tensor& logits, const std::vector<double>& lse,
                                                    const std::vector<Hypothesis>& live,
                                                    const std::vector<std::int64_t>& starts, std::int64_t K,
                                                    const ModelConfig& c) {
    const std::int64_t N = logits.size(0), V = logits.size(1), G = static_cast<std::int64_t>(starts.size()) - 1;
    const real* x = logits.data();  // (N, V)
    std::vector<std::vector<Candidate>> top(G);
#pragma omp parallel for schedule(dynamic) if (N * V >= kParallelGrain)
    for (std::int64_t g = 0; g < G; ++g) {
        std::vector<Candidate>& best = top[g];
        for (std::int64_t r = starts[g]; r < starts[g + 1]; ++r)
            top_k_of_row(x + r * V, V, K, r, live[r].log_prob, lse[r], c, best);
        std::sort(best.begin(), best.end(), ranks_before);
        if (static_cast<std::int64_t>(best.size()) > K) best.resize(static_cast<std::size_t>(K));
    }
    return top;
}

// A sentence's best extensions: those that end in EOS are finished, ranked by their length-penalised
// score; the others are appended to `next` as live hypotheses.
void extend(const std::vector<Candidate>& top, const std::vector<Hypothesis>& live, std::int64_t V, double alpha,
            const ModelConfig& c, Finished& finished, std::vector<Hypothesis>& next) {
    for (const Candidate& cand : top) {
        const std::int64_t r = cand.flat / V;
        const std::int32_t v = static_cast<std::int32_t>(cand.flat % V);
        if (v == c.eos_id) {
            Translation tr{live[r].tokens, cand.score, 0, true};
            finish_score(tr, alpha);
            finished.best_score = std::max(finished.best_score, tr.score);
            finished.all.push_back(std::move(tr));
            continue;
        }
        Hypothesis h{live[r].tokens, cand.score, live[r].sentence, r};
        h.tokens.push_back(v);
        next.push_back(std::move(h));
    }
}

// At the cap the live hypotheses next[first..] end as they are, without EOS.
void end_at_cap(std::vector<Hypothesis>& next, std::size_t first, double alpha, Finished& finished) {
    for (std::size_t i = first; i < next.size(); ++i) {
        Translation tr{std::move(next[i].tokens), next[i].log_prob, 0, false};
        finish_score(tr, alpha);
        finished.all.push_back(std::move(tr));
    }
    next.resize(first);
}

// Drops the live hypotheses next[first..] that cannot beat the best finished one any more. One of m tokens
// ends with len in [m + 1, cap] (EOS counted) and its log-prob sum can only fall, so its best possible score
// is sum / max lp(len) (sums are <= 0; lp is monotone in len).
void drop_hopeless(std::vector<Hypothesis>& next, std::size_t first, std::int64_t m, std::int64_t cap, double alpha,
                   const Finished& finished) {
    if (finished.all.empty()) return;
    const double lp_max = std::max(length_penalty(m + 1, alpha), length_penalty(cap, alpha));
    auto hopeless = [&](const Hypothesis& h) { return !(h.log_prob / lp_max > finished.best_score); };
    next.erase(std::remove_if(next.begin() + static_cast<std::ptrdiff_t>(first), next.end(), hopeless), next.end());
}

// Each sentence's answer: its best finished hypothesis by score (ties: the first found).
std::vector<Translation> best_of_each(const std::vector<Finished>& finished) {
    std::vector<Translation> out(finished.size());
    for (std::size_t b = 0; b < finished.size(); ++b) {
        const Translation* best = nullptr;
        for (const auto& tr : finished[b].all)
            if (!best || tr.score > best->score) best = &tr;
        if (best) out[b] = *best;
    }
    return out;
}

// The rule is in decode.h. Each step: score every extension of every live hypothesis, keep each sentence's
// best K, set aside those that end (EOS or the cap), drop those that cannot win, and move the decoder's
// cache rows to follow the survivors.
std::vector<Translation> run_beam(Transformer& model, IncrementalDecoder& dec, const OutputLengths& lengths,
                                  const DecodeOptions& o) {
    const ModelConfig& c = model.config;
    const std::int64_t B = dec.rows(), V = c.tgt_vocab, K = o.beam;
    std::vector<Finished> finished(B);
    std::vector<Hypothesis> live = start_beams(lengths, finished);
    if (static_cast<std::int64_t>(live.size()) < B) dec.select_rows(parents(live));

    for (std::int64_t t = 0; !live.empty(); ++t) {
        const Tensor logits = dec.step(last_tokens(live, c.bos_id));  // (N, V)
        const std::vector<double> lse = row_stats(logits, c).lse;     // (N)
        const std::vector<std::int64_t> starts = sentence_starts(live);
        const std::vector<std::vector<Candidate>> top = best_extensions(logits, lse, live, starts, K, c);
        std::vector<Hypothesis> next;
        for (std::size_t g = 0; g < top.size(); ++g) {
            const std::int64_t b = live[starts[g]].sentence, cap = lengths.cap[b];
            const std::size_t first = next.size();
            extend(top[g], live, V, o.length_penalty, c, finished[b], next);
            if (t + 1 >= cap) end_at_cap(next, first, o.length_penalty, finished[b]);
            else drop_hopeless(next, first, t + 1, cap, o.length_penalty, finished[b]);
        }
        live = std::move(next);
        if (!live.empty()) dec.select_rows(parents(live));
    }
    return best_of_each(finished);
}

// Encodes the batch once, then runs `search` over an incremental decoder sized for the longest cap.
template <class Search>
std::vector<Translation> translate_group(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                         std::int64_t S, const DecodeOptions& options, Search search) {
    const OutputLengths p = plan_output_lengths(model, src, B, S, options);
    if (B == 0) return {};
    NoGradGuard no_grad;  // the tape is per thread: every group's thread needs its own guard
    const Tensor memory = model.encode(src, B, S, Pass{});  // (B, S, C)
    IncrementalDecoder dec(model, memory, src, B, S, p.max_cap);
    return search(model, dec, p, options);
}

// The batch is cut into groups of kGroupRows decoder rows (kGroupRows / K sentences for beam K), decoded
// independently, the groups shared out among the threads, each group on one thread from encoder to last
// step. A decoding step of 64 rows is too little work to split among threads op by op: the others were
// woken and waited for about 40 times a step (tens of microseconds each with passive waiting), and a second
// thread bought 6%. A group per thread has no such cost. The groups depend on B and K only, never on the
// thread count, so the translations are the same on any number of threads. 32 rows: the benchmark's batch
// (64 sentences, 20 steps, AMD EPYC Zen 4, FrozenWeights held) decodes in 78 ms on 2 threads and 145 on
// one in fp32 (in one group of 64: 150 and 140), 46 and 85 in bf16; groups of 16 were no faster.
constexpr std::int64_t kGroupRows = 32;

template <class Search>
std::vector<Translation> translate_with(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                        std::int64_t S, const DecodeOptions& options, Search search) {
    plan_output_lengths(model, src, B, S, options);  // checks the batch and the options before any work
    // Without AVX-512 the weights are not held packed (FrozenMatrices), sgemm packs them at every product,
    // and every group would pack them again: one group then, threaded op by op as before.
    const std::int64_t per_group =
        cpu_has_avx512() ? std::max<std::int64_t>(1, kGroupRows / std::max(1, options.beam)) : std::max<std::int64_t>(B, 1);
    const std::int64_t groups = (B + per_group - 1) / per_group;
    if (groups <= 1) return translate_group(model, src, B, S, options, search);
    std::vector<std::vector<Translation>> parts(groups);
    std::exception_ptr error;  // the first group's failure, rethrown once all have stopped
#pragma omp parallel for schedule(dynamic, 1) if (!omp_in_parallel())
    for (std::int64_t g = 0; g < groups; ++g) {
        const std::int64_t b0 = g * per_group, rows = std::min(per_group, B - b0);
        try {
            const std::vector<std::int32_t> part(src.begin() + b0 * S, src.begin() + (b0 + rows) * S);  // (rows, S)
            parts[g] = translate_group(model, part, rows, S, options, search);
        } catch (...) {
#pragma omp critical(translate_with_error)
            if (!error) error = std::current_exception();
        }
    }
    if (error) std::rethrow_exception(error);
    std::vector<Translation> out;
    out.reserve(std::size_t(B));
    for (auto& part : parts)
        for (auto& tr : part) out.push_back(std::move(tr));
    return out;
}

}  // namespace

std::vector<Translation> greedy_search(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                       std::int64_t S, const DecodeOptions& options) {
    return translate_with(model, src, B, S, options, run_greedy);
}

std::vector<Translation> beam_search(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                     std::int64_t S, const DecodeOptions& options) {
    if (options.force_steps > 0) fail("translate_batch", "force_steps is for greedy decoding only");
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
