// Ablation of heads (ablation.h): BLEU with heads masked, and paired bootstrap resampling.
#include "tapeformer/study/ablation.h"

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
#include "tapeformer/study/heads.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/ops.h"
#include "tapeformer/random.h"


TF_NAMESPACE_BEGIN

namespace {

BleuScore sum_stats(const std::vector<BleuScore>& sentences, const std::vector<std::int64_t>& pick) {
    std::array<std::int64_t, 4> counts{}, totals{};
    std::int64_t sys_len = 0, ref_len = 0;
    for (std::int64_t i : pick) {
        const BleuScore& s = sentences[std::size_t(i)];
        for (int n = 0; n < 4; ++n) {
            counts[n] += s.counts[n];
            totals[n] += s.totals[n];
        }
        sys_len += s.sys_len;
        ref_len += s.ref_len;
    }
    return bleu_from_stats(counts, totals, sys_len, ref_len);
}

std::vector<BleuScore> sentence_stats(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
    std::vector<BleuScore> out;
    out.reserve(hyps.size());
    for (std::size_t i = 0; i < hyps.size(); ++i) out.push_back(corpus_bleu({hyps[i]}, {refs[i]}));
    return out;
}

}  // namespace

std::pair<std::vector<std::string>, std::vector<std::string>> scorable_pairs(const std::vector<std::string>& src,
                                                                             const std::vector<std::string>& ref,
                                                                             const char* what) {
    if (src.size() != ref.size())
        throw std::invalid_argument(std::string(what) + ": " + std::to_string(src.size()) + " source lines but " +
                                    std::to_string(ref.size()) + " reference lines");
    std::pair<std::vector<std::string>, std::vector<std::string>> out;
    for (std::size_t i = 0; i < src.size(); ++i)
        if (!trim(src[i]).empty() && !trim(ref[i]).empty()) {
            out.first.emplace_back(trim(src[i]));
            out.second.emplace_back(trim(ref[i]));
        }
    if (out.first.empty()) throw std::invalid_argument(std::string(what) + ": no line pair with both sides non-empty");
    return out;
}

double paired_bootstrap_p_value(const std::vector<BleuScore>& base, const std::vector<BleuScore>& system, int samples,
                                std::uint64_t seed) {
    if (base.size() != system.size() || base.empty())
        throw std::invalid_argument("paired bootstrap: both systems need statistics for the same, non-empty sentences");
    if (samples < 1) throw std::invalid_argument("paired bootstrap: --samples must be >= 1");
    std::vector<std::int64_t> all(base.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::int64_t(i);
    const double real_diff = std::fabs(sum_stats(system, all).score - sum_stats(base, all).score);
    if (real_diff == 0) return 1.0;  // no difference is no evidence (sacreBLEU's formula would give 1/(samples+1))
    Rng rng(seed);
    std::vector<double> diffs(static_cast<std::size_t>(samples));
    std::vector<std::int64_t> pick(base.size());
    for (double& d : diffs) {
        for (auto& i : pick) i = std::int64_t(rng.below(base.size()));
        d = std::fabs(sum_stats(system, pick).score - sum_stats(base, pick).score);
    }
    double mean = 0;
    for (double d : diffs) mean += d / double(samples);
    std::int64_t exceed = 0;
    for (double d : diffs) exceed += (d - mean > real_diff) ? 1 : 0;
    return double(exceed + 1) / double(samples + 1);
}

AblationReport ablate_heads(Transformer& model, const TokenizerPair& tokenizers, const std::vector<std::string>& src_lines,
                            const std::vector<std::string>& ref_lines, const DecodeOptions& decode,
                            std::int64_t batch_tokens, int samples, double alpha, std::uint64_t seed,
                            const std::function<void(int, int)>& progress) {
    // Not a structured binding: lambdas below capture src and ref, which clang accepts only from version 16.
    std::vector<std::string> src, ref;
    std::tie(src, ref) = scorable_pairs(src_lines, ref_lines, "heads ablate");
    std::vector<Tensor> saved;  // the model's gates, restored at the end
    for (auto& [name, m] : model.attentions()) saved.push_back(m->gate);

    std::vector<AblationRow> single, others;
    for (HeadKind kind : kHeadKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l)
            for (int h = 0; h < model.config.heads; ++h) {
                AblationRow one;
                one.what = HeadId{kind, l, h}.str();
                one.masked = {HeadId{kind, l, h}};
                single.push_back(one);
                AblationRow rest;
                rest.what = std::string(1, to_char(kind)) + ":" + std::to_string(l) + ": all but " + std::to_string(h);
                for (int o = 0; o < model.config.heads; ++o)
                    if (o != h) rest.masked.push_back(HeadId{kind, l, o});
                others.push_back(rest);
            }
    const int systems = int(1 + single.size() + others.size());
    int done = 0;
    auto score = [&](const std::vector<HeadId>& masked) {
        mask_heads(model, masked);
        const auto hyps = translate_lines(model, tokenizers, src, decode, batch_tokens);
        if (progress) progress(++done, systems);
        return sentence_stats(hyps, ref);
    };
    AblationReport report;
    report.samples = samples;
    report.alpha = alpha;
    std::vector<std::int64_t> all(src.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::int64_t(i);
    const std::vector<BleuScore> base = score({});
    report.base_bleu = sum_stats(base, all).score;
    for (auto* rows : {&single, &others})
        for (AblationRow& row : *rows) {
            const std::vector<BleuScore> sys = score(row.masked);
            row.bleu = sum_stats(sys, all).score;
            row.delta = row.bleu - report.base_bleu;
            row.p_value = paired_bootstrap_p_value(base, sys, samples, seed);
            row.significant = row.p_value < alpha;
        }
    std::size_t i = 0;
    for (auto& [name, m] : model.attentions()) m->gate = saved[i++];
    report.single = std::move(single);
    report.all_but_one = std::move(others);
    for (const auto& r : report.single) report.significant_single += r.significant;
    for (const auto& r : report.all_but_one) report.significant_all_but_one += r.significant;
    return report;
}

std::string ablation_json(const AblationReport& r) {
    auto rows = [](const std::vector<AblationRow>& list) {
        nlohmann::json out = nlohmann::json::array();
        for (const AblationRow& row : list) {
            nlohmann::json masked = nlohmann::json::array();
            for (const HeadId& h : row.masked) masked.push_back(h.str());
            out.push_back({{"ablation", row.what}, {"masked", masked}, {"bleu", row.bleu}, {"delta", row.delta},
                           {"p_value", row.p_value}, {"significant", row.significant}});
        }
        return out;
    };
    const nlohmann::json j = {{"base_bleu", r.base_bleu}, {"samples", r.samples}, {"alpha", r.alpha},
                              {"test", "paired bootstrap resampling (sacreBLEU --paired-bs)"},
                              {"single", rows(r.single)}, {"all_but_one", rows(r.all_but_one)},
                              {"significant_single", r.significant_single},
                              {"significant_all_but_one", r.significant_all_but_one}};
    return j.dump(1) + "\n";
}

std::string ablation_table(const AblationReport& r) {
    std::ostringstream o;
    char line[160];
    std::snprintf(line, sizeof line, "unmasked BLEU %.2f; paired bootstrap, %d resamples, significant at p < %.3g\n\n",
                  r.base_bleu, r.samples, r.alpha);
    o << line;
    for (const auto* rows : {&r.single, &r.all_but_one}) {
        o << (rows == &r.single ? "one head masked" : "all heads of the layer but one masked") << "\n";
        std::snprintf(line, sizeof line, "  %-20s %8s %8s %9s\n", "ablation", "BLEU", "delta", "p");
        o << line;
        for (const AblationRow& row : *rows) {
            std::snprintf(line, sizeof line, "  %-20s %8.2f %+8.2f %9.4f%s\n", row.what.c_str(), row.bleu, row.delta,
                          row.p_value, row.significant ? "  *" : "");
            o << line;
        }
        const int k = rows == &r.single ? r.significant_single : r.significant_all_but_one;
        o << "  " << k << " of " << rows->size() << " significant\n\n";
    }
    return o.str();
}

TF_NAMESPACE_END
