// heads similarity (heads_similarity.h): the measures on cases worked out by hand, the identities every
// head satisfies with itself, models built so that two heads are the same (or opposite, or orthogonal), and
// the command's output and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tapeformer/gradcheck.h"
#include "tapeformer/study/heads_similarity.h"
#include "head_fixtures.h"
#include "helpers.h"

using namespace tf_test;

namespace {

tf::SimilarityReport measure(std::vector<tf::Transformer*> models, const std::vector<tf::Example>& data) {
    std::vector<std::string> names;
    for (std::size_t k = 0; k < models.size(); ++k) names.push_back("m" + std::to_string(k));
    return tf::head_similarity(models, names, std::vector<std::vector<tf::Example>>(models.size(), data), {});
}

const tf::LayerSimilarity& layer(const tf::SimilarityTable& t, tf::HeadKind kind, int l) {
    for (const auto& s : t.layers)
        if (s.kind == kind && s.layer == l) return s;
    FAIL("no such attention");
    return t.layers.front();
}

// Makes head `to` of attention (kind, layer) a copy of head `from`: its rows of W_q, W_k, W_v and their
// biases; its columns of W_o multiplied by `out_sign`.
void copy_head(tf::Transformer& model, tf::HeadKind kind, int l, std::int64_t from, std::int64_t to, double out_sign) {
    tf::MultiHeadAttention& m = tf::attention_of(model, kind, l);
    const std::int64_t C = m.C, D = m.D;
    for (std::int64_t part = 0; part < 3; ++part)
        for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t src = part * C + from * D + d, dst = part * C + to * D + d;
            for (std::int64_t c = 0; c < C; ++c) m.in_proj_weight.data()[dst * C + c] = m.in_proj_weight.data()[src * C + c];
            m.in_proj_bias.data()[dst] = m.in_proj_bias.data()[src];
        }
    for (std::int64_t r = 0; r < C; ++r)
        for (std::int64_t d = 0; d < D; ++d)
            m.out_proj.weight.data()[r * C + to * D + d] = tf::real(out_sign) * m.out_proj.weight.data()[r * C + from * D + d];
}

}  // namespace

TEST_CASE("heads similarity: Jensen-Shannon by hand, symmetric, 0 for equal maps, at most ln 2", "[heads][similarity]") {
    const std::vector<tf::real> one_hot = {1, 0}, half = {0.5, 0.5}, other = {0, 1};
    // m = (0.75, 0.25): ½ ln(1/0.75) + ½ (0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25)) = ¾ ln(4/3)
    CHECK(tf::jensen_shannon(one_hot.data(), half.data(), 2) == Approx(0.75 * std::log(4.0 / 3.0)).epsilon(1e-12));
    CHECK(tf::jensen_shannon(half.data(), one_hot.data(), 2) == Approx(0.75 * std::log(4.0 / 3.0)).epsilon(1e-12));
    CHECK(tf::jensen_shannon(one_hot.data(), other.data(), 2) == Approx(std::log(2.0)).epsilon(1e-12));  // disjoint
    CHECK(tf::jensen_shannon(half.data(), half.data(), 2) == 0);
    tf::Rng rng(3);
    for (int trial = 0; trial < 50; ++trial) {
        std::vector<tf::real> p(7), q(7);
        double sp = 0, sq = 0;
        for (int k = 0; k < 7; ++k) {
            p[std::size_t(k)] = tf::real(rng.uniform() * (rng.uniform() < 0.3 ? 0 : 1));
            q[std::size_t(k)] = tf::real(rng.uniform());
            sp += p[std::size_t(k)];
            sq += q[std::size_t(k)];
        }
        if (sp == 0) p[0] = 1, sp = 1;
        for (int k = 0; k < 7; ++k) p[std::size_t(k)] /= tf::real(sp), q[std::size_t(k)] /= tf::real(sq);
        const double pq = tf::jensen_shannon(p.data(), q.data(), 7), qp = tf::jensen_shannon(q.data(), p.data(), 7);
        CHECK(pq == Approx(qp).epsilon(1e-12));
        CHECK(pq > 0);
        CHECK(pq <= std::log(2.0));
    }
}

TEST_CASE("heads similarity: subspace overlap by hand, 1 with itself in any basis, 0 when orthogonal, D/C by chance",
          "[heads][similarity]") {
    // In R²: the lines through (1, 0) and (1, 1) meet at 45°: cos² = ½.
    CHECK(tf::subspace_overlap(tf::orthonormal_rows({1, 0}, 2), tf::orthonormal_rows({1, 1}, 2), 2) == Approx(0.5).epsilon(1e-12));
    // In R³: span{e0, e1} and span{e0 + e2, e1}: bases (1,0,0), (0,1,0) and (1,0,1)/√2, (0,1,0);
    // ‖U Vᵀ‖² = (1/√2)² + 1² = 1.5, over D = 2: 0.75.
    const auto plane = tf::orthonormal_rows({1, 0, 0, 0, 1, 0}, 3), tilted = tf::orthonormal_rows({1, 0, 1, 0, 1, 0}, 3);
    CHECK(tilted.size() == 6);
    CHECK(tf::subspace_overlap(plane, tilted, 3) == Approx(0.75).epsilon(1e-12));
    // A dependent row adds nothing to the basis.
    CHECK(tf::orthonormal_rows({1, 2, 3, 2, 4, 6}, 3).size() == 3);
    CHECK(std::isnan(tf::subspace_overlap(tf::orthonormal_rows({0, 0, 0}, 3), plane, 3)));

    const std::int64_t C = 32, D = 4;
    auto random_rows = [&](std::uint64_t seed) {
        const tf::Tensor t = tf::random_tensor({D, C}, seed, -1, 1, false);
        return std::vector<double>(t.data(), t.data() + D * C);
    };
    const std::vector<double> w = random_rows(1);
    std::vector<double> mixed(std::size_t(D * C), 0);  // R w with R = a random (invertible) D × D matrix
    const std::vector<double> r = random_rows(2);
    for (std::int64_t i = 0; i < D; ++i)
        for (std::int64_t j = 0; j < D; ++j)
            for (std::int64_t c = 0; c < C; ++c) mixed[std::size_t(i * C + c)] += r[std::size_t(i * C + j)] * w[std::size_t(j * C + c)];
    CHECK(tf::subspace_overlap(tf::orthonormal_rows(w, C), tf::orthonormal_rows(w, C), C) == Approx(1).epsilon(1e-12));
    CHECK(tf::subspace_overlap(tf::orthonormal_rows(w, C), tf::orthonormal_rows(mixed, C), C) == Approx(1).epsilon(1e-9));
    std::vector<double> low(std::size_t(D * C), 0), high(std::size_t(D * C), 0);  // span{e0..e3}, span{e4..e7}
    for (std::int64_t d = 0; d < D; ++d) low[std::size_t(d * C + d)] = 1 + d, high[std::size_t(d * C + D + d)] = -2;
    CHECK(tf::subspace_overlap(tf::orthonormal_rows(low, C), tf::orthonormal_rows(high, C), C) == 0);
    double mean = 0;
    for (int trial = 0; trial < 200; ++trial)
        mean += tf::subspace_overlap(tf::orthonormal_rows(random_rows(100 + 2 * trial), C),
                                     tf::orthonormal_rows(random_rows(101 + 2 * trial), C), C) / 200;
    CHECK(mean == Approx(double(D) / double(C)).margin(0.015));  // E = D/C; the mean of 200 has sd ≈ 0.003
}

TEST_CASE("heads similarity: every head against itself: JS 0, gradient r 1, overlaps 1, cosines 1, JS symmetric",
          "[heads][similarity]") {
    tf::Transformer model(tiny_head_model(), 21);
    const tf::SimilarityReport r = measure({&model}, random_examples(8, 2));
    REQUIRE(r.models.size() == 1);
    CHECK(r.across.empty());
    CHECK(r.chance_overlap() == 0.25);
    REQUIRE(r.models[0].layers.size() == 4);
    for (const tf::LayerSimilarity& s : r.models[0].layers) {
        INFO(tf::to_char(s.kind) << ":" << s.layer);
        CHECK(s.queries > 0);
        for (std::int64_t i = 0; i < 4; ++i) {
            const std::size_t ii = std::size_t(i * 5);
            CHECK(s.js[ii] == 0);
            CHECK(s.grad_corr[ii] == Approx(1).epsilon(1e-12));
            for (const auto* m : {&s.overlap_q, &s.overlap_k, &s.overlap_v, &s.overlap_o, &s.cos_qk, &s.cos_ov})
                CHECK((*m)[ii] == Approx(1).epsilon(1e-9));
            for (std::int64_t j = 0; j < 4; ++j) {
                const std::size_t ij = std::size_t(i * 4 + j), ji = std::size_t(j * 4 + i);
                CHECK(s.js[ij] == Approx(s.js[ji]).epsilon(1e-12));
                CHECK(s.js[ij] <= std::log(2.0));
                CHECK(s.grad_corr[ij] == Approx(s.grad_corr[ji]).epsilon(1e-9));
                CHECK(s.overlap_v[ij] == Approx(s.overlap_v[ji]).epsilon(1e-9));
                if (i != j) CHECK(s.js[ij] > 1e-6);  // random heads differ
            }
        }
    }
}

TEST_CASE("heads similarity: a head copied into another is found, a copy writing the opposite has r = -1, cos OV = -1",
          "[heads][similarity]") {
    tf::Transformer model(tiny_head_model(), 22);
    copy_head(model, tf::HeadKind::E, 1, 0, 2, 1);    // E:1:2 = E:1:0
    copy_head(model, tf::HeadKind::A, 0, 3, 1, -1);   // A:0:1 = A:0:3 with W_o negated
    const tf::SimilarityReport r = measure({&model}, random_examples(8, 3));
    const tf::LayerSimilarity& e = layer(r.models[0], tf::HeadKind::E, 1);
    const std::size_t same = 0 * 4 + 2;
    CHECK(e.js[same] < 1e-9);
    CHECK(e.grad_corr[same] == Approx(1).epsilon(1e-5));
    for (const auto* m : {&e.overlap_q, &e.overlap_k, &e.overlap_v, &e.overlap_o, &e.cos_qk, &e.cos_ov})
        CHECK((*m)[same] == Approx(1).epsilon(1e-9));
    CHECK(e.js[0 * 4 + 1] > 1e-4);  // the heads not copied stay apart
    CHECK(e.overlap_q[0 * 4 + 1] < 0.9);

    // Same attention map and subspaces, opposite output: ∂L/∂o_1 = W_o^1ᵀ δ = −W_o^3ᵀ δ, so g_1 = −g_3.
    const tf::LayerSimilarity& a = layer(r.models[0], tf::HeadKind::A, 0);
    const std::size_t flip = 3 * 4 + 1;
    CHECK(a.js[flip] < 1e-9);
    CHECK(a.grad_corr[flip] == Approx(-1).epsilon(1e-5));
    CHECK(a.overlap_o[flip] == Approx(1).epsilon(1e-9));
    CHECK(a.cos_qk[flip] == Approx(1).epsilon(1e-9));
    CHECK(a.cos_ov[flip] == Approx(-1).epsilon(1e-9));

    // Orthogonal query subspaces: head 0 reads e0..e3, head 1 reads e4..e7.
    tf::MultiHeadAttention& m = tf::attention_of(model, tf::HeadKind::D, 0);
    for (std::int64_t i = 0; i < 2 * 4 * 16; ++i) m.in_proj_weight.data()[i] = 0;
    for (std::int64_t d = 0; d < 4; ++d) {
        m.in_proj_weight.data()[d * 16 + d] = tf::real(0.5 + d);
        m.in_proj_weight.data()[(4 + d) * 16 + 4 + d] = tf::real(-1);
    }
    const tf::SimilarityReport orthogonal = measure({&model}, random_examples(4, 4));
    const tf::LayerSimilarity& o = layer(orthogonal.models[0], tf::HeadKind::D, 0);
    CHECK(o.overlap_q[0 * 4 + 1] == 0);
    CHECK(o.cos_qk[0 * 4 + 1] == 0);
}

TEST_CASE("heads similarity: with uniform attention (W_q = W_k = 0) every pair of heads has JS 0", "[heads][similarity]") {
    tf::Transformer model(tiny_head_model(), 23);
    for (auto& [name, m] : model.attentions())
        for (std::int64_t i = 0; i < 2 * m->C * m->C; ++i) m->in_proj_weight.data()[i] = 0;
    const tf::SimilarityReport r = measure({&model}, random_examples(6, 5));
    for (const tf::LayerSimilarity& s : r.models[0].layers) {
        for (double js : s.js) CHECK(js < 1e-12);
        CHECK(std::isnan(s.overlap_q[1]));  // W_q^h = 0 spans nothing
        CHECK(std::isnan(s.cos_qk[1]));
    }
}

TEST_CASE("heads similarity: across models, a model against its copy gives the same head as itself, shapes must agree",
          "[heads][similarity]") {
    tf::Transformer a(tiny_head_model(), 24), b(tiny_head_model(), 24), c(tiny_head_model(), 25);
    const tf::SimilarityReport r = measure({&a, &b, &c}, random_examples(6, 6));
    REQUIRE(r.across.size() == 2);
    CHECK(r.across_data);
    CHECK(r.across[0].name == "m0 vs m1");
    for (std::size_t l = 0; l < r.across[0].layers.size(); ++l) {
        const tf::LayerSimilarity &same = r.across[0].layers[l], &mine = r.models[0].layers[l], &other = r.across[1].layers[l];
        CHECK(tf::mean_diagonal(same.js, 4) < 1e-12);
        CHECK(tf::mean_diagonal(same.overlap_k, 4) == Approx(1).epsilon(1e-9));
        for (std::size_t ij = 0; ij < 16; ++ij) {  // b is a: across equals within
            CHECK(same.overlap_q[ij] == Approx(mine.overlap_q[ij]).epsilon(1e-9));
            CHECK(same.grad_corr[ij] == Approx(mine.grad_corr[ij]).epsilon(1e-6));
        }
        CHECK(tf::mean_diagonal(other.overlap_q, 4) < 0.9);  // another initialisation
        CHECK(tf::mean_diagonal(other.js, 4) > 1e-6);
    }
    tf::ModelConfig wide = tiny_head_model();
    wide.heads = 2;
    tf::Transformer w(wide, 1);
    CHECK_THROWS_WITH(measure({&a, &w}, random_examples(2, 7)), Catch::Contains("m1") && Catch::Contains("2 heads"));
}

TEST_CASE("heads similarity: the command prints the tables and writes every matrix, bad input is one line",
          "[heads][similarity][cli]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string cli = shell_quote(TF_CLI) + " --threads 1 ";
    const std::string model = tmp / "model", err = tmp / "err";
    const std::string train = cli + "train --train-src " + shell_quote(toy + "valid.src") + " --train-tgt " +
                              shell_quote(toy + "valid.tgt") +
                              " --tokenizer word --vocab-size 0 --d-model 16 --heads 2 --ffn 32 --layers 1 --max-steps 3 --out " +
                              shell_quote(model) + " >/dev/null 2>&1";
    REQUIRE(std::system(train.c_str()) == 0);
    const std::string base = cli + "heads similarity --model " + shell_quote(model) + " --model " + shell_quote(model) +
                             " --src " + shell_quote(toy + "test.src") + " --tgt " + shell_quote(toy + "test.tgt");
    const std::string run = base + " --max-pairs 30 --json " + shell_quote(tmp / "s.json") + " >" + shell_quote(tmp / "out") +
                            " 2>" + shell_quote(err);
    REQUIRE(std::system(run.c_str()) == 0);
    const auto j = nlohmann::json::parse(read_all(tmp / "s.json"));
    CHECK(j.at("pairs") == 30);
    CHECK(j.at("chance_overlap") == 0.5);
    REQUIRE(j.at("models").size() == 2);
    REQUIRE(j.at("across").size() == 1);
    const auto& e0 = j.at("models")[0].at("layers")[0];
    CHECK(e0.at("attention") == "E:0");
    CHECK(e0.at("js").size() == 2);
    CHECK(e0.at("js")[0][0] == 0.0);
    CHECK(j.at("across")[0].at("layers")[2].at("mean_same_head").at("overlap_v").get<double>() == Approx(1));
    const std::string table = read_all(tmp / "out");
    CHECK_THAT(table, Catch::Contains("chance level") && Catch::Contains("A:0 same") && Catch::Contains("ovl Q"));

    for (const std::string& bad : {std::string(" --max-pairs -1"), std::string(" --batch-tokens 0")}) {
        INFO(bad);
        CHECK(std::system((base + bad + " >/dev/null 2>" + shell_quote(err)).c_str()) != 0);
        CHECK(split_lines(read_all(err)).size() == 1);
    }
    write_all(tmp / "empty", "");
    const std::string empty = cli + "heads similarity --model " + shell_quote(model) + " --src " + shell_quote(tmp / "empty") +
                              " --tgt " + shell_quote(tmp / "empty") + " >/dev/null 2>" + shell_quote(err);
    CHECK(std::system(empty.c_str()) != 0);
    CHECK(split_lines(read_all(err)).size() == 1);
    CHECK_THAT(read_all(err), Catch::Contains("no pair to measure"));
}
