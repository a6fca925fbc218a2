// Pruning heads by learning which to close (Voita et al. 2019, "Analyzing Multi-Head Self-Attention"): every
// head's gate ξ_h becomes a Hard-Concrete random variable z_h (ops.h, Louizos et al. 2018) with a learnable
// log α_h, and the model is fine-tuned on
//   L = NLL (mean per target token) + λ · Σ_h P(z_h ≠ 0),   P(z_h ≠ 0) = σ(log α_h − β ln(−l/r))
// the second term being the expected number of open heads: a differentiable L0 norm. The tape makes the gates
// ordinary parameters — hard_concrete's output simply replaces the attention's gate tensor. After fine-tuning
// each gate takes its evaluation value z_h = min(1, max(0, σ(log α_h)(r − l) + l)); z_h = 0 is a closed head.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/decode.h"
#include "tapeformer/study/heads.h"
#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

struct L0Options {
    double lambda = 0.01;             // λ: weight of the expected number of open heads
    double temperature = 0.33;        // β of the Hard-Concrete distribution (issue 10, Voita et al.)
    double stretch_low = -0.1;        // l
    double stretch_high = 1.1;        // r
    double init_log_alpha = 3.0;      // every gate starts open (evaluation gate 1, P(open) ≈ 0.99)
    int steps = 300;                  // fine-tuning updates
    double lr = 1e-4;                 // Adam's learning rate for the model's parameters (0: the model stays frozen)
    double gate_lr = 0.05;            // Adam's learning rate for the log α (they must travel several units)
    std::int64_t batch_tokens = 4096; // per training batch (length-bucketed, shuffled) and for evaluation
    std::uint64_t seed = 1;           // batch order, dropout and the gates' noise
    std::vector<HeadKind> kinds;      // the attentions that get gates (empty: E, D and A)
    int log_every = 50;               // a progress entry every N steps (and at the last)
    DecodeOptions decode;             // for the BLEU of the evaluation pairs
};

struct L0Head {
    HeadId id;
    double log_alpha = 0;  // learnt
    double p_open = 0;     // P(z ≠ 0) of the training gate
    double gate = 0;       // the evaluation gate z: 0 = closed
    bool closed() const { return gate == 0; }
};

struct L0Progress {
    int step = 0;
    double nll = 0;           // mean per target token of the step's batch (dropout and sampled gates on)
    double expected_open = 0; // Σ_h P(z_h ≠ 0)
    int closed = 0;           // heads whose evaluation gate is 0 now
};

struct L0Report {
    std::vector<L0Head> heads;                 // the gated heads: E layers, then D, then A
    std::vector<L0Progress> progress;
    int closed = 0;
    double bleu_before = 0, nll_before = 0;    // the model as given, on the evaluation pairs
    double bleu_after = 0, nll_after = 0;      // fine-tuned, every gate at its evaluation value
    L0Options options;
};

// Fine-tunes `model` in place on the training pairs train_src/train_tgt with a Hard-Concrete gate per head
// of the chosen kinds and evaluates it (BLEU of greedy/beam translations by `options.decode`, teacher-forced
// NLL per target token) on eval_src/eval_ref before and after. Afterwards the model holds the fine-tuned
// weights and every gated attention's gate holds the evaluation gates (closed heads 0). Deterministic for a
// seed and thread count. Throws std::invalid_argument on bad options or empty pairs.
L0Report l0_prune_heads(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& train_src,
                        const std::vector<std::string>& train_tgt, const std::vector<std::string>& eval_src,
                        const std::vector<std::string>& eval_ref, const L0Options& options,
                        const std::function<void(const L0Progress&)>& on_progress = nullptr);

std::string l0_json(const L0Report& report);   // settings, before/after, per-head log α, P(open), gate
std::string l0_table(const L0Report& report);  // the gates as layers × heads per kind, closed marked, and the scores

TF_NAMESPACE_END
