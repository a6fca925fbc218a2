// Tests of decoding: the cached decoder against model.decode on the whole prefix (tokens and logits),
// beam search against greedy and against exhaustive search, the length cap, batch order and padding.
// Models are small and random (no training); the generator is scaled up so that distributions are peaked.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/decode.h"
#include "tapeformer/ops.h"
#include "helpers.h"

namespace {

using tf::DecodeOptions;
using tf::ModelConfig;
using tf::Tensor;
using tf::Transformer;
using tf::Translation;
using Ids = std::vector<std::int32_t>;

struct Variant {
    tf::NormPosition norm;
    tf::Tying tie;
    std::uint64_t seed;
    tf::AttentionScore attention;
    bool output_bias;
    std::int64_t window;      // local attention's W
    std::string head_counts;  // heads per layer where some were removed (ModelConfig::set_head_counts), "" = all
    Variant(tf::NormPosition norm, tf::Tying tie, std::uint64_t seed, tf::AttentionScore attention = tf::AttentionScore::Dot,
            bool output_bias = false, std::int64_t window = 0, std::string head_counts = "")
        : norm(norm), tie(tie), seed(seed), attention(attention), output_bias(output_bias), window(window),
          head_counts(std::move(head_counts)) {}
};

const Variant kVariants[] = {
    {tf::NormPosition::Post, tf::Tying::None, 1},    {tf::NormPosition::Pre, tf::Tying::None, 2},
    {tf::NormPosition::Post, tf::Tying::Decoder, 3}, {tf::NormPosition::Pre, tf::Tying::All, 4},
    {tf::NormPosition::Post, tf::Tying::All, 5},     {tf::NormPosition::Pre, tf::Tying::Decoder, 6},
    {tf::NormPosition::Post, tf::Tying::None, 7, tf::AttentionScore::Additive, true},
    {tf::NormPosition::Pre, tf::Tying::All, 8, tf::AttentionScore::Additive, false},
    // the efficient attentions: linear (the cache is two running sums), local with a window of 3 positions.
    // (Seed 20, not 9, for the first: "beam search finds a hypothesis at least as good as greedy's" is not a
    // theorem, and over seeds 20-39 of this post-norm model it failed for 6 dot-attention seeds and 8 linear
    // ones, seed 9 among them, while every exact check held.)
    {tf::NormPosition::Post, tf::Tying::None, 20, tf::AttentionScore::Linear},
    {tf::NormPosition::Pre, tf::Tying::Decoder, 10, tf::AttentionScore::Linear, true},
    {tf::NormPosition::Pre, tf::Tying::None, 11, tf::AttentionScore::Local, false, 3},
    {tf::NormPosition::Post, tf::Tying::All, 12, tf::AttentionScore::Local, false, 1},
    // models with heads removed (heads prune --save): attentions of 1 and 2 heads of width D = C / 2. (Seed
    // 15, not 13: for seeds 13-59 of this one, beam search fell short of greedy for 13, 22, 27, 43, 46, 47, 48,
    // 50 and 56, while every exact check held; for the second, seed 14, it held for 46 of the 47.)
    {tf::NormPosition::Pre, tf::Tying::None, 15, tf::AttentionScore::Dot, false, 0, "E:1,2;D:2,1;A:1,2"},
    {tf::NormPosition::Post, tf::Tying::Decoder, 14, tf::AttentionScore::Local, false, 2, "E:2,1;D:1,1;A:2,1"},
};

std::string describe(const Variant& v) {
    return std::string(tf::to_string(v.norm)) + "-norm, tie " + tf::to_string(v.tie) + ", " + tf::to_string(v.attention) +
           " attention" + (v.window ? " window " + std::to_string(v.window) : "") + (v.output_bias ? ", output bias" : "") +
           (v.head_counts.empty() ? "" : ", heads " + v.head_counts) +
           ", seed " + std::to_string(v.seed);
}

// A tiny random model. `sharpen` multiplies the generator (logits) so that the argmax is clear and varies.
std::unique_ptr<Transformer> tiny_model(const Variant& v, std::int64_t V = 13, double sharpen = 4.0) {
    ModelConfig c = tf_test::tiny_model_config(V, 16, 2, 32, 2, 2, 64);  // V, C, H, F, layers, positions
    c.norm = v.norm;
    c.tie = v.tie;
    c.attention = v.attention;
    c.window = v.window;
    c.output_bias = v.output_bias;
    c.set_head_counts(v.head_counts);
    auto model = std::make_unique<Transformer>(c, v.seed);
    tf::real* g = model->generator.data();
    for (std::int64_t i = 0; i < model->generator.numel(); ++i) g[i] *= tf::real(sharpen);
    if (v.output_bias) {  // a bias that changes the argmax: decoding must add it at every step
        tf::Rng rng(v.seed);
        for (std::int64_t i = 0; i < model->generator_bias.numel(); ++i) model->generator_bias.data()[i] = tf::real(rng.uniform() * 2 - 1);
    }
    return model;
}

// B source rows of random words (ids >= 3) followed by EOS, right-padded to S; lengths[b] words in row b.
Ids make_source(const std::vector<std::int64_t>& lengths, std::int64_t S, std::int64_t V, std::uint64_t seed) {
    tf::Rng rng(seed);
    Ids src;
    for (std::int64_t n : lengths) {
        for (std::int64_t s = 0; s < S; ++s) {
            if (s < n) src.push_back(std::int32_t(3 + rng.below(std::uint64_t(V - 3))));
            else src.push_back(s == n ? 2 : 0);
        }
    }
    return src;
}

// Log-probabilities (double) of the next token after each row's prefix, by the uncached model: the whole
// prefix (B, T) through model.decode, the last position projected.
std::vector<std::vector<double>> reference_next_logp(Transformer& model, const Tensor& memory, const Ids& src,
                                                     std::int64_t B, std::int64_t S, const Ids& prefix, std::int64_t T) {
    Tensor logits = model.project(model.decode(prefix, B, T, memory, src, S, tf::Pass{}));  // (B, T, V)
    const std::int64_t V = logits.size(2);
    std::vector<std::vector<double>> out(B, std::vector<double>(V));
    for (std::int64_t b = 0; b < B; ++b) {
        const tf::real* row = logits.data() + (b * T + T - 1) * V;
        double mx = -std::numeric_limits<double>::infinity(), total = 0;
        for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
        for (std::int64_t v = 0; v < V; ++v) total += std::exp(double(row[v]) - mx);
        for (std::int64_t v = 0; v < V; ++v) out[b][v] = double(row[v]) - mx - std::log(total);
    }
    return out;
}

// Greedy decoding without a cache, as the PyTorch reference does it: re-run the decoder on the whole
// prefix each step and take the argmax of the last position (over generable ids: not pad, not BOS).
std::vector<Ids> uncached_greedy(Transformer& model, const Ids& src, std::int64_t B, std::int64_t S,
                                 const DecodeOptions& o) {
    tf::NoGradGuard no_grad;
    const ModelConfig& c = model.config;
    Tensor memory = model.encode(src, B, S, tf::Pass{});
    std::vector<Ids> out(B);
    std::vector<std::int64_t> cap(B);
    std::int64_t max_cap = 0;
    for (std::int64_t b = 0; b < B; ++b) {
        std::int64_t n = 0;
        for (std::int64_t s = 0; s < S; ++s) n += src[b * S + s] != c.pad_id;
        cap[b] = tf::max_output_length(n, o, c);
        max_cap = std::max(max_cap, cap[b]);
    }
    std::vector<bool> done(B);
    std::vector<Ids> rows(B, Ids{c.bos_id});
    for (std::int64_t b = 0; b < B; ++b) done[b] = cap[b] == 0;
    for (std::int64_t t = 0; t < max_cap; ++t) {
        Ids prefix;
        for (const auto& r : rows) prefix.insert(prefix.end(), r.begin(), r.end());
        auto logp = reference_next_logp(model, memory, src, B, S, prefix, t + 1);
        for (std::int64_t b = 0; b < B; ++b) {
            std::int32_t arg = -1;
            for (std::int32_t v = 0; v < std::int32_t(c.tgt_vocab); ++v)
                if (v != c.pad_id && v != c.bos_id && (arg < 0 || logp[b][v] > logp[b][arg])) arg = v;
            rows[b].push_back(done[b] ? c.pad_id : arg);  // a finished row keeps feeding pad (masked)
            if (done[b]) continue;
            if (arg == c.eos_id) {
                done[b] = true;
                continue;
            }
            out[b].push_back(arg);
            if (std::int64_t(out[b].size()) == cap[b]) done[b] = true;
        }
    }
    return out;
}

double max_abs(const Tensor& t) {
    double m = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(double(t.data()[i])));
    return m;
}

const std::vector<std::int64_t> kLengths = {5, 1, 9, 3, 7, 0, 9, 4};  // words per row; 0: EOS only
constexpr std::int64_t kS = 10;

}  // namespace

TEST_CASE("length cap: min(max_len_abs, floor(ratio n + offset), model max_len)", "[decode]") {
    ModelConfig c;
    c.max_len = 100;
    DecodeOptions o;  // 256, 2.0, 10
    CHECK(tf::max_output_length(0, o, c) == 10);
    CHECK(tf::max_output_length(7, o, c) == 24);
    CHECK(tf::max_output_length(60, o, c) == 100);  // the model's positional table
    o.max_len_abs = 12;
    CHECK(tf::max_output_length(7, o, c) == 12);
    o.max_len_ratio = 0.5;
    o.max_len_offset = 1;
    CHECK(tf::max_output_length(7, o, c) == 4);  // floor(4.5)
    o.max_len_abs = 0;
    CHECK(tf::max_output_length(7, o, c) == 0);
    CHECK(tf::length_penalty(1, 0.0) == 1.0);
    CHECK(tf::length_penalty(7, 1.0) == Approx(2.0));
    CHECK(tf::length_penalty(7, 0.5) == Approx(std::sqrt(2.0)));
}

TEST_CASE("cached greedy equals greedy that re-runs the decoder on the whole prefix", "[decode]") {
    for (const Variant& v : kVariants) {
        INFO(describe(v));
        auto model = tiny_model(v);
        const std::int64_t B = std::int64_t(kLengths.size());
        const Ids src = make_source(kLengths, kS, model->config.src_vocab, v.seed + 100);
        DecodeOptions o;
        o.max_len_ratio = 1.5;
        o.max_len_offset = 3;
        const auto reference = uncached_greedy(*model, src, B, kS, o);
        const auto cached = tf::translate_batch(*model, src, B, kS, o);
        REQUIRE(cached.size() == reference.size());
        for (std::int64_t b = 0; b < B; ++b) {
            INFO("row " << b);
            CHECK(cached[b] == reference[b]);
        }
    }
}

TEST_CASE("the outputs are not trivial: rows end at different steps, some with EOS, some at the cap", "[decode]") {
    // Guards the other tests against models whose greedy output is always empty or always capped.
    int ended = 0, capped = 0;
    std::vector<std::size_t> lengths;
    for (const Variant& v : kVariants) {
        auto model = tiny_model(v);
        const std::int64_t B = std::int64_t(kLengths.size());
        const Ids src = make_source(kLengths, kS, model->config.src_vocab, v.seed + 100);
        for (const Translation& tr : tf::translate_batch_scored(*model, src, B, kS, DecodeOptions{})) {
            (tr.ended ? ended : capped) += 1;
            lengths.push_back(tr.tokens.size());
        }
    }
    std::sort(lengths.begin(), lengths.end());
    const auto distinct = std::unique(lengths.begin(), lengths.end()) - lengths.begin();
    CHECK(ended > 0);
    CHECK(capped > 0);
    CHECK(distinct >= 4);
}

TEST_CASE("each cached step's logits equal model.decode's last position, also after reordering rows", "[decode]") {
    for (const Variant& v : kVariants) {
        INFO(describe(v));
        auto model = tiny_model(v, 13, 1.0);
        model->decoder[0].self_attn.gate.data()[model->decoder[0].self_attn.H - 1] = tf::real(0.5);  // exercise the head gates
        model->decoder[1].multihead_attn.gate.data()[0] = tf::real(0.25);
        tf::NoGradGuard no_grad;
        const std::int64_t B = std::int64_t(kLengths.size()), T = 9, V = model->config.tgt_vocab;
        const Ids src = make_source(kLengths, kS, V, v.seed + 200);
        // Teacher-forced decoder inputs: BOS, then random words.
        tf::Rng rng(v.seed + 300);
        Ids dec_in(B * T);
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < T; ++t) dec_in[b * T + t] = t == 0 ? 1 : std::int32_t(2 + rng.below(V - 2));
        Tensor memory = model->encode(src, B, kS, tf::Pass{});
        Tensor full = model->project(model->decode(dec_in, B, T, memory, src, kS, tf::Pass{}));  // (B, T, V)

        tf::IncrementalDecoder dec(*model, memory, src, B, kS, T);
        std::vector<std::int64_t> row_of(B);  // decoder row -> batch row of the full decode
        for (std::int64_t b = 0; b < B; ++b) row_of[b] = b;
        for (std::int64_t t = 0; t < T; ++t) {
            INFO("step " << t);
            if (t == 3) {  // reverse, duplicate row 2, drop row 5: what beam search does
                std::vector<std::int64_t> from;
                for (std::int64_t r = B - 1; r >= 0; --r)
                    if (r != 5) from.push_back(r);
                from.push_back(2);
                dec.select_rows(from);
                std::vector<std::int64_t> next;
                for (std::int64_t r : from) next.push_back(row_of[r]);
                row_of = next;
            }
            if (t == 6) {  // drop rows keeping the order (done in place)
                dec.select_rows({0, 2, 3, 6});
                row_of = {row_of[0], row_of[2], row_of[3], row_of[6]};
            }
            Ids tokens;
            for (std::int64_t b : row_of) tokens.push_back(dec_in[b * T + t]);
            Tensor step = dec.step(tokens);  // (N, V)
            REQUIRE(step.size(0) == std::int64_t(row_of.size()));
            for (std::size_t r = 0; r < row_of.size(); ++r) {
                const tf::real* want = full.data() + (row_of[r] * T + t) * V;
                const tf::real* got = step.data() + std::int64_t(r) * V;
                double scale = 0, err = 0;
                for (std::int64_t j = 0; j < V; ++j) {
                    scale = std::max(scale, std::abs(double(want[j])));
                    err = std::max(err, std::abs(double(got[j]) - double(want[j])));
                }
                CHECK(err <= 1e-5 * scale);
            }
        }
        CHECK(max_abs(full) > 0.1);
    }
}

TEST_CASE("beam search with K = 1 is greedy: same tokens, same scores", "[decode]") {
    for (const Variant& v : kVariants) {
        auto model = tiny_model(v);
        const std::int64_t B = std::int64_t(kLengths.size());
        const Ids src = make_source(kLengths, kS, model->config.src_vocab, v.seed + 400);
        for (double alpha : {0.0, 1.0}) {
            INFO(describe(v) << ", alpha " << alpha);
            DecodeOptions o;
            o.length_penalty = alpha;
            const auto greedy = tf::greedy_search(*model, src, B, kS, o);
            const auto beam = tf::beam_search(*model, src, B, kS, o);
            for (std::int64_t b = 0; b < B; ++b) {
                INFO("row " << b);
                CHECK(beam[b].tokens == greedy[b].tokens);
                CHECK(beam[b].ended == greedy[b].ended);
                CHECK(beam[b].log_prob == greedy[b].log_prob);
                CHECK(beam[b].score == greedy[b].score);
            }
        }
    }
}

TEST_CASE("beam search finds a hypothesis at least as good as greedy's", "[decode]") {
    // Not a theorem (greedy's path can fall off a beam), but it holds for these models; a failure here is
    // far more likely a bug in the scoring or the bookkeeping.
    for (const Variant& v : kVariants) {
        auto model = tiny_model(v, 13, 2.0);
        const std::int64_t B = std::int64_t(kLengths.size());
        const Ids src = make_source(kLengths, kS, model->config.src_vocab, v.seed + 500);
        for (double alpha : {0.0, 0.6, 1.0})
            for (int K : {2, 3, 5}) {
                INFO(describe(v) << ", alpha " << alpha << ", beam " << K);
                DecodeOptions o;
                o.length_penalty = alpha;
                o.beam = K;
                const auto greedy = tf::greedy_search(*model, src, B, kS, o);
                const auto beam = tf::translate_batch_scored(*model, src, B, kS, o);
                for (std::int64_t b = 0; b < B; ++b) {
                    INFO("row " << b);
                    CHECK(beam[b].score >= greedy[b].score - 1e-6 * std::abs(greedy[b].score));
                }
            }
    }
}

TEST_CASE("a beam wide enough for every sequence is exhaustive search", "[decode]") {
    // V = 6: generable ids EOS (2) and the words 3, 4, 5. Cap L = 4: the candidates are w EOS with |w| < 4
    // and the capped w with |w| = 4. K = V^L keeps every one of them.
    const std::int64_t V = 6, L = 4;
    for (const Variant& v : kVariants) {
        auto model = tiny_model(v, V, 2.0);
        const std::int64_t B = 3, S = 5;
        const Ids src = make_source({4, 2, 1}, S, V, v.seed + 600);
        DecodeOptions o;
        o.max_len_abs = int(L);
        o.beam = int(std::pow(V, L));
        tf::NoGradGuard no_grad;
        Tensor memory = model->encode(src, B, S, tf::Pass{});
        for (double alpha : {0.0, 0.6, 1.0, 3.0}) {  // a large α favours long hypotheses: a late finish
            o.length_penalty = alpha;
            const auto beam = tf::beam_search(*model, src, B, S, o);
            for (std::int64_t b = 0; b < B; ++b) {
                INFO(describe(v) << ", alpha " << alpha << ", row " << b);
                const Ids row_src(src.begin() + b * S, src.begin() + (b + 1) * S);
                Tensor row_memory = model->encode(row_src, 1, S, tf::Pass{});
                double best = -std::numeric_limits<double>::infinity();
                Ids best_tokens;
                // Depth-first over prefixes; log p of each next token by the uncached decoder.
                std::function<void(Ids&, double)> visit = [&](Ids& words, double log_prob) {
                    Ids prefix{1};
                    prefix.insert(prefix.end(), words.begin(), words.end());
                    const auto logp = reference_next_logp(*model, row_memory, row_src, 1, S, prefix,
                                                          std::int64_t(prefix.size()))[0];
                    const double ended = log_prob + logp[2];
                    const double score = ended / tf::length_penalty(std::int64_t(words.size()) + 1, alpha);
                    if (score > best) best = score, best_tokens = words;
                    for (std::int32_t w = 3; w < V; ++w) {
                        words.push_back(w);
                        if (std::int64_t(words.size()) == L) {
                            const double capped = (log_prob + logp[w]) / tf::length_penalty(L, alpha);
                            if (capped > best) best = capped, best_tokens = words;
                        } else {
                            visit(words, log_prob + logp[w]);
                        }
                        words.pop_back();
                    }
                };
                Ids words;
                visit(words, 0.0);
                CHECK(beam[b].tokens == best_tokens);
                CHECK(beam[b].score == Approx(best).epsilon(1e-5));
            }
        }
    }
}

TEST_CASE("the length cap bounds greedy and beam outputs, a row without EOS stops exactly at it", "[decode]") {
    for (const Variant& v : kVariants) {
        INFO(describe(v));
        auto model = tiny_model(v);
        const std::int64_t B = std::int64_t(kLengths.size()), V = model->config.tgt_vocab;
        const Ids src = make_source(kLengths, kS, V, v.seed + 700);
        DecodeOptions o;
        o.max_len_ratio = 0.5;
        o.max_len_offset = 1;
        o.max_len_abs = 5;
        for (int K : {1, 3}) {
            o.beam = K;
            const auto out = tf::translate_batch_scored(*model, src, B, kS, o);
            for (std::int64_t b = 0; b < B; ++b) {
                INFO("beam " << K << ", row " << b);
                const std::int64_t cap = std::min<std::int64_t>(5, (kLengths[b] + 1) / 2 + 1);  // floor(n/2 + 1)
                CHECK(std::int64_t(out[b].tokens.size()) <= cap);
                if (!out[b].ended) CHECK(std::int64_t(out[b].tokens.size()) == cap);
            }
        }
        o.beam = 1;
        o.max_len_ratio = 100;
        o.max_len_abs = 3;
        for (const Translation& tr : tf::translate_batch_scored(*model, src, B, kS, o)) {
            CHECK(tr.tokens.size() <= 3);
            if (!tr.ended) CHECK(tr.tokens.size() == 3);
        }
    }
}

TEST_CASE("force_steps runs every row for exactly N steps and matches greedy capped at N", "[decode]") {
    for (const Variant& v : kVariants) {
        INFO(describe(v));
        auto model = tiny_model(v);
        const std::int64_t B = std::int64_t(kLengths.size());
        const Ids src = make_source(kLengths, kS, model->config.src_vocab, v.seed + 800);
        DecodeOptions forced;
        forced.force_steps = 7;
        DecodeOptions capped;
        capped.max_len_abs = 7;
        const auto a = tf::translate_batch_scored(*model, src, B, kS, forced);
        const auto b = tf::translate_batch_scored(*model, src, B, kS, capped);
        REQUIRE(a.size() == std::size_t(B));
        REQUIRE(b.size() == std::size_t(B));
        for (std::int64_t r = 0; r < B; ++r) {
            CHECK(a[r].tokens == b[r].tokens);
            CHECK(a[r].log_prob == Approx(b[r].log_prob).epsilon(1e-6));
        }
    }
}

TEST_CASE("outputs keep the input order and do not depend on the other rows or the padding", "[decode]") {
    for (const Variant& v : kVariants) {
        auto model = tiny_model(v);
        const std::int64_t V = model->config.src_vocab, B = std::int64_t(kLengths.size());
        const Ids batch = make_source(kLengths, kS, V, v.seed + 900);
        for (int K : {1, 4}) {
            INFO(describe(v) << ", beam " << K);
            DecodeOptions o;
            o.beam = K;
            const auto together = tf::translate_batch_scored(*model, batch, B, kS, o);
            for (std::int64_t b = 0; b < B; ++b) {
                INFO("row " << b);
                // The same sentence alone, without padding (S = its words + EOS).
                const std::int64_t n = kLengths[b] + 1;
                const Ids alone_src(batch.begin() + b * kS, batch.begin() + b * kS + n);
                const auto alone = tf::translate_batch_scored(*model, alone_src, 1, n, o);
                CHECK(alone[0].tokens == together[b].tokens);
                CHECK(alone[0].score == Approx(together[b].score).epsilon(1e-5));
            }
        }
    }
}

TEST_CASE("decoding rejects bad options and batches with a readable message", "[decode]") {
    auto model = tiny_model(kVariants[0]);
    const Ids src = make_source({3, 2}, 5, model->config.src_vocab, 1);
    DecodeOptions o;
    o.beam = 0;
    CHECK_THROWS_WITH(tf::translate_batch(*model, src, 2, 5, o), Catch::Contains("beam"));
    o.beam = 2;
    o.force_steps = 5;
    CHECK_THROWS_WITH(tf::translate_batch(*model, src, 2, 5, o), Catch::Contains("force_steps"));
    o = DecodeOptions{};
    o.force_steps = 1000;
    CHECK_THROWS_WITH(tf::translate_batch(*model, src, 2, 5, o), Catch::Contains("max_len"));
    CHECK_THROWS_WITH(tf::translate_batch(*model, src, 3, 5, DecodeOptions{}), Catch::Contains("source ids"));
    CHECK(tf::translate_batch(*model, {}, 0, 5, DecodeOptions{}).empty());
}
