// Using a trained model on text: translate lines, score translations against references (BLEU, chrF,
// exact match)
// and measure the teacher-forced loss of reference translations.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tapeformer/data/batch.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/decode.h"
#include "tapeformer/metrics/bleu.h"
#include "tapeformer/metrics/exact_match.h"
#include "tapeformer/nn/transformer.h"

TF_NAMESPACE_BEGIN

// Called after each batch with (sentences done, total).
using ProgressFn = std::function<void(std::int64_t done, std::int64_t total)>;

// Translates every line (detokenized output, one per input line, in input order; an empty line gives an
// empty translation). Sources longer than the model's positional table are cut to fit and counted in
// *truncated. Batches hold about batch_tokens / options.beam source tokens, sorted by length: each of a
// sentence's beam hypotheses counts against the budget (std::invalid_argument when batch_tokens < beam).
std::vector<std::string> translate_lines(Transformer& model, const TokenizerPair& tokenizers,
                                         const std::vector<std::string>& lines, const DecodeOptions& options,
                                         std::int64_t batch_tokens = 4096, const ProgressFn& progress = nullptr,
                                         std::int64_t* truncated = nullptr);

// translate_lines that can be stopped between batches (Ctrl-C in `tapeformer translate`): `stop` is asked
// before each batch, and once it answers true no further batch is decoded. Line i's translation, or nullopt
// for a line left untranslated (batches go by length, so those need not be the last lines).
std::vector<std::optional<std::string>> translate_lines_until(Transformer& model, const TokenizerPair& tokenizers,
                                                              const std::vector<std::string>& lines,
                                                              const DecodeOptions& options, std::int64_t batch_tokens,
                                                              const ProgressFn& progress,
                                                              const std::function<bool()>& stop,
                                                              std::int64_t* truncated = nullptr);

// Mean label-smoothed loss, NLL and perplexity over all non-pad target tokens (dropout off). Throws
// std::invalid_argument when there is no target token (the mean of nothing is not a loss). A pair longer than
// batch_tokens is a batch of its own, as in translate_lines. `progress` is
// called after each batch with (examples done, total); what it throws ends the computation.
LossReport teacher_forced_loss(Transformer& model, const std::vector<Example>& examples, std::int64_t batch_tokens,
                               double label_smoothing, const ProgressFn& progress = nullptr);

// One example's summed −log p(reference token) over its non-pad target positions (EOS included; no label
// smoothing, dropout off) and how many positions that is.
struct ExampleNll {
    double nll_sum = 0;
    std::int64_t tokens = 0;
};

// Each example's NLL, in the order of `examples`: what a paired bootstrap over sentences resamples (the
// mean NLL of a resample is Σ nll_sum / Σ tokens over the sentences drawn). Batched as teacher_forced_loss.
std::vector<ExampleNll> per_example_nll(Transformer& model, const std::vector<Example>& examples,
                                        std::int64_t batch_tokens);

struct EvalReport {
    BleuScore bleu;
    ChrfScore chrf;
    ExactMatch exact;                     // hypotheses equal to their reference
    LossReport loss;                      // of the references, teacher-forced
    std::vector<std::string> hypotheses;  // the translations, in input order
    std::int64_t truncated = 0;           // sources cut to the model's positions for translation
    std::int64_t loss_pairs = 0;          // pairs in `loss`
    std::int64_t too_long_for_loss = 0;   // pairs left out of `loss`: a side longer than the model's positions
};

// Translates src_lines, scores them against ref_lines (same count, else std::invalid_argument naming both
// counts) and measures the references' loss. Pairs whose source or reference is empty are skipped; pairs
// with a side longer than the model's positions are translated (cut) but left out of the loss and counted
// in too_long_for_loss. Throws std::runtime_error when no pair is left for the loss.
EvalReport evaluate(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& src_lines,
                    const std::vector<std::string>& ref_lines, const DecodeOptions& options, double label_smoothing,
                    std::int64_t batch_tokens = 4096, const ProgressFn& progress = nullptr);

TF_NAMESPACE_END
