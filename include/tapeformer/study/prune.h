// Pruning: quality against the fraction of heads masked, in the order a ranking gives (Michel et al. 2019,
// figure 3).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tapeformer/study/ablation.h"
#include "tapeformer/study/heads.h"

TF_NAMESPACE_BEGIN

enum class PruneOrder { importance, ablation, entropy, random };
PruneOrder parse_prune_order(const std::string& name);  // throws, listing the valid names
const char* to_string(PruneOrder order);

struct PruneOptions {
    PruneOrder order = PruneOrder::importance;
    double step = 0.1;                 // fraction of the prunable heads masked per step
    std::vector<HeadKind> kinds;       // the heads that may be pruned (empty: E, D and A, ranked jointly)
    bool recompute = false;            // rank again (with the heads masked so far) after every step
    bool keep_one_per_layer = false;   // never mask the last unmasked head of an attention
    double stop_below = 0;             // stop once BLEU < stop_below · the unpruned BLEU (0: go to the end)
    std::uint64_t seed = 1;            // order random
    HeadStudyOptions study;            // how importance is measured (order importance and entropy)
    DecodeOptions decode;
    std::int64_t batch_tokens = 4096;  // for translation and the NLL
};

struct PrunePoint {
    double fraction = 0;           // masked / prunable heads
    std::vector<HeadId> masked;    // in the order they were masked
    double bleu = 0, nll = 0;      // on the evaluation pairs (NLL: mean per target token, teacher-forced)
};

// Ranks the heads on the importance pairs rank_src/rank_ref (not read by order random),
// least important first — importance: normalised importance; ablation: the BLEU lost when that head alone
// is masked; entropy: the highest normalised attention entropy first; random: a seeded shuffle — and
// masks them in steps, scoring BLEU and NLL on the evaluation pairs after each step. The first point is
// the unpruned model. The model's gates are restored afterwards.
std::vector<PrunePoint> prune_heads(Transformer& model, const TokenizerPair& tokenizers,
                                    const std::vector<std::string>& eval_src, const std::vector<std::string>& eval_ref,
                                    const std::vector<std::string>& rank_src, const std::vector<std::string>& rank_ref,
                                    const PruneOptions& options,
                                    const std::function<void(const PrunePoint&)>& on_point = nullptr);

TF_NAMESPACE_END
