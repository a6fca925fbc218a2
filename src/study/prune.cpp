// Pruning heads (prune.h): masks them step by step in a ranking's order, scoring each step.
#include "tapeformer/study/prune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "tapeformer/autograd.h"
#include "tapeformer/data/text.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/ops.h"
#include "tapeformer/random.h"
#include "provenance_json.h"


TF_NAMESPACE_BEGIN

PruneOrder parse_prune_order(const std::string& name) {
    if (name == "importance") return PruneOrder::importance;
    if (name == "ablation") return PruneOrder::ablation;
    if (name == "entropy") return PruneOrder::entropy;
    if (name == "random") return PruneOrder::random;
    throw std::invalid_argument("pruning order must be importance, ablation, entropy or random, got '" + name + "'");
}

const char* to_string(PruneOrder o) {
    return o == PruneOrder::importance ? "importance" : o == PruneOrder::ablation ? "ablation"
                                                      : o == PruneOrder::entropy  ? "entropy"
                                                                                  : "random";
}

namespace {

bool contains(const std::vector<HeadId>& list, const HeadId& h) { return std::find(list.begin(), list.end(), h) != list.end(); }

}  // namespace

std::vector<PrunePoint> prune_heads(Transformer& model, const TokenizerPair& tokenizers,
                                    const std::vector<std::string>& eval_src, const std::vector<std::string>& eval_ref,
                                    const std::vector<std::string>& rank_src, const std::vector<std::string>& rank_ref,
                                    const PruneOptions& opt,
                                    const std::function<void(const PrunePoint&)>& on_point) {
    if (!(opt.step > 0 && opt.step <= 1)) throw std::invalid_argument("heads prune: --step must be in (0, 100%]");
    if (!(opt.stop_below >= 0 && opt.stop_below <= 1)) throw std::invalid_argument("heads prune: --stop-below must be in [0, 1]");
    std::vector<std::string> src, ref;  // captured by the lambda below: no structured binding (clang < 16)
    std::tie(src, ref) = scorable_pairs(eval_src, eval_ref, "heads prune (evaluation pairs)");
    ParallelText text;
    text.source = src;
    text.target = ref;
    const EncodedCorpus encoded = encode_parallel(text, tokenizers, std::int32_t(model.config.max_len - 1));
    std::vector<std::string> ablation_src, ablation_ref;  // the ranking pairs (all but order random)
    std::vector<Example> rank_examples;
    if (opt.order != PruneOrder::random) {
        std::tie(ablation_src, ablation_ref) = scorable_pairs(rank_src, rank_ref, "heads prune (importance pairs)");
        ParallelText pairs;
        pairs.source = ablation_src;
        pairs.target = ablation_ref;
        rank_examples = encode_parallel(pairs, tokenizers, std::int32_t(model.config.max_len - 1)).examples;
        if (rank_examples.empty()) throw std::invalid_argument("heads prune: no importance pair fits the model's positions");
    }

    const std::vector<HeadKind> kinds = opt.kinds.empty() ? std::vector<HeadKind>(std::begin(kHeadKinds), std::end(kHeadKinds)) : opt.kinds;
    std::vector<HeadId> prunable;
    int attentions = 0;
    for (HeadKind kind : kinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l, ++attentions)
            for (int h = 0; h < heads_of(model.config, kind, l); ++h) prunable.push_back({kind, l, h});
    const std::size_t most = opt.keep_one_per_layer ? prunable.size() - std::size_t(attentions) : prunable.size();
    std::vector<Tensor> saved;
    for (auto& [name, m] : model.attentions()) saved.push_back(m->gate);

    auto evaluate_masked = [&](const std::vector<HeadId>& masked) {
        mask_heads(model, masked);
        PrunePoint p;
        p.masked = masked;
        p.fraction = double(masked.size()) / double(prunable.size());
        p.bleu = corpus_bleu(translate_lines(model, tokenizers, src, opt.decode, opt.batch_tokens), ref).score;
        p.nll = teacher_forced_loss(model, encoded.examples, opt.batch_tokens, 0.0).nll;
        if (on_point) on_point(p);
        return p;
    };
    // The unmasked prunable heads, least important first, with `masked` masked.
    auto rank = [&](const std::vector<HeadId>& masked) {
        std::vector<std::pair<double, HeadId>> scored;  // (score, head): larger = more important
        if (opt.order == PruneOrder::importance || opt.order == PruneOrder::entropy) {
            mask_heads(model, masked);
            const HeadReport r = study_heads(model, rank_examples, opt.study);
            for (const HeadStats& s : r.heads)
                if (contains(prunable, s.id) && !contains(masked, s.id))
                    scored.push_back({opt.order == PruneOrder::importance ? s.importance : -s.entropy_normalised, s.id});
        } else {
            for (std::size_t i = 0; i < prunable.size(); ++i) {
                const HeadId& h = prunable[i];
                if (contains(masked, h)) continue;
                if (opt.order == PruneOrder::random) {
                    scored.push_back({uniform01(opt.seed, i), h});
                } else {  // ablation: the BLEU the rank pairs keep with h masked as well; the higher, the less h matters
                    std::vector<HeadId> with = masked;
                    with.push_back(h);
                    mask_heads(model, with);
                    const double bleu = corpus_bleu(translate_lines(model, tokenizers, ablation_src, opt.decode, opt.batch_tokens),
                                                    ablation_ref).score;
                    scored.push_back({-bleu, h});
                }
            }
        }
        std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        std::vector<HeadId> order;
        for (const auto& [score, h] : scored) order.push_back(h);
        return order;
    };
    auto unmasked_in_layer = [&](const std::vector<HeadId>& masked, const HeadId& h) {
        int n = 0;
        for (int o = 0; o < heads_of(model.config, h.kind, h.layer); ++o) n += !contains(masked, HeadId{h.kind, h.layer, o});
        return n;
    };

    std::vector<PrunePoint> curve{evaluate_masked({})};
    const double floor = opt.stop_below * curve[0].bleu;
    std::vector<HeadId> masked, order;
    for (int step = 1; masked.size() < most; ++step) {
        const std::size_t before = masked.size();
        const std::size_t target =
            std::min(most, std::size_t(std::ceil(double(step) * opt.step * double(prunable.size()) - 1e-9)));
        if (order.empty() || opt.recompute) order = rank(masked);
        for (const HeadId& h : order) {
            if (masked.size() >= target) break;
            if (contains(masked, h) || (opt.keep_one_per_layer && unmasked_in_layer(masked, h) <= 1)) continue;
            masked.push_back(h);
        }
        if (masked.size() == before) {
            if (target > before) break;  // nothing left that may be masked
            continue;                    // with fewer heads than steps, this step rounds to the last one's count
        }
        curve.push_back(evaluate_masked(masked));
        if (curve.back().bleu < floor) break;
    }
    std::size_t i = 0;
    for (auto& [name, m] : model.attentions()) m->gate = saved[i++];
    return curve;
}

HeadRemoval remove_heads(const Transformer& model, const std::vector<HeadId>& heads) {
    const ModelConfig& c = model.config;
    for (const HeadId& h : heads)
        if (h.layer < 0 || h.layer >= layers_of(c, h.kind) || h.head < 0 || h.head >= heads_of(c, h.kind, h.layer))
            throw std::invalid_argument("remove_heads: the model has no head " + h.str());
    // The heads each attention keeps, in their old order; an attention losing all keeps head 0, zeroed.
    HeadRemoval out;
    std::map<std::pair<HeadKind, int>, std::vector<std::int64_t>> kept;
    ModelConfig pruned = c;
    for (HeadKind kind : kHeadKinds) {
        std::vector<std::int64_t>& counts = kind == HeadKind::E ? pruned.enc_self_heads : kind == HeadKind::D ? pruned.dec_self_heads
                                                                                                           : pruned.cross_heads;
        counts.clear();
        for (int l = 0; l < layers_of(c, kind); ++l) {
            std::vector<std::int64_t>& keep = kept[{kind, l}];
            for (int h = 0; h < heads_of(c, kind, l); ++h)
                if (!contains(heads, HeadId{kind, l, h})) keep.push_back(h);
            if (keep.empty()) {
                keep.push_back(0);
                out.zeroed.push_back({kind, l, 0});
            }
            counts.push_back(std::int64_t(keep.size()));
        }
    }
    bool all_full = true;  // nothing removed: the settings keep no counts, as a model that never lost a head
    for (auto& [at, keep] : kept) all_full = all_full && std::int64_t(keep.size()) == c.heads;
    if (all_full) pruned.enc_self_heads.clear(), pruned.dec_self_heads.clear(), pruned.cross_heads.clear();
    out.model = std::make_unique<Transformer>(pruned);
    Transformer& to = *out.model;

    // Everything but the attentions' head-sized weights, by name (their shapes are unchanged).
    const ParamList from_params = model.parameters(), to_params = to.parameters();
    for (std::size_t i = 0; i < to_params.size(); ++i) {
        Tensor dst = to_params[i].tensor;
        const Tensor& src = from_params.at(i).tensor;
        if (from_params[i].name != to_params[i].name) throw std::logic_error("remove_heads: parameter lists differ");
        if (dst.shape() == src.shape()) std::copy(src.data(), src.data() + src.numel(), dst.data());
    }
    // Then each attention's rows of W_q, W_k, W_v and columns of W_o, head by head:
    //   in_proj (3·H·D, C) -> (3·H_l·D, C), in_proj_bias (3·H·D) -> (3·H_l·D), W_o (C, H·D) -> (C, H_l·D), v (H, D) -> (H_l, D)
    for (auto& [at, keep] : kept) {
        const MultiHeadAttention& a = attention_of(model, at.first, at.second);
        MultiHeadAttention& b = attention_of(to, at.first, at.second);
        const std::int64_t C = a.C, D = a.D, HD_a = a.H * D, HD_b = b.H * D;
        const bool zero = contains(out.zeroed, HeadId{at.first, at.second, 0});  // every head listed
        for (std::size_t j = 0; j < keep.size(); ++j) {
            const std::int64_t h = keep[j];
            for (std::int64_t part = 0; part < 3; ++part) {  // W_q, W_k, W_v
                const std::int64_t from_row = part * HD_a + h * D, to_row = part * HD_b + std::int64_t(j) * D;
                std::copy(a.in_proj_weight.data() + from_row * C, a.in_proj_weight.data() + (from_row + D) * C,
                          b.in_proj_weight.data() + to_row * C);
                std::copy(a.in_proj_bias.data() + from_row, a.in_proj_bias.data() + from_row + D, b.in_proj_bias.data() + to_row);
            }
            // W_o's columns of head h, row r's [h·D, (h + 1)·D), times the head's gate: W_o (ξ_h c_h) = (ξ_h W_o) c_h
            const real xi = zero ? real(0) : a.gate.defined() ? a.gate.data()[h] : real(1);
            for (std::int64_t r = 0; r < C; ++r)
                for (std::int64_t d = 0; d < D; ++d)
                    b.out_proj.weight.data()[r * HD_b + std::int64_t(j) * D + d] = xi * a.out_proj.weight.data()[r * HD_a + h * D + d];
            if (a.score_v.defined())
                std::copy(a.score_v.data() + h * D, a.score_v.data() + (h + 1) * D, b.score_v.data() + std::int64_t(j) * D);
        }
    }
    return out;
}

std::string pruning_json(const StudyProvenance& made_from, const PruneRecord& r, const HeadRemoval& removal) {
    auto ids = [](const std::vector<HeadId>& heads) {
        nlohmann::json list = nlohmann::json::array();
        for (const HeadId& h : heads) list.push_back(h.str());
        return list;
    };
    const nlohmann::json j = {{"made_from", provenance_json(made_from)},
                              {"method", r.method},
                              {"fraction", r.fraction},
                              {"removed", ids(r.removed)},
                              {"kept_zeroed", ids(removal.zeroed)},
                              {"head_counts", removal.model->config.head_counts_text()},
                              {"parameters_before", r.parameters_before},
                              {"parameters_after", r.parameters_after},
                              {"bleu", r.bleu},
                              {"nll_masked", r.nll_masked},
                              {"nll_removed", r.nll_removed}};
    return j.dump(1) + "\n";
}

TF_NAMESPACE_END
