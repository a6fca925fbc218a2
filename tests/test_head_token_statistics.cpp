// The head study's file-wide attention statistics by what the keys hold (heads.h): share on punctuation, on
// each sentence's rarest tokens (Voita et al. 2019) and attention by relative offset — on uniform attention,
// whose answers are counts, and against a plain recomputation from each pair's own attention weights.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tapeformer/data/batch.h"
#include "tapeformer/study/heads.h"
#include "head_fixtures.h"
#include "helpers.h"

using namespace tf_test;

namespace {

// Ids 4 and 5 are punctuation on both sides (the tiny model has ids 0..19).
tf::PunctuationIds punctuation_4_5() {
    tf::PunctuationIds p;
    p.source.assign(20, false);
    p.source[4] = p.source[5] = true;
    p.target = p.source;
    return p;
}

}  // namespace

TEST_CASE("heads: uniform attention puts on punctuation, rare tokens and each offset its share of the keys", "[heads]") {
    tf::Transformer model(tiny_head_model(), 7);
    for (auto& [name, m] : model.attentions())
        for (std::int64_t i = 0; i < 2 * m->C * m->C; ++i) m->in_proj_weight.data()[i] = 0;  // W_q, W_k: every score 0
    for (auto& [name, m] : model.attentions())
        for (std::int64_t i = 0; i < 2 * m->C; ++i) m->in_proj_bias.data()[i] = 0;
    // Source 4 (punctuation) 6 6 7 + EOS; 7 and 4 once in the data, 6 twice: the rarest are 4 and 7 (a tie).
    // Target 5 (punctuation) 8 8 9: with BOS, query t sees keys 0..t, the tokens from key 1 on.
    std::vector<tf::Example> data(1);
    data[0].src = {4, 6, 6, 7};
    data[0].tgt = {5, 8, 8, 9};
    tf::HeadStudyOptions opt;
    opt.punctuation = punctuation_4_5();
    const tf::HeadReport r = tf::study_heads(model, data, opt);

    // E: 5 queries, each 1/5 on each of 5 keys (4 6 6 7 EOS).
    const tf::HeadStats& e = find_head(r, "E:1:3");
    CHECK(e.punctuation_share == Approx(0.2).epsilon(1e-5));
    CHECK(e.rare_share == Approx(0.4).epsilon(1e-5));   // keys 0 and 3
    CHECK(e.rare_chance == Approx(0.4).epsilon(1e-9));  // what uniform attention gives, exactly
    CHECK(e.rare_queries == 5);
    REQUIRE(e.attention_by_offset.size() == std::size_t(2 * tf::kOffsetReach + 1));
    for (int k = -tf::kOffsetReach; k <= tf::kOffsetReach; ++k) {
        INFO("offset " << k);
        int pairs = 0;  // (i, j) with j − i = k among 5 positions
        for (int i = 0; i < 5; ++i) pairs += (i + k >= 0 && i + k < 5);
        CHECK(e.attention_by_offset[std::size_t(k + tf::kOffsetReach)] == Approx(pairs * 0.2 / 5).margin(1e-6));
    }
    // A: the same keys for every target query.
    const tf::HeadStats& a = find_head(r, "A:0:0");
    CHECK(a.punctuation_share == Approx(0.2).epsilon(1e-5));
    CHECK(a.rare_share == Approx(0.4).epsilon(1e-5));
    CHECK(a.attention_by_offset.empty());
    // D: query 0 sees BOS only (no token: no rare key); query t ≥ 1 sees BOS and target tokens 1..t.
    // Counts in the data: 5 once, 8 twice, 9 once. t = 1: {5} rarest; t = 2: {5}; t = 3: {5}; t = 4: {5, 9}.
    const tf::HeadStats& d = find_head(r, "D:0:1");
    CHECK(d.rare_queries == 4);
    const double rare = (1.0 / 2 + 1.0 / 3 + 1.0 / 4 + 2.0 / 5) / 4;
    CHECK(d.rare_share == Approx(rare).epsilon(1e-5));
    CHECK(d.rare_chance == Approx(rare).epsilon(1e-9));
    // punctuation 5 is key 1, seen by queries 1..4 with 1/(t+1); query 0 sees none: mean over all 5 queries
    CHECK(d.punctuation_share == Approx((1.0 / 2 + 1.0 / 3 + 1.0 / 4 + 1.0 / 5) / 5).epsilon(1e-5));
    // offset 0 gets 1/(t+1) from every query; offsets above 0 nothing (causal)
    CHECK(d.attention_by_offset[std::size_t(tf::kOffsetReach)] == Approx((1 + 1.0 / 2 + 1.0 / 3 + 1.0 / 4 + 1.0 / 5) / 5).epsilon(1e-5));
    for (int k = 1; k <= tf::kOffsetReach; ++k) CHECK(d.attention_by_offset[std::size_t(k + tf::kOffsetReach)] == 0);

    // Voita et al.'s filter: with the 2 most frequent source types left out (6, then 4 before 7 by id), the
    // sentence's rarest (4 and 7, the first of them 4) is among them and no E or A query counts.
    opt.rare_outside_top = 2;
    const tf::HeadReport filtered = tf::study_heads(model, data, opt);
    CHECK(find_head(filtered, "E:0:0").rare_queries == 0);
    CHECK(find_head(filtered, "E:0:0").rare_share == 0);
    CHECK(find_head(filtered, "A:0:0").rare_queries == 0);
}

TEST_CASE("heads: the file's punctuation, rare-token and offset statistics are the means of each pair's own",
          "[heads]") {
    tf::Transformer model(tiny_head_model(), 11);
    const auto data = random_examples(12, 13);
    tf::HeadStudyOptions opt;
    opt.batch_tokens = 30;  // several batches, unlike the one-pair passes below
    opt.punctuation = punctuation_4_5();
    opt.rare_outside_top = 2;
    const tf::HeadReport r = tf::study_heads(model, data, opt);
    REQUIRE(r.batches > 1);

    // Token counts per side, and the two most frequent types (ties by id) the rare measure leaves out.
    std::map<int, int> src_count, tgt_count;
    for (const auto& e : data) {
        for (int id : e.src) ++src_count[id];
        for (int id : e.tgt) ++tgt_count[id];
    }
    auto top2 = [](const std::map<int, int>& count) {
        std::vector<std::pair<int, int>> v;  // (−count, id)
        for (const auto& [id, c] : count) v.push_back({-c, id});
        std::sort(v.begin(), v.end());
        return std::vector<int>{v[0].second, v[1].second};
    };
    const std::vector<int> src_top = top2(src_count), tgt_top = top2(tgt_count);

    struct Sums {
        double queries = 0, punctuation = 0, rare = 0, rare_argmax = 0, rare_chance = 0, rare_queries = 0;
        std::vector<double> offset = std::vector<double>(2 * tf::kOffsetReach + 1, 0.0);
    };
    std::map<std::string, Sums> sums;
    for (std::int64_t i = 0; i < std::int64_t(data.size()); ++i) {
        const tf::Batch b = tf::make_batch(data, {i});
        const auto gated = tf::gated_pass(model, b, 0);
        for (const auto& at : gated) {
            const bool decoder = at.kind == tf::HeadKind::D, cross = at.kind == tf::HeadKind::A;
            // keys' tokens: the source (+ EOS, no token), or BOS (no token) + the target
            std::vector<int> keys;
            if (decoder) {
                keys.push_back(-1);
                for (int id : data[std::size_t(i)].tgt) keys.push_back(id);
            } else {
                for (int id : data[std::size_t(i)].src) keys.push_back(id);
                keys.push_back(-1);
            }
            const std::map<int, int>& count = decoder ? tgt_count : src_count;
            const std::vector<int>& top = decoder ? tgt_top : src_top;
            const std::int64_t H = at.weights.size(1), Tq = at.weights.size(2), Tk = at.weights.size(3);
            for (std::int64_t h = 0; h < H; ++h) {
                Sums& s = sums[tf::HeadId{at.kind, at.layer, int(h)}.str()];
                for (std::int64_t t = 0; t < Tq; ++t) {
                    const float* w = at.weights.data() + (h * Tq + t) * Tk;
                    const std::int64_t visible = decoder ? t + 1 : Tk;
                    s.queries += 1;
                    int fewest = 1 << 30;
                    std::int64_t argmax = 0;
                    for (std::int64_t j = 0; j < visible; ++j) {
                        if (keys[std::size_t(j)] >= 0) fewest = std::min(fewest, count.at(keys[std::size_t(j)]));
                        if (keys[std::size_t(j)] == 4 || keys[std::size_t(j)] == 5) s.punctuation += w[j];
                        if (!cross) s.offset[std::size_t(std::clamp<std::int64_t>(j - t, -tf::kOffsetReach, tf::kOffsetReach) + tf::kOffsetReach)] += w[j];
                        if (w[j] > w[argmax]) argmax = j;
                    }
                    if (fewest == 1 << 30) continue;  // the decoder's first query sees BOS alone
                    std::vector<std::int64_t> rarest;
                    for (std::int64_t j = 0; j < visible; ++j)
                        if (keys[std::size_t(j)] >= 0 && count.at(keys[std::size_t(j)]) == fewest) rarest.push_back(j);
                    const int rarest_id = keys[std::size_t(rarest.front())];
                    if (std::find(top.begin(), top.end(), rarest_id) != top.end()) continue;  // too frequent
                    s.rare_queries += 1;
                    for (std::int64_t j : rarest) s.rare += w[j];
                    s.rare_argmax += std::find(rarest.begin(), rarest.end(), argmax) != rarest.end();
                    s.rare_chance += double(rarest.size()) / double(visible);
                }
            }
        }
    }
    for (const tf::HeadStats& st : r.heads) {
        const Sums& s = sums.at(st.id.str());
        INFO(st.id.str());
        CHECK(st.punctuation_share == Approx(s.punctuation / s.queries).epsilon(1e-5));
        REQUIRE(s.rare_queries > 0);
        CHECK(double(st.rare_queries) == s.rare_queries);
        CHECK(st.rare_share == Approx(s.rare / s.rare_queries).epsilon(1e-5));
        CHECK(st.rare_argmax_share == Approx(s.rare_argmax / s.rare_queries).epsilon(1e-9));
        CHECK(st.rare_chance == Approx(s.rare_chance / s.rare_queries).epsilon(1e-9));
        if (st.id.kind == tf::HeadKind::A) {
            CHECK(st.attention_by_offset.empty());
            continue;
        }
        for (std::size_t k = 0; k < s.offset.size(); ++k) CHECK(st.attention_by_offset[k] == Approx(s.offset[k] / s.queries).margin(1e-6));
    }
}
