// Translation with a trained model: batched greedy decoding and beam search over a key/value cache.
//
// The decoder is run one position at a time (Transformer::decode_step: the same layers and attention code
// as training). Each step feeds one token per hypothesis and computes Q, K, V for that position only; the
// keys and values of the earlier positions come from a cache, and those of the encoder output
// (cross-attention) are projected once per source batch. A step thus costs O(t) attention instead of
// re-running the decoder on the whole prefix (O(t²) over a sentence).
#pragma once
#include <cstdint>
#include <vector>

#include "tapeformer/blas.h"
#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

struct DecodeOptions {
    int beam = 1;                 // K hypotheses per sentence; 1 = greedy (beam search with K = 1 gives the same)
    double length_penalty = 1.0;  // GNMT α: a finished hypothesis ranks by log p / ((5 + len) / 6)^α; 0 = none
    // Output length cap for a source row with n tokens (its non-pad positions, EOS included):
    //   L(n) = min(max_len_abs, floor(max_len_ratio · n + max_len_offset), model max_len).
    // The output has at most L tokens besides EOS; a hypothesis that reaches L tokens ends there, without EOS.
    int max_len_abs = 256;
    double max_len_ratio = 2.0;
    int max_len_offset = 10;
    // > 0: greedy decodes exactly this many steps for every row, whatever EOS and the cap say (the
    // benchmark mode of the PyTorch reference's --eval-greedy). Outputs still end at the first EOS.
    // Needs beam == 1 and at most the model's max_len steps.
    int force_steps = 0;
};

// One output sentence and how the model scored it.
struct Translation {
    std::vector<std::int32_t> tokens;  // without BOS and EOS
    double log_prob = 0;   // Σ log p(token | prefix, source) over the generated tokens, EOS included when generated
    double score = 0;      // log_prob / ((5 + len) / 6)^α, len = generated tokens (EOS included): what beam ranks by
    bool ended = false;    // true: the model generated EOS; false: stopped by the length cap (or force_steps)
};

// The length cap L(n) above for a source of n tokens.
std::int64_t max_output_length(std::int64_t n, const DecodeOptions& options, const ModelConfig& config);

// GNMT length penalty ((5 + len) / 6)^α (Wu et al. 2016, eq. 14).
double length_penalty(std::int64_t len, double alpha);

// The model's weight matrices held packed (FrozenMatrices, blas.h) for the decoding that follows: each packed
// (in bf16: rounded) once instead of at every product of every step. The weights must not change while it
// lives. translate, eval, validation and the benchmark hold one around their loop over batches.
class FrozenWeights {
public:
    explicit FrozenWeights(const Transformer& model);
    std::size_t size() const { return matrices_.size(); }  // matrices held

private:
    FrozenMatrices matrices_;
};

// Translates B source rows of S ids each (right-padded with pad), under NoGradGuard and in evaluation mode,
// in groups of 32 decoder rows (32 / K sentences for beam K) decoded in parallel, one thread each; the
// groups depend on B and K only, so the result does not depend on the thread count. Row b of the result is
// the translation of source row b. Pad and BOS are never generated.
//
// beam == 1 (greedy): each row takes the most probable next token until it generates EOS or reaches its
// cap; finished rows leave the batch, and decoding stops when none is left.
//
// beam == K > 1: every sentence keeps up to K live hypotheses. A step scores every extension of every
// live hypothesis by its summed log-probability and keeps the best K (top-K over K × V, ties to the lower
// (row, id)): those that end in EOS are set aside as finished, ranked by their length-penalised score, the
// others are the next live hypotheses (their cache rows gathered from their parents); the beam refills to
// K on the next step. A live hypothesis is dropped as soon as it cannot beat the sentence's best finished
// one: with m tokens and log-prob sum s it ends with a length in [m + 1, L] and a sum <= s, so its score
// can at most reach s / max(lp(m + 1), lp(L)). A sentence is done when no live hypothesis is left (all
// dropped, or all of the best K ended in EOS), or when they reach the cap L: they are then finished as they
// are, without EOS. Its best finished hypothesis is returned. The stopping rule is exact: a dropped
// hypothesis could never have become the answer (unlike fairseq's "stop at K finished", which can miss a
// better hypothesis still live). With K = 1 this is greedy: the single best extension either ends the
// sentence (EOS) or continues it.
std::vector<Translation> translate_batch_scored(Transformer& model, const std::vector<std::int32_t>& src,
                                                std::int64_t B, std::int64_t S, const DecodeOptions& options);
// The two searches behind it, callable directly (the tests run beam_search with K = 1 against greedy).
std::vector<Translation> greedy_search(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                       std::int64_t S, const DecodeOptions& options);
std::vector<Translation> beam_search(Transformer& model, const std::vector<std::int32_t>& src, std::int64_t B,
                                     std::int64_t S, const DecodeOptions& options);
// The same, tokens only.
std::vector<std::vector<std::int32_t>> translate_batch(Transformer& model, const std::vector<std::int32_t>& src,
                                                       std::int64_t B, std::int64_t S, const DecodeOptions& options);

// The decoder run one position at a time over N rows (hypotheses), each attached to one source row.
// Step t feeds one token per row at position t and returns the logits of the token at position t + 1,
// what model.decode + model.project give for the last position of the whole prefix (up to rounding).
//
// It holds the model's DecoderCache: per decoder layer, the self-attention K, V of the positions fed so far
// and the cross-attention K, V of the encoder output (projected by the first step), one row per decoder row.
class IncrementalDecoder {
public:
    // memory (B, S, C) = model.encode(src, B, S); starts with N = B rows, row b on source b, at position 0.
    IncrementalDecoder(Transformer& model, const Tensor& memory, const std::vector<std::int32_t>& src,
                       std::int64_t B, std::int64_t S, std::int64_t max_steps);

    std::int64_t rows() const { return static_cast<std::int64_t>(source_row_.size()); }
    std::int64_t position() const { return cache_.position(); }  // the position the next step() fills
    const std::vector<std::int64_t>& source_rows() const { return source_row_; }

    // tokens: one id per row at position() -> logits (N, V) of the next token. Advances position() by 1.
    Tensor step(const std::vector<std::int32_t>& tokens);

    // The new row i continues the current row from[i] (its cache and source): reorders beams, copies a
    // hypothesis into several children, and drops finished rows. from may be shorter or longer than rows().
    void select_rows(const std::vector<std::int64_t>& from);

private:
    Transformer& model_;
    std::int64_t max_steps_ = 0;
    std::vector<std::int64_t> source_row_;  // (N): each row's source row in [0, B)
    Tensor memory_;                         // (N, S, C) until the first step has projected it into the cache
    Tensor memory_mask_;                    // (N, 1, 1, S): 0 keeps a source position, −∞ drops a pad
    DecoderCache cache_;
};

TF_NAMESPACE_END
