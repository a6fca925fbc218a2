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
            for (int h = 0; h < model.config.heads; ++h) prunable.push_back({kind, l, h});
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
        for (int o = 0; o < model.config.heads; ++o) n += !contains(masked, HeadId{h.kind, h.layer, o});
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

TF_NAMESPACE_END
