// Ablation: what each head is worth to translation quality — BLEU with a head (or all but one head of its
// layer) masked, and whether the difference is significant (paired bootstrap resampling).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/decode.h"
#include "tapeformer/metrics/bleu.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/study/head_ids.h"

TF_NAMESPACE_BEGIN

// The line pairs with both sides non-empty, trimmed. Throws std::invalid_argument starting with `what` when
// the counts differ or no pair is left.
std::pair<std::vector<std::string>, std::vector<std::string>> scorable_pairs(const std::vector<std::string>& src,
                                                                             const std::vector<std::string>& ref,
                                                                             const char* what);

// sacreBLEU's paired bootstrap resampling (`--paired-bs`, Koehn 2004): `samples` resamples of the sentences
// with replacement, the same for both systems; p = (1 + #{resamples whose |BLEU_sys − BLEU_base| minus the
// mean of those differences exceeds the real |difference|}) / (samples + 1). `base` and `system` are
// per-sentence BLEU statistics (corpus_bleu of one line each). The resamples are drawn from tapeformer's
// counter-based generator with `seed`, so p-values equal sacreBLEU's in distribution, not digit for digit.
// Two systems with the same corpus BLEU get p = 1.
double paired_bootstrap_p_value(const std::vector<BleuScore>& base, const std::vector<BleuScore>& system, int samples,
                                std::uint64_t seed);

// What one system scores on each sentence: its BLEU statistics and, where the pair fits the model's
// positions, the reference's NLL (an ExampleNll with tokens 0 for a pair left out of the loss).
struct SentenceScores {
    std::vector<BleuScore> bleu;
    std::vector<ExampleNll> nll;  // empty: no NLL measured
};

struct Interval {
    double low = 0, high = 0;
};

// A system against the base on the same sentences, from one set of paired resamples: the p-value of
// paired_bootstrap_p_value (same seed: the same resamples and the same number) and percentile bootstrap
// intervals (Efron & Tibshirani 1993, ch. 13) at `confidence` of ΔBLEU = BLEU_sys − BLEU_base and of
// ΔNLL = NLL_sys − NLL_base, each resample's mean NLL per reference token in nats (0 when `nll` is empty).
struct PairedComparison {
    double p_value = 1;
    Interval delta_bleu, delta_nll;
};
PairedComparison paired_bootstrap(const SentenceScores& base, const SentenceScores& system, int samples,
                                  double confidence, std::uint64_t seed);

// Multiple-testing corrections of one family of p-values, returned in the input's order (as R's
// p.adjust). Holm (1979), controlling the family-wise error rate: with p sorted ascending,
// p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j)). Benjamini & Hochberg (1995), controlling the false
// discovery rate: p̃_(i) = min_{j ≥ i} min(1, m p_(j) / j). A test is significant when p̃ < α.
std::vector<double> holm_adjusted(const std::vector<double>& p);
std::vector<double> benjamini_hochberg_adjusted(const std::vector<double>& p);

struct AblationRow {
    std::string what;               // "E:0:1" (that head masked) or "E:0: all but 1" (the others of its layer)
    std::vector<HeadId> masked;
    double bleu = 0, delta = 0;     // BLEU with these heads masked, and minus the unmasked BLEU
    double nll = 0, delta_nll = 0;  // mean NLL per reference token (nats), and minus the unmasked NLL
    PairedComparison test;          // p-value, and the intervals of delta and delta_nll
    double p_holm = 1, p_bh = 1;    // test.p_value adjusted over the report's whole family (both tables)
    bool significant = false;       // test.p_value < alpha, uncorrected
    bool significant_holm = false, significant_bh = false;  // p_holm < alpha, p_bh < alpha
};

struct AblationReport {
    double base_bleu = 0, base_nll = 0;
    int samples = 0;
    double alpha = 0.05;     // the significance level; the intervals are at confidence 1 − alpha
    std::uint64_t seed = 0;  // of the resamples
    std::int64_t sentences = 0, nll_sentences = 0, nll_tokens = 0;  // pairs scored; of them, in the NLL; its tokens
    std::vector<AblationRow> single;       // each head masked alone (Michel et al., table 1)
    std::vector<AblationRow> all_but_one;  // every head of its layer but one masked (Michel et al., table 2)
    // Per table: uncorrected, Holm, Benjamini–Hochberg. The family corrected for is both tables together,
    // every test this report makes.
    int significant_single = 0, significant_all_but_one = 0;
    int holm_single = 0, holm_all_but_one = 0, bh_single = 0, bh_all_but_one = 0;
};

// Translates `src_lines` with the unmasked model and with each ablation, scoring each against `ref_lines`
// (same count; empty pairs skipped), and measures each system's teacher-forced NLL of the references (pairs
// longer than the model's positions are translated, cut, but left out of the NLL). The model's gates are
// restored afterwards. `progress` gets (systems done, systems in all).
AblationReport ablate_heads(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& src_lines,
                            const std::vector<std::string>& ref_lines, const DecodeOptions& decode,
                            std::int64_t batch_tokens, int samples, double alpha, std::uint64_t seed,
                            const std::function<void(int, int)>& progress = nullptr);

std::string ablation_json(const AblationReport& report);
std::string ablation_table(const AblationReport& report);  // the two tables and "k of N heads significant"

TF_NAMESPACE_END
