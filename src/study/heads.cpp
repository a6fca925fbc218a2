// study_heads(): one teacher-forced pass with gradients per batch, in file order. Each attention gets a gate
// tensor ξ (B, H, Tq, 1) of ones (or zeros for masked heads) that requires grad; after backward its
// gradient holds ⟨o_{b,h,t}, ∂L/∂o_{b,h,t}⟩ for every head and query, and the attention weights the
// pass's probes show (AttentionProbes) give the statistics. Parameter gradients accumulate over all batches: they are of the loss summed
// over every target token of the data.
#include "tapeformer/study/heads.h"

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

char to_char(HeadKind kind) { return kind == HeadKind::E ? 'E' : kind == HeadKind::D ? 'D' : 'A'; }

const char* describe(HeadKind kind) {
    return kind == HeadKind::E ? "encoder self-attention"
           : kind == HeadKind::D ? "decoder self-attention"
                                 : "encoder-decoder (cross) attention";
}

std::string HeadId::str() const { return std::string(1, to_char(kind)) + ":" + std::to_string(layer) + ":" + std::to_string(head); }

namespace {

int layers_of(const ModelConfig& c, HeadKind kind) { return int(kind == HeadKind::E ? c.enc_layers : c.dec_layers); }

const HeadKind kKinds[] = {HeadKind::E, HeadKind::D, HeadKind::A};

int parse_index(const std::string& item, const std::string& text, const char* what) {
    std::size_t used = 0;
    int value = -1;
    try {
        value = std::stoi(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used == 0 || used != text.size() || value < 0)
        throw std::invalid_argument("head '" + item + "': the " + what + " must be a number >= 0, got '" + text + "'");
    return value;
}

HeadKind parse_kind(const std::string& kind, const std::string& where) {
    if (kind == "E") return HeadKind::E;
    if (kind == "D") return HeadKind::D;
    if (kind == "A") return HeadKind::A;
    throw std::invalid_argument(where + ": the kind must be E (encoder self-attention), D (decoder self-attention) " +
                                "or A (cross-attention), got '" + kind + "'");
}

}  // namespace

std::vector<HeadKind> parse_head_kinds(const std::string& spec) {
    std::vector<HeadKind> kinds;
    std::stringstream items(spec);
    for (std::string item; std::getline(items, item, ',');) {
        const HeadKind k = parse_kind(item, "kinds '" + spec + "'");
        if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
    }
    if (kinds.empty()) throw std::invalid_argument("kinds '" + spec + "' names none of E, D, A");
    return kinds;
}

std::vector<HeadId> parse_head_list(const std::string& spec, const ModelConfig& config) {
    std::vector<HeadId> heads;
    std::stringstream items(spec);
    std::string item;
    while (std::getline(items, item, ',')) {
        if (item.empty()) throw std::invalid_argument("head list '" + spec + "': an empty item (expected KIND:layer:head, e.g. E:0:1)");
        const std::size_t a = item.find(':'), b = a == std::string::npos ? a : item.find(':', a + 1);
        if (b == std::string::npos || item.find(':', b + 1) != std::string::npos)
            throw std::invalid_argument("head '" + item + "': expected KIND:layer:head, e.g. E:0:1 (KIND is E, D or A)");
        HeadId id;
        id.kind = parse_kind(item.substr(0, a), "head '" + item + "'");
        id.layer = parse_index(item, item.substr(a + 1, b - a - 1), "layer");
        id.head = parse_index(item, item.substr(b + 1), "head");
        if (id.layer >= layers_of(config, id.kind))
            throw std::invalid_argument("head '" + item + "': the model's " + describe(id.kind) + " has layers 0.." +
                                        std::to_string(layers_of(config, id.kind) - 1));
        if (id.head >= config.heads)
            throw std::invalid_argument("head '" + item + "': the model has heads 0.." + std::to_string(config.heads - 1) +
                                        " in each attention");
        if (std::find(heads.begin(), heads.end(), id) == heads.end()) heads.push_back(id);
    }
    if (heads.empty()) throw std::invalid_argument("head list '" + spec + "' names no head (expected e.g. E:0:1,A:2:3)");
    return heads;
}

void AttentionProbes::probe(const void* module, const char* type, const char* name, const Tensor& value) {
    if (std::string(type) != MultiHeadAttention::kType) return;
    if (std::string(name) == "weights") seen_[module].weights = value;
    if (std::string(name) == "context") seen_[module].context = value;
}

const AttentionProbes::Seen& AttentionProbes::of(const MultiHeadAttention& m) const {
    auto it = seen_.find(&m);
    if (it == seen_.end() || !it->second.weights.defined() || !it->second.context.defined())
        throw std::logic_error("heads: the pass did not show this attention's weights (was it given the observer?)");
    return it->second;
}

MultiHeadAttention& attention_of(Transformer& model, HeadKind kind, int layer) {
    if (kind == HeadKind::E) return model.encoder.at(std::size_t(layer)).self_attn;
    if (kind == HeadKind::D) return model.decoder.at(std::size_t(layer)).self_attn;
    return model.decoder.at(std::size_t(layer)).multihead_attn;
}

void mask_heads(Transformer& model, const std::vector<HeadId>& heads) {
    for (HeadKind kind : kKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l) {
            MultiHeadAttention& m = attention_of(model, kind, l);
            m.gate = Tensor::full({1, m.H, 1, 1}, 1);
        }
    for (const HeadId& h : heads) attention_of(model, h.kind, h.layer).gate.data()[h.head] = 0;
}

Granularity parse_granularity(const std::string& name) {
    if (name == "token") return Granularity::token;
    if (name == "sentence") return Granularity::sentence;
    if (name == "batch") return Granularity::batch;
    throw std::invalid_argument("granularity must be token, sentence or batch, got '" + name + "'");
}

const char* to_string(Granularity g) {
    return g == Granularity::token ? "token" : g == Granularity::sentence ? "sentence" : "batch";
}

// An example too long for the budget alone gets a batch of its own.
std::vector<std::vector<std::int64_t>> file_order_batches(const std::vector<Example>& examples, std::int64_t budget) {
    std::vector<std::vector<std::int64_t>> batches;
    std::vector<std::int64_t> current;
    std::int64_t longest = 0;
    for (std::int64_t i = 0; i < std::int64_t(examples.size()); ++i) {
        const std::int64_t len = std::int64_t(std::max(examples[i].src.size(), examples[i].tgt.size())) + 1;
        const std::int64_t would = std::max(longest, len) * std::int64_t(current.size() + 1);
        if (!current.empty() && would > budget) {
            batches.push_back(std::move(current));
            current.clear();
            longest = 0;
        }
        current.push_back(i);
        longest = std::max(longest, len);
    }
    if (!current.empty()) batches.push_back(std::move(current));
    return batches;
}

std::vector<GatedAttention> gated_pass(Transformer& model, const Batch& b, real label_smoothing, double* loss) {
    std::vector<GatedAttention> out;
    for (HeadKind kind : kKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l) {
            MultiHeadAttention& m = attention_of(model, kind, l);
            if (m.gate.numel() != m.H) throw std::logic_error("heads: a gate that is not one value per head");
            const std::int64_t H = m.H, Tq = kind == HeadKind::E ? b.S : b.T;
            GatedAttention at{kind, l, &m, m.gate, Tensor::empty({b.B, H, Tq, 1}), Tensor(), Tensor()};  // ξ (B, H, Tq, 1)
            for (std::int64_t i = 0; i < at.gate.numel(); ++i) at.gate.data()[i] = at.saved_gate.data()[(i / Tq) % H];
            at.gate.set_requires_grad(true);
            m.gate = at.gate;
            out.push_back(std::move(at));
        }
    AttentionProbes probes;
    Pass pass;
    pass.observer = &probes;
    Tensor logits = model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass);  // (B, T, V)
    for (GatedAttention& at : out) {
        at.weights = probes.of(*at.module).weights;
        at.context = probes.of(*at.module).context;
    }
    LossReport r;
    Tensor mean = sequence_loss(logits, b.target, model.config.pad_id, label_smoothing, &r);
    Tensor summed = scale(mean, real(r.tokens));  // summed over the batch's target tokens
    backward(summed);
    for (GatedAttention& at : out) at.module->gate = at.saved_gate;
    if (loss) *loss = double(summed.item());
    return out;
}

namespace {

// What one head accumulates over the data before the means are taken.
struct HeadSums {
    double importance = 0;       // Σ |gate gradient| at the granularity's level
    double importance_count = 0; // the N it is divided by
    double entropy = 0, entropy_normalised = 0, confidence = 0, eos = 0, bos = 0, distance = 0, value_norm = 0;
    std::int64_t queries = 0, normalisable = 0;
    std::map<int, std::int64_t> argmax_offsets;
};

struct Attention {
    HeadKind kind;
    int layer;
    MultiHeadAttention* module;
    Tensor gate;               // ξ (B, H, Tq, 1) of this batch, holding ∂L/∂ξ; undefined in training
    Tensor weights, context;   // (B, H, Tq, Tk) and (B, H, Tq, D) of this batch, from the pass's probes
    std::vector<HeadSums> sums;
};

// Adds one batch's gate gradients and attention weights of one attention to its sums.
void accumulate(Attention& at, const Batch& b, Granularity granularity) {
    const MultiHeadAttention& m = *at.module;
    const std::int64_t B = b.B, H = m.H;
    const bool self = at.kind != HeadKind::A;
    const std::int64_t Tq = at.kind == HeadKind::E ? b.S : b.T, Tk = at.kind == HeadKind::D ? b.T : b.S;
    const real* g = at.gate.defined() ? std::as_const(at.gate).grad() : nullptr;  // (B, H, Tq, 1), or none
    const real* w = at.weights.data();             // (B, H, Tq, Tk)
    const real* o = at.context.data();             // (B, H, Tq, D)
    const real* wo = m.out_proj.weight.data();     // W_o (C, C): head h owns columns [hD, (h+1)D)
    const std::int64_t C = m.C, D = m.D;
    for (std::int64_t h = 0; h < H; ++h) {
        HeadSums& s = at.sums[std::size_t(h)];
        double batch_sum = 0;
        for (std::int64_t r = 0; r < B; ++r) {
            const std::int64_t q_len = at.kind == HeadKind::E ? b.src_len[r] : b.tgt_len[r];
            const std::int64_t k_len = at.kind == HeadKind::D ? b.tgt_len[r] : b.src_len[r];
            double sentence_sum = 0;
            for (std::int64_t t = 0; t < q_len; ++t) {
                const double gt = g ? g[(r * H + h) * Tq + t] : 0.0;
                sentence_sum += gt;
                if (granularity == Granularity::token) s.importance += std::fabs(gt);
                const real* a = w + ((r * H + h) * Tq + t) * Tk;  // (Tk): this query's weights
                const std::int64_t visible = at.kind == HeadKind::D ? t + 1 : k_len;
                double entropy = 0, best = -1;
                std::int64_t argmax = 0;
                for (std::int64_t j = 0; j < visible; ++j) {
                    const double p = a[j];
                    if (p > 0) entropy -= p * std::log(p);
                    if (p > a[argmax]) argmax = j;
                    const bool eos = at.kind != HeadKind::D && j == k_len - 1;
                    if (!eos) best = std::max(best, p);
                    if (eos) s.eos += p;
                    if (at.kind == HeadKind::D && j == 0) s.bos += p;
                    if (self) s.distance += p * double(std::llabs(t - j));
                }
                s.entropy += entropy;
                if (visible > 1) {
                    s.entropy_normalised += entropy / std::log(double(visible));
                    ++s.normalisable;
                }
                s.confidence += std::max(best, 0.0);
                const real* oh = o + ((r * H + h) * Tq + t) * D;  // (D): Σ_j a_ij v_j
                double norm = 0;
                for (std::int64_t c = 0; c < C; ++c) {  // (W_o^h o)_c
                    double y = 0;
                    for (std::int64_t d = 0; d < D; ++d) y += double(wo[c * C + h * D + d]) * oh[d];
                    norm += y * y;
                }
                s.value_norm += std::sqrt(norm);
                if (self) ++s.argmax_offsets[int(argmax - t)];
                ++s.queries;
            }
            batch_sum += sentence_sum;
            if (granularity == Granularity::sentence) {
                s.importance += std::fabs(sentence_sum);
                s.importance_count += 1;
            }
        }
        if (granularity == Granularity::batch) {
            s.importance += std::fabs(batch_sum);
            s.importance_count += 1;
        }
    }
    if (granularity == Granularity::token)
        for (auto& s : at.sums) s.importance_count = double(s.queries);
}

double norm_of_rows(const Tensor& t, std::int64_t r0, std::int64_t r1) {  // ‖grad rows [r0, r1)‖₂ of a (R, C) or (R)
    const real* g = t.grad();
    if (!g) return 0;
    const std::int64_t width = t.rank() == 2 ? t.size(1) : 1;
    double s = 0;
    for (std::int64_t i = r0 * width; i < r1 * width; ++i) s += double(g[i]) * g[i];
    return std::sqrt(s);
}

double norm_of_columns(const Tensor& t, std::int64_t c0, std::int64_t c1) {  // ‖grad columns [c0, c1)‖₂ of (R, C)
    const real* g = t.grad();
    if (!g) return 0;
    double s = 0;
    for (std::int64_t r = 0; r < t.size(0); ++r)
        for (std::int64_t c = c0; c < c1; ++c) s += double(g[r * t.size(1) + c]) * g[r * t.size(1) + c];
    return std::sqrt(s);
}

// The means of one attention's sums, its gradient norms, and its importances normalised over its heads.
void finish(const Attention& at, bool normalise, std::vector<HeadStats>& out) {
    const MultiHeadAttention& m = *at.module;
    const std::int64_t C = m.C, D = m.D;
    double layer_norm = 0;
    const std::size_t first = out.size();
    for (std::int64_t h = 0; h < m.H; ++h) {
        const HeadSums& s = at.sums[std::size_t(h)];
        HeadStats st;
        st.id = {at.kind, at.layer, int(h)};
        st.importance_raw = s.importance_count ? s.importance / s.importance_count : 0;
        layer_norm += st.importance_raw * st.importance_raw;
        st.grad_wq = norm_of_rows(m.in_proj_weight, h * D, (h + 1) * D);
        st.grad_wk = norm_of_rows(m.in_proj_weight, C + h * D, C + (h + 1) * D);
        st.grad_wv = norm_of_rows(m.in_proj_weight, 2 * C + h * D, 2 * C + (h + 1) * D);
        st.grad_bq = norm_of_rows(m.in_proj_bias, h * D, (h + 1) * D);
        st.grad_bk = norm_of_rows(m.in_proj_bias, C + h * D, C + (h + 1) * D);
        st.grad_bv = norm_of_rows(m.in_proj_bias, 2 * C + h * D, 2 * C + (h + 1) * D);
        st.grad_wo = norm_of_columns(m.out_proj.weight, h * D, (h + 1) * D);
        const double q = double(std::max<std::int64_t>(s.queries, 1));
        st.entropy = s.entropy / q;
        st.entropy_normalised = s.normalisable ? s.entropy_normalised / double(s.normalisable) : 0;
        st.confidence = s.confidence / q;
        st.eos_share = s.eos / q;
        st.bos_share = s.bos / q;
        st.mean_distance = s.distance / q;
        st.value_norm = s.value_norm / q;
        for (const auto& [offset, count] : s.argmax_offsets)
            if (double(count) / q > st.argmax_offset_share) {
                st.argmax_offset = offset;
                st.argmax_offset_share = double(count) / q;
            }
        out.push_back(st);
    }
    layer_norm = std::sqrt(layer_norm);
    for (std::size_t i = first; i < out.size(); ++i)
        out[i].importance = !normalise ? out[i].importance_raw : layer_norm > 0 ? out[i].importance_raw / layer_norm : 0;
}

// <W_o^h, dL/dW_o^h>_F over the head's D columns of the out-projection (C, C).
double out_projection_product(const MultiHeadAttention& m, std::int64_t h) {
    const real* w = m.out_proj.weight.data();
    const real* g = m.out_proj.weight.grad();
    if (!g) return 0;
    double s = 0;
    for (std::int64_t r = 0; r < m.C; ++r)
        for (std::int64_t c = h * m.D; c < (h + 1) * m.D; ++c) s += double(w[r * m.C + c]) * g[r * m.C + c];
    return s;
}

}  // namespace

std::vector<HeadStats> measure_training_step(Transformer& model, const Batch& batch, const AttentionProbes& probes) {
    std::vector<HeadStats> out;
    for (HeadKind kind : kKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l) {
            MultiHeadAttention& m = attention_of(model, kind, l);
            const AttentionProbes::Seen& seen = probes.of(m);
            Attention at{kind, l, &m, Tensor(), seen.weights, seen.context, std::vector<HeadSums>(std::size_t(m.H))};
            accumulate(at, batch, Granularity::batch);  // no gate gradient: the statistics only
            for (std::int64_t h = 0; h < m.H; ++h) {
                at.sums[std::size_t(h)].importance = std::fabs(out_projection_product(m, h));
                at.sums[std::size_t(h)].importance_count = 1;
            }
            finish(at, true, out);
        }
    return out;
}

HeadReport study_heads(Transformer& model, const std::vector<Example>& examples, const HeadStudyOptions& options) {
    if (examples.empty()) throw std::invalid_argument("heads: no sentence pairs to study");
    if (options.batch_tokens < 1) throw std::invalid_argument("heads: --batch-tokens must be >= 1");
    for (const Example& e : examples)
        if (std::int64_t(std::max(e.src.size(), e.tgt.size())) + 1 > model.config.max_len)
            throw std::invalid_argument("heads: a pair of " + std::to_string(e.src.size()) + " / " + std::to_string(e.tgt.size()) +
                                        " tokens is longer than the model's " + std::to_string(model.config.max_len) +
                                        " positions (leave such pairs out)");
    HeadReport report;
    report.options = options;
    std::vector<Attention> attentions;
    for (HeadKind kind : kKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l) {
            MultiHeadAttention& m = attention_of(model, kind, l);
            attentions.push_back({kind, l, &m, Tensor(), Tensor(), Tensor(), std::vector<HeadSums>(std::size_t(m.H))});
        }
    for (const auto& p : model.parameters()) {
        Tensor t = p.tensor;
        if (t.has_grad()) t.zero_grad();
    }

    for (const auto& indices : file_order_batches(examples, options.batch_tokens)) {
        const Batch b = make_batch(examples, indices);
        double loss = 0;
        const std::vector<GatedAttention> gated =
            gated_pass(model, b, real(options.smoothed ? options.label_smoothing : 0.0), &loss);
        report.loss += loss;
        for (std::size_t i = 0; i < attentions.size(); ++i) {
            attentions[i].gate = gated[i].gate;
            attentions[i].weights = gated[i].weights;
            attentions[i].context = gated[i].context;
            accumulate(attentions[i], b, options.granularity);
        }
        report.pairs += b.B;
        report.src_tokens += b.num_src_tokens;
        report.tgt_tokens += b.num_tgt_tokens;
        ++report.batches;
    }
    for (Attention& at : attentions) at.gate = at.weights = at.context = Tensor();  // the last batch's tape tensors

    for (const Attention& at : attentions) finish(at, options.normalise, report.heads);
    return report;
}

// ---- ablation -------------------------------------------------------------------------------------------

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
    for (HeadKind kind : kKinds)
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

// ---- pruning ----------------------------------------------------------------------------------------------

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

    const std::vector<HeadKind> kinds = opt.kinds.empty() ? std::vector<HeadKind>(std::begin(kKinds), std::end(kKinds)) : opt.kinds;
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
        if (masked.size() == before) break;  // nothing left that may be masked
        curve.push_back(evaluate_masked(masked));
        if (curve.back().bleu < floor) break;
    }
    std::size_t i = 0;
    for (auto& [name, m] : model.attentions()) m->gate = saved[i++];
    return curve;
}

std::string heads_json(const HeadReport& r) {
    nlohmann::json heads = nlohmann::json::array();
    for (const HeadStats& s : r.heads) {
        nlohmann::json h = {
            {"head", s.id.str()}, {"kind", std::string(1, to_char(s.id.kind))}, {"layer", s.id.layer}, {"index", s.id.head},
            {"importance", s.importance}, {"importance_raw", s.importance_raw},
            {"grad_norm", {{"wq", s.grad_wq}, {"wk", s.grad_wk}, {"wv", s.grad_wv}, {"wo", s.grad_wo},
                           {"bq", s.grad_bq}, {"bk", s.grad_bk}, {"bv", s.grad_bv}}},
            {"entropy", s.entropy}, {"entropy_normalised", s.entropy_normalised}, {"confidence", s.confidence},
            {"eos_share", s.eos_share}, {"bos_share", s.bos_share}, {"value_norm", s.value_norm}};
        if (s.id.kind != HeadKind::A) {
            h["mean_distance"] = s.mean_distance;
            h["argmax_offset"] = s.argmax_offset;
            h["argmax_offset_share"] = s.argmax_offset_share;
            h["positional"] = s.argmax_offset_share >= 0.9;
        }
        heads.push_back(std::move(h));
    }
    nlohmann::json out = {
        {"pairs", r.pairs}, {"batches", r.batches}, {"src_tokens", r.src_tokens}, {"tgt_tokens", r.tgt_tokens},
        {"loss", r.options.smoothed ? "label-smoothed cross-entropy, summed over target tokens" : "NLL, summed over target tokens"},
        {"loss_value", r.loss},
        {"granularity", to_string(r.options.granularity)},
        {"label_smoothing", r.options.smoothed ? r.options.label_smoothing : 0.0},
        {"importance_normalised", r.options.normalise},
        {"dropout", false},
        {"heads", heads}};
    return out.dump(1) + "\n";
}

std::string heads_csv(const HeadReport& r) {
    std::ostringstream o;
    o << "head,kind,layer,index,importance,importance_raw,grad_wq,grad_wk,grad_wv,grad_wo,grad_bq,grad_bk,grad_bv,"
         "entropy,entropy_normalised,confidence,eos_share,bos_share,value_norm,mean_distance,argmax_offset,argmax_offset_share\n";
    o.precision(9);
    for (const HeadStats& s : r.heads) {
        const bool self = s.id.kind != HeadKind::A;
        o << s.id.str() << ',' << to_char(s.id.kind) << ',' << s.id.layer << ',' << s.id.head << ',' << s.importance << ','
          << s.importance_raw << ',' << s.grad_wq << ',' << s.grad_wk << ',' << s.grad_wv << ',' << s.grad_wo << ','
          << s.grad_bq << ',' << s.grad_bk << ',' << s.grad_bv << ',' << s.entropy << ',' << s.entropy_normalised << ','
          << s.confidence << ',' << s.eos_share << ',' << s.bos_share << ',' << s.value_norm << ',';
        if (self) o << s.mean_distance << ',' << s.argmax_offset << ',' << s.argmax_offset_share;
        else o << ",,";
        o << '\n';
    }
    return o.str();
}

std::string layer_head_table(HeadKind kind, const std::string& what, const std::vector<HeadCell>& cells) {
    int layers = 0, heads = 0;
    for (const HeadCell& c : cells)
        if (c.id.kind == kind) layers = std::max(layers, c.id.layer + 1), heads = std::max(heads, c.id.head + 1);
    if (!layers) return {};
    std::ostringstream o;
    char cell[32];
    o << to_char(kind) << " = " << describe(kind) << ": " << what << "\n  layer";
    for (int h = 0; h < heads; ++h) {
        std::snprintf(cell, sizeof cell, "%9s", ("head " + std::to_string(h)).c_str());
        o << cell;
    }
    o << "\n";
    for (int l = 0; l < layers; ++l) {
        std::snprintf(cell, sizeof cell, "  %5d", l);
        o << cell;
        for (const HeadCell& c : cells)
            if (c.id.kind == kind && c.id.layer == l) o << std::string(c.text.size() < 9 ? 9 - c.text.size() : 0, ' ') << c.text;
        o << "\n";
    }
    return o.str();
}

std::string heads_tables(const HeadReport& r) {
    const std::string importance = std::string("importance (") + to_string(r.options.granularity) +
                                   (r.options.normalise ? ", normalised per layer)" : ", raw)");
    const auto four_places = [](double x) {
        char text[400];  // room for any double in %f
        std::snprintf(text, sizeof text, "%.4f", x);
        return std::string(text);
    };
    std::vector<HeadCell> importances, entropies;
    for (const HeadStats& s : r.heads) {
        importances.push_back({s.id, four_places(s.importance)});
        entropies.push_back({s.id, four_places(s.entropy)});
    }
    std::string o;
    for (HeadKind kind : kKinds) {
        const std::string tables = layer_head_table(kind, importance, importances) +
                                   layer_head_table(kind, "attention entropy (nats)", entropies);
        if (!tables.empty()) o += tables + "\n";
    }
    return o;
}

TF_NAMESPACE_END
