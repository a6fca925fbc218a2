// Text generation with a decoder-only model (ModelConfig::arch == DecoderOnly): the prompt is fed after BOS,
// then one token at a time is chosen from the model's next-token distribution and fed back, over the same
// key/value cache that translation uses (Transformer::decode_step), until EOS, --max-tokens or the model's
// last position.
//
// Choosing a token (Holtzman et al. 2020 for top-p):
//   temperature 0:  argmax_v logits_v (greedy; ties to the lower id)
//   otherwise:      p_v ∝ exp(logits_v / temperature), kept to the k most probable (top_k > 0), then to the
//                   smallest set of most probable ids whose probabilities sum to >= top_p, renormalised,
//                   and sampled with one uniform u in [0, 1) per token.
// u comes from the project's counter-based generator (random.h: 53 bits of SplitMix64 of (seed, step)), not
// from a std:: distribution, whose output differs between standard libraries; candidates are ordered by
// (probability, id) and summed in double in that order. The same seed and the same logits thus give the same
// token on any machine; the logits are the same wherever the model's kernels compute the same floats.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

struct GenerateOptions {
    double temperature = 1.0;        // 0 = greedy; > 0 divides the logits before the softmax
    std::int64_t top_k = 0;          // keep the k most probable tokens (0 = all)
    double top_p = 1.0;              // nucleus: keep the most probable tokens up to this mass, in (0, 1]
    std::int64_t max_tokens = 100;   // generated tokens at most (EOS not counted)
    std::uint64_t seed = 1;          // the sampling stream (unused when greedy)

    // Throws std::invalid_argument naming the flag ("--top-p must be in (0, 1], got 1.5").
    void validate() const;
};

struct Generation {
    std::vector<std::int32_t> tokens;  // the generated ids, without the prompt, without EOS
    bool ended = false;                // the model generated EOS (false: max_tokens or max_len stopped it)
};

// One token from logits (V) of a model with `config` (pad and BOS are never chosen), with `u` in [0, 1)
// the step's uniform (ignored when greedy).
std::int32_t choose_token(const real* logits, std::int64_t V, const ModelConfig& config, const GenerateOptions& options,
                          double u);

// Continues `prompt` (token ids without BOS) with a decoder-only model, under NoGradGuard in evaluation mode.
// `on_logits`, when given, sees the logits (V) of every position whose next token is chosen (for tests).
// Throws std::invalid_argument for an encoder-decoder model or a prompt longer than the model's positions.
Generation generate(Transformer& model, const std::vector<std::int32_t>& prompt, const GenerateOptions& options,
                    const std::function<void(const real*, std::int64_t)>& on_logits = {});

TF_NAMESPACE_END
