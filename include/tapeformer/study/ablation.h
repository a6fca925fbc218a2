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

struct AblationRow {
    std::string what;             // "E:0:1" (that head masked) or "E:0: all but 1" (the others of its layer)
    std::vector<HeadId> masked;
    double bleu = 0, delta = 0;   // BLEU with these heads masked, and minus the unmasked BLEU
    double p_value = 1;
    bool significant = false;     // p < alpha
};

struct AblationReport {
    double base_bleu = 0;
    int samples = 0;
    double alpha = 0.05;
    std::vector<AblationRow> single;       // each head masked alone (Michel et al., table 1)
    std::vector<AblationRow> all_but_one;  // every head of its layer but one masked (Michel et al., table 2)
    int significant_single = 0, significant_all_but_one = 0;
};

// Translates `src_lines` with the unmasked model and with each ablation, scoring each against `ref_lines`
// (same count; empty pairs skipped). The model's gates are restored afterwards. `progress` gets (systems
// done, systems in all).
AblationReport ablate_heads(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& src_lines,
                            const std::vector<std::string>& ref_lines, const DecodeOptions& decode,
                            std::int64_t batch_tokens, int samples, double alpha, std::uint64_t seed,
                            const std::function<void(int, int)>& progress = nullptr);

std::string ablation_json(const AblationReport& report);
std::string ablation_table(const AblationReport& report);  // the two tables and "k of N heads significant"

TF_NAMESPACE_END
