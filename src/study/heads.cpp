// study_heads(): one teacher-forced pass with gradients per batch, in file order. Each attention gets a gate
// tensor ξ (B, H, Tq, 1) of ones (or zeros for masked heads) that requires grad; after backward its
// gradient holds ⟨o_{b,h,t}, ∂L/∂o_{b,h,t}⟩ for every head and query, and the attention weights the
// pass's probes show (AttentionProbes) give the statistics. Parameter gradients accumulate over all batches: they are of the loss summed
// over every target token of the data.
#include "tapeformer/study/heads.h"

#include <algorithm>
#include <cctype>
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

PunctuationIds punctuation_ids(const TokenizerPair& tokenizers) {
    auto side = [](const Tokenizer& tok) {
        std::vector<bool> out(std::size_t(tok.vocab_size()), false);
        for (std::int32_t id = 0; id < tok.vocab_size(); ++id) {
            std::string piece = tok.id_to_piece(id);
            static const std::string word_start = "\xE2\x96\x81";  // "▁"
            while (piece.compare(0, word_start.size(), word_start) == 0) piece.erase(0, word_start.size());
            out[std::size_t(id)] = !piece.empty() && std::all_of(piece.begin(), piece.end(), [](char c) {
                return static_cast<unsigned char>(c) < 128 && std::ispunct(static_cast<unsigned char>(c));
            });
        }
        return out;
    };
    return {side(*tokenizers.source), side(*tokenizers.target)};
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
    for (HeadKind kind : kHeadKinds)
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
    double importance_signed = 0; // Σ gate gradient over every query token, no absolute value
    double entropy = 0, entropy_normalised = 0, confidence = 0, eos = 0, bos = 0, distance = 0, value_norm = 0;
    std::int64_t queries = 0, normalisable = 0;
    std::map<int, std::int64_t> argmax_offsets;
    double punctuation = 0, rare = 0, rare_argmax = 0, rare_chance = 0;
    std::int64_t rare_queries = 0;
    std::vector<double> by_offset = std::vector<double>(2 * kOffsetReach + 1, 0.0);
};

// What the statistics know of the keys' tokens: how often each id occurs on each side of the studied pairs,
// which ids may be a sentence's rarest (not among options.rare_outside_top most frequent), and which are
// punctuation. Empty in training logs: those statistics are then not taken.
struct KeyTokens {
    struct Side {
        std::vector<std::int64_t> count;  // by id
        std::vector<bool> rare_enough;    // by id
        std::vector<bool> punctuation;    // by id (may be empty or shorter: the rest are not)
        bool is_punctuation(std::int32_t id) const { return std::size_t(id) < punctuation.size() && punctuation[std::size_t(id)]; }
    };
    Side source, target;
    bool known = false;
};

KeyTokens key_tokens(const std::vector<Example>& examples, const HeadStudyOptions& options) {
    KeyTokens keys;
    keys.known = true;
    auto count = [&](KeyTokens::Side& side, auto tokens_of, const std::vector<bool>& punctuation) {
        for (const Example& e : examples)
            for (std::int32_t id : tokens_of(e)) {
                if (std::size_t(id) >= side.count.size()) side.count.resize(std::size_t(id) + 1, 0);
                ++side.count[std::size_t(id)];
            }
        std::vector<std::int32_t> by_frequency(side.count.size());  // ids, most frequent first, ties by id
        for (std::size_t i = 0; i < by_frequency.size(); ++i) by_frequency[i] = std::int32_t(i);
        std::stable_sort(by_frequency.begin(), by_frequency.end(),
                         [&](std::int32_t a, std::int32_t b) { return side.count[std::size_t(a)] > side.count[std::size_t(b)]; });
        side.rare_enough.assign(side.count.size(), true);
        for (std::int64_t i = 0; i < std::min<std::int64_t>(options.rare_outside_top, std::int64_t(by_frequency.size())); ++i)
            side.rare_enough[std::size_t(by_frequency[std::size_t(i)])] = false;
        side.punctuation = punctuation;
    };
    count(keys.source, [](const Example& e) -> const std::vector<std::int32_t>& { return e.src; }, options.punctuation.source);
    count(keys.target, [](const Example& e) -> const std::vector<std::int32_t>& { return e.tgt; }, options.punctuation.target);
    return keys;
}

struct Attention {
    HeadKind kind;
    int layer;
    MultiHeadAttention* module;
    Tensor gate;               // ξ (B, H, Tq, 1) of this batch, holding ∂L/∂ξ; undefined in training
    Tensor weights, context;   // (B, H, Tq, Tk) and (B, H, Tq, D) of this batch, from the pass's probes
    std::vector<HeadSums> sums;
};

// Adds one batch's gate gradients and attention weights of one attention to its sums.
void accumulate(Attention& at, const Batch& b, Granularity granularity, const KeyTokens& keys) {
    const MultiHeadAttention& m = *at.module;
    const std::int64_t B = b.B, H = m.H;
    const bool self = at.kind != HeadKind::A;
    const std::int64_t Tq = at.kind == HeadKind::E ? b.S : b.T, Tk = at.kind == HeadKind::D ? b.T : b.S;
    const real* g = at.gate.defined() ? std::as_const(at.gate).grad() : nullptr;  // (B, H, Tq, 1), or none
    const real* w = at.weights.data();             // (B, H, Tq, Tk)
    const real* o = at.context.data();             // (B, H, Tq, D)
    const real* wo = m.out_proj.weight.data();     // W_o (C, C): head h owns columns [hD, (h+1)D)
    const std::int64_t C = m.C, D = m.D;
    const KeyTokens::Side& key_side = at.kind == HeadKind::D ? keys.target : keys.source;
    const std::vector<std::int32_t>& key_ids = at.kind == HeadKind::D ? b.dec_in : b.src;  // (B, Tk)
    std::vector<char> rarest(static_cast<std::size_t>(Tk), 0);  // per query: which of the keys it sees are its sentence's rarest
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
                s.importance_signed += gt;
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
                if (self)
                    for (std::int64_t j = 0; j < visible; ++j)
                        s.by_offset[std::size_t(std::clamp<std::int64_t>(j - t, -kOffsetReach, kOffsetReach) + kOffsetReach)] += a[j];
                if (keys.known) {
                    const std::int32_t* ids = key_ids.data() + r * Tk;  // (Tk): this row's key tokens
                    // The keys that hold a token: not the source's EOS, not the decoder's BOS.
                    const std::int64_t from = at.kind == HeadKind::D ? 1 : 0, to = at.kind == HeadKind::D ? visible : k_len - 1;
                    std::int64_t fewest = -1;
                    for (std::int64_t j = from; j < to; ++j) {
                        s.punctuation += key_side.is_punctuation(ids[j]) ? a[j] : 0.0;
                        const std::int64_t c = key_side.count[std::size_t(ids[j])];
                        if (fewest < 0 || c < fewest) fewest = c;
                    }
                    std::int64_t n_rarest = 0, first_rarest = -1;
                    for (std::int64_t j = 0; j < visible; ++j) {
                        rarest[std::size_t(j)] = j >= from && j < to && key_side.count[std::size_t(ids[j])] == fewest;
                        if (rarest[std::size_t(j)] && n_rarest++ == 0) first_rarest = j;
                    }
                    const bool counts = n_rarest > 0 && key_side.rare_enough[std::size_t(ids[first_rarest])];
                    if (counts) {
                        for (std::int64_t j = 0; j < visible; ++j) s.rare += rarest[std::size_t(j)] ? a[j] : 0.0;
                        s.rare_argmax += rarest[std::size_t(argmax)] ? 1 : 0;
                        s.rare_chance += double(n_rarest) / double(visible);
                        ++s.rare_queries;
                    }
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
        st.importance_signed_raw = s.importance_count ? s.importance_signed / s.importance_count : 0;
        st.masked = m.gate.defined() && m.gate.data()[h] == 0;
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
        st.punctuation_share = s.punctuation / q;
        if (s.rare_queries > 0) {
            st.rare_share = s.rare / double(s.rare_queries);
            st.rare_argmax_share = s.rare_argmax / double(s.rare_queries);
            st.rare_chance = s.rare_chance / double(s.rare_queries);
        }
        st.rare_queries = s.rare_queries;
        if (at.kind != HeadKind::A)
            for (double v : s.by_offset) st.attention_by_offset.push_back(v / q);
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

// Hands each pair of the batch, in order, its heads' gate gradients at its own query tokens.
void report_sentences(const std::vector<GatedAttention>& gated, const Batch& b, const std::vector<Example>& examples,
                      const std::vector<std::int64_t>& indices, const std::function<void(const SentenceHeads&)>& sink) {
    for (std::int64_t r = 0; r < b.B; ++r) {
        SentenceHeads s;
        s.example = &examples[std::size_t(indices[std::size_t(r)])];
        for (const GatedAttention& at : gated) {
            const std::int64_t H = at.module->H, Tq = at.kind == HeadKind::E ? b.S : b.T;
            const std::int64_t q_len = at.kind == HeadKind::E ? b.src_len[r] : b.tgt_len[r];
            const real* g = std::as_const(at.gate).grad();  // (B, H, Tq, 1)
            for (std::int64_t h = 0; h < H; ++h) {
                s.heads.push_back({at.kind, at.layer, int(h)});
                if (g) s.gate_grad.emplace_back(g + (r * H + h) * Tq, g + (r * H + h) * Tq + q_len);
                else s.gate_grad.emplace_back(std::size_t(q_len), 0.0);  // (no gradient reached the gate)
            }
        }
        sink(s);
    }
}

}  // namespace

std::vector<HeadStats> measure_training_step(Transformer& model, const Batch& batch, const AttentionProbes& probes) {
    std::vector<HeadStats> out;
    for (HeadKind kind : kHeadKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l) {
            MultiHeadAttention& m = attention_of(model, kind, l);
            const AttentionProbes::Seen& seen = probes.of(m);
            Attention at{kind, l, &m, Tensor(), seen.weights, seen.context, std::vector<HeadSums>(std::size_t(m.H))};
            accumulate(at, batch, Granularity::batch, KeyTokens());  // no gate gradient: the statistics only
            for (std::int64_t h = 0; h < m.H; ++h) {
                const double product = out_projection_product(m, h);
                at.sums[std::size_t(h)].importance = std::fabs(product);
                at.sums[std::size_t(h)].importance_signed = product;
                at.sums[std::size_t(h)].importance_count = 1;
            }
            finish(at, true, out);
        }
    return out;
}

EncodedCorpus study_pairs(const Transformer& model, const TokenizerPair& tokenizers, const ParallelText& text) {
    EncodedCorpus corpus = encode_parallel(text, tokenizers, std::int32_t(model.config.max_len - 1));
    if (model.config.decoder_only())
        for (Example& e : corpus.examples) e.src.clear();
    if (corpus.examples.empty()) throw std::invalid_argument("no pair to study (" + corpus.stats.summary() + ")");
    return corpus;
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
    for (HeadKind kind : kHeadKinds)
        for (int l = 0; l < layers_of(model.config, kind); ++l) {
            MultiHeadAttention& m = attention_of(model, kind, l);
            attentions.push_back({kind, l, &m, Tensor(), Tensor(), Tensor(), std::vector<HeadSums>(std::size_t(m.H))});
        }
    for (const auto& p : model.parameters()) {
        Tensor t = p.tensor;
        if (t.has_grad()) t.zero_grad();
    }

    const KeyTokens keys = key_tokens(examples, options);
    for (const auto& indices : file_order_batches(examples, options.batch_tokens)) {
        const Batch b = make_batch(examples, indices);
        double loss = 0;
        const std::vector<GatedAttention> gated =
            gated_pass(model, b, real(options.smoothed ? options.label_smoothing : 0.0), &loss);
        report.loss += loss;
        if (options.per_sentence) report_sentences(gated, b, examples, indices, options.per_sentence);
        for (std::size_t i = 0; i < attentions.size(); ++i) {
            attentions[i].gate = gated[i].gate;
            attentions[i].weights = gated[i].weights;
            attentions[i].context = gated[i].context;
            accumulate(attentions[i], b, options.granularity, keys);
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

TF_NAMESPACE_END
