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

// The percentile interval of `values` at `confidence`: the (1 − c)/2 and (1 + c)/2 quantiles, each
// interpolated between the two nearest order statistics (R's quantile type 7).
Interval percentile_interval(std::vector<double> values, double confidence) {
    std::sort(values.begin(), values.end());
    auto quantile = [&](double q) {
        const double at = q * double(values.size() - 1);
        const std::size_t below = std::size_t(std::floor(at));
        const std::size_t above = std::min(below + 1, values.size() - 1);
        return values[below] + (at - double(below)) * (values[above] - values[below]);
    };
    return {quantile((1 - confidence) / 2), quantile((1 + confidence) / 2)};
}

// Indices of p in ascending order of their values (ties in index order).
std::vector<std::size_t> ascending_order(const std::vector<double>& p) {
    std::vector<std::size_t> order(p.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p[a] < p[b]; });
    return order;
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
    return paired_bootstrap(SentenceScores{base, {}}, SentenceScores{system, {}}, samples, 0.95, seed).p_value;
}

PairedComparison paired_bootstrap(const SentenceScores& base, const SentenceScores& system, int samples,
                                  double confidence, std::uint64_t seed) {
    const std::size_t n = base.bleu.size();
    if (system.bleu.size() != n || n == 0 || base.nll.size() != system.nll.size() ||
        (!base.nll.empty() && base.nll.size() != n))
        throw std::invalid_argument("paired bootstrap: both systems need statistics for the same, non-empty sentences");
    if (samples < 1) throw std::invalid_argument("paired bootstrap: --samples must be >= 1");
    if (!(confidence > 0 && confidence < 1)) throw std::invalid_argument("paired bootstrap: confidence must lie in (0, 1)");
    const bool with_nll = !base.nll.empty();
    // ΔBLEU and ΔNLL of the sentences in `pick` (with repeats).
    auto delta_bleu = [&](const std::vector<std::int64_t>& pick) {
        return sum_stats(system.bleu, pick).score - sum_stats(base.bleu, pick).score;
    };
    auto delta_nll = [&](const std::vector<std::int64_t>& pick) {
        double sys = 0, ref = 0;
        std::int64_t tokens = 0;
        for (std::int64_t i : pick) {
            sys += system.nll[std::size_t(i)].nll_sum;
            ref += base.nll[std::size_t(i)].nll_sum;
            tokens += base.nll[std::size_t(i)].tokens;
        }
        return tokens ? (sys - ref) / double(tokens) : 0.0;
    };
    std::vector<std::int64_t> pick(n);
    for (std::size_t i = 0; i < n; ++i) pick[i] = std::int64_t(i);
    const double real_diff = std::fabs(delta_bleu(pick));
    Rng rng(seed);
    std::vector<double> bleu_diffs(std::size_t(samples), 0.0), nll_diffs(std::size_t(samples), 0.0);
    for (int k = 0; k < samples; ++k) {
        for (auto& i : pick) i = std::int64_t(rng.below(n));
        bleu_diffs[std::size_t(k)] = delta_bleu(pick);
        if (with_nll) nll_diffs[std::size_t(k)] = delta_nll(pick);
    }
    PairedComparison out;
    // p: how often a resample's |Δ|, centred on the resamples' mean |Δ|, exceeds the real |Δ|.
    if (real_diff != 0) {  // no difference is no evidence (sacreBLEU's formula would give 1/(samples+1))
        double mean = 0;
        for (double d : bleu_diffs) mean += std::fabs(d) / double(samples);
        std::int64_t exceed = 0;
        for (double d : bleu_diffs) exceed += (std::fabs(d) - mean > real_diff) ? 1 : 0;
        out.p_value = double(exceed + 1) / double(samples + 1);
    }
    out.delta_bleu = percentile_interval(bleu_diffs, confidence);
    if (with_nll) out.delta_nll = percentile_interval(nll_diffs, confidence);
    return out;
}

std::vector<double> holm_adjusted(const std::vector<double>& p) {
    const std::size_t m = p.size();
    std::vector<std::size_t> order = ascending_order(p);
    std::vector<double> out(m);
    double running = 0;  // max over j <= i keeps the adjusted values in the order of the raw ones
    for (std::size_t r = 0; r < m; ++r) {
        running = std::max(running, std::min(1.0, double(m - r) * p[order[r]]));
        out[order[r]] = running;
    }
    return out;
}

std::vector<double> benjamini_hochberg_adjusted(const std::vector<double>& p) {
    const std::size_t m = p.size();
    std::vector<std::size_t> order = ascending_order(p);
    std::vector<double> out(m);
    double running = 1;  // min over j >= i, walking down from the largest p
    for (std::size_t r = m; r-- > 0;) {
        running = std::min(running, std::min(1.0, double(m) * p[order[r]] / double(r + 1)));
        out[order[r]] = running;
    }
    return out;
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
            for (int h = 0, H = heads_of(model.config, kind, l); h < H; ++h) {
                AblationRow one;
                one.what = HeadId{kind, l, h}.str();
                one.masked = {HeadId{kind, l, h}};
                single.push_back(one);
                AblationRow rest;
                rest.what = std::string(1, to_char(kind)) + ":" + std::to_string(l) + ": all but " + std::to_string(h);
                for (int o = 0; o < H; ++o)
                    if (o != h) rest.masked.push_back(HeadId{kind, l, o});
                others.push_back(rest);
            }
    // The references' NLL is measured on the pairs that fit the model's positions (tokens + EOS, BOS + tokens).
    const std::size_t positions = static_cast<std::size_t>(model.config.max_len - 1);
    std::vector<Example> examples;
    std::vector<std::size_t> sentence_of;  // examples[e] is the pair src[sentence_of[e]], ref[...]
    for (std::size_t i = 0; i < src.size(); ++i) {
        Example e{tokenizers.source->encode(src[i]), tokenizers.target->encode(ref[i])};
        if (e.src.size() > positions || e.tgt.size() > positions) continue;
        examples.push_back(std::move(e));
        sentence_of.push_back(i);
    }
    const int systems = int(1 + single.size() + others.size());
    int done = 0;
    auto score = [&](const std::vector<HeadId>& masked) {
        mask_heads(model, masked);
        SentenceScores out;
        out.bleu = sentence_stats(translate_lines(model, tokenizers, src, decode, batch_tokens), ref);
        out.nll.assign(src.size(), ExampleNll{});
        const std::vector<ExampleNll> nll = per_example_nll(model, examples, batch_tokens);
        for (std::size_t e = 0; e < nll.size(); ++e) out.nll[sentence_of[e]] = nll[e];
        if (progress) progress(++done, systems);
        return out;
    };
    AblationReport report;
    report.samples = samples;
    report.alpha = alpha;
    report.seed = seed;
    report.sentences = std::int64_t(src.size());
    report.nll_sentences = std::int64_t(examples.size());
    std::vector<std::int64_t> all(src.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::int64_t(i);
    auto mean_nll = [](const SentenceScores& s) {
        double sum = 0;
        std::int64_t tokens = 0;
        for (const ExampleNll& e : s.nll) {
            sum += e.nll_sum;
            tokens += e.tokens;
        }
        return std::make_pair(tokens ? sum / double(tokens) : 0.0, tokens);
    };
    const SentenceScores base = score({});
    report.base_bleu = sum_stats(base.bleu, all).score;
    std::tie(report.base_nll, report.nll_tokens) = mean_nll(base);
    std::vector<AblationRow*> family;  // every test of the report, both tables: what the corrections count
    for (auto* rows : {&single, &others})
        for (AblationRow& row : *rows) {
            const SentenceScores sys = score(row.masked);
            row.bleu = sum_stats(sys.bleu, all).score;
            row.delta = row.bleu - report.base_bleu;
            row.nll = mean_nll(sys).first;
            row.delta_nll = row.nll - report.base_nll;
            row.test = paired_bootstrap(base, sys, samples, 1 - alpha, seed);
            row.significant = row.test.p_value < alpha;
            family.push_back(&row);
        }
    std::size_t i = 0;
    for (auto& [name, m] : model.attentions()) m->gate = saved[i++];
    std::vector<double> p;
    for (const AblationRow* row : family) p.push_back(row->test.p_value);
    const std::vector<double> holm = holm_adjusted(p), bh = benjamini_hochberg_adjusted(p);
    for (std::size_t k = 0; k < family.size(); ++k) {
        family[k]->p_holm = holm[k];
        family[k]->p_bh = bh[k];
        family[k]->significant_holm = holm[k] < alpha;
        family[k]->significant_bh = bh[k] < alpha;
    }
    report.single = std::move(single);
    report.all_but_one = std::move(others);
    for (const auto& r : report.single) {
        report.significant_single += r.significant;
        report.holm_single += r.significant_holm;
        report.bh_single += r.significant_bh;
    }
    for (const auto& r : report.all_but_one) {
        report.significant_all_but_one += r.significant;
        report.holm_all_but_one += r.significant_holm;
        report.bh_all_but_one += r.significant_bh;
    }
    return report;
}

std::string ablation_json(const AblationReport& r) {
    auto interval = [](const Interval& i) { return nlohmann::json::array({i.low, i.high}); };
    auto rows = [&](const std::vector<AblationRow>& list) {
        nlohmann::json out = nlohmann::json::array();
        for (const AblationRow& row : list) {
            nlohmann::json masked = nlohmann::json::array();
            for (const HeadId& h : row.masked) masked.push_back(h.str());
            out.push_back({{"ablation", row.what}, {"masked", masked}, {"bleu", row.bleu}, {"delta", row.delta},
                           {"delta_ci", interval(row.test.delta_bleu)}, {"nll", row.nll},
                           {"delta_nll", row.delta_nll}, {"delta_nll_ci", interval(row.test.delta_nll)},
                           {"p_value", row.test.p_value}, {"p_holm", row.p_holm}, {"p_bh", row.p_bh},
                           {"significant", row.significant}, {"significant_holm", row.significant_holm},
                           {"significant_bh", row.significant_bh}});
        }
        return out;
    };
    const nlohmann::json j = {
        {"base_bleu", r.base_bleu}, {"base_nll", r.base_nll}, {"samples", r.samples}, {"seed", r.seed},
        {"alpha", r.alpha}, {"confidence", 1 - r.alpha}, {"sentences", r.sentences},
        {"nll_sentences", r.nll_sentences}, {"nll_tokens", r.nll_tokens},
        {"test", "paired bootstrap resampling (sacreBLEU --paired-bs); intervals: percentile bootstrap of the same "
                 "resamples; p_holm, p_bh: Holm and Benjamini-Hochberg adjusted over all tests of both tables"},
        {"family_size", r.single.size() + r.all_but_one.size()},
        {"single", rows(r.single)}, {"all_but_one", rows(r.all_but_one)},
        {"significant_single", r.significant_single}, {"significant_all_but_one", r.significant_all_but_one},
        {"significant_holm_single", r.holm_single}, {"significant_holm_all_but_one", r.holm_all_but_one},
        {"significant_bh_single", r.bh_single}, {"significant_bh_all_but_one", r.bh_all_but_one}};
    return j.dump(1) + "\n";
}

std::string ablation_table(const AblationReport& r) {
    std::ostringstream o;
    char line[256];
    const double level = 100 * (1 - r.alpha);
    std::snprintf(line, sizeof line,
                  "unmasked BLEU %.2f, NLL %.4f nats/token (%lld of %lld pairs fit for NLL); paired bootstrap, %d "
                  "resamples, seed %llu\n"
                  "significant at p < %.3g: * uncorrected, H after Holm, B after Benjamini-Hochberg (over all %zu "
                  "tests); intervals at %.4g%%\n\n",
                  r.base_bleu, r.base_nll, static_cast<long long>(r.nll_sentences),
                  static_cast<long long>(r.sentences), r.samples, static_cast<unsigned long long>(r.seed), r.alpha,
                  r.single.size() + r.all_but_one.size(), level);
    o << line;
    for (const auto* rows : {&r.single, &r.all_but_one}) {
        o << (rows == &r.single ? "one head masked" : "all heads of the layer but one masked") << "\n";
        std::snprintf(line, sizeof line, "  %-18s %7s %7s %17s %8s %19s %8s %8s %8s\n", "ablation", "BLEU", "delta",
                      "delta interval", "dNLL", "dNLL interval", "p", "p Holm", "p BH");
        o << line;
        for (const AblationRow& row : *rows) {
            std::snprintf(line, sizeof line,
                          "  %-18s %7.2f %+7.2f [%+6.2f, %+6.2f] %+8.4f [%+7.4f, %+7.4f] %8.4f %8.4f %8.4f  %s%s%s\n",
                          row.what.c_str(), row.bleu, row.delta, row.test.delta_bleu.low, row.test.delta_bleu.high,
                          row.delta_nll, row.test.delta_nll.low, row.test.delta_nll.high, row.test.p_value,
                          row.p_holm, row.p_bh, row.significant ? "*" : " ", row.significant_holm ? "H" : " ",
                          row.significant_bh ? "B" : " ");
            o << line;
        }
        const bool first = rows == &r.single;
        o << "  significant: " << (first ? r.significant_single : r.significant_all_but_one) << " of "
          << rows->size() << " uncorrected, " << (first ? r.holm_single : r.holm_all_but_one) << " after Holm, "
          << (first ? r.bh_single : r.bh_all_but_one) << " after Benjamini-Hochberg\n\n";
    }
    return o.str();
}

TF_NAMESPACE_END
