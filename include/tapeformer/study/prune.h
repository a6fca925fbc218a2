// Pruning: quality against the fraction of heads masked, in the order a ranking gives (Michel et al. 2019,
// figure 3).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/study/ablation.h"
#include "tapeformer/study/heads.h"
#include "tapeformer/study/provenance.h"

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

// A model with heads physically removed, as Michel et al. (2019) measure its speed: for each listed head
// of `model` (its own indices), the D rows of W_q, W_k, W_v (and their biases) and the D columns of W_o go,
// so each attention keeps H_l heads, in_proj (3·H_l·D, C) and W_o (C, H_l·D); the model's settings record
// the counts (ModelConfig::enc_self_heads, ...: the weights file's head_counts). Every other weight is
// copied, and a kept head's gate ξ_h (1 unless set: L0's evaluation gates) is folded into its W_o columns.
// Its output equals `model`'s with those heads masked (gate 0), to rounding: the masked heads' terms are
// gone from W_o's sums instead of multiplied by 0. An attention whose every head is listed keeps
// its first head with W_o's columns zeroed (its output is then W_o's bias, as masked): a model's
// attentions keep at least one head. The heads are renumbered 0..H_l − 1 in their old order.
struct HeadRemoval {
    std::unique_ptr<Transformer> model;
    std::vector<HeadId> zeroed;  // the heads kept, with W_o's columns zero, in attentions whose every head was listed
};
HeadRemoval remove_heads(const Transformer& model, const std::vector<HeadId>& heads);

// What heads prune --save writes beside the smaller model, DIR/pruning.json: the model it came from
// (made_from: path, weights file, checksum), the method, the heads removed in the source's numbering, the
// heads kept zeroed, the head counts, and the evaluation pairs' BLEU and NLL of the masked source model and
// the NLL of the model with the heads removed.
struct PruneRecord {
    std::string method;            // "mask (order importance)", "l0"
    std::vector<HeadId> removed;
    double fraction = 0, bleu = 0, nll_masked = 0, nll_removed = 0;
    std::int64_t parameters_before = 0, parameters_after = 0;
};
std::string pruning_json(const StudyProvenance& made_from, const PruneRecord& record, const HeadRemoval& removal);

TF_NAMESPACE_END
