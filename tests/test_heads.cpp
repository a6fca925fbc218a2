// tapeformer heads (heads.h): head specs, masking, importance at each granularity, gradient norms and
// attention statistics on cases whose answer is known, and the command's files and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <string>

#include "tapeformer/io.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/study/ablation.h"
#include "tapeformer/study/heads.h"
#include "tapeformer/study/prune.h"
#include "tapeformer/safetensors.h"
#include "head_fixtures.h"
#include "helpers.h"

using namespace tf_test;

TEST_CASE("heads: specs are parsed, and every malformed or missing head is named", "[heads]") {
    const tf::ModelConfig c = tiny_head_model();
    const auto heads = tf::parse_head_list("E:0:1,A:0:3,D:0:0,E:0:1", c);
    REQUIRE(heads.size() == 3);  // duplicates once
    CHECK(heads[1].str() == "A:0:3");
    auto error = [&](const std::string& spec) {
        try {
            tf::parse_head_list(spec, c);
        } catch (const std::invalid_argument& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK_THAT(error("X:0:1"), Catch::Contains("'X:0:1'") && Catch::Contains("E (encoder"));
    CHECK_THAT(error("E:2:0"), Catch::Contains("layers 0..1"));
    CHECK_THAT(error("D:1:0"), Catch::Contains("layers 0..0"));
    CHECK_THAT(error("E:0:4"), Catch::Contains("heads 0..3"));
    CHECK_THAT(error("E:0"), Catch::Contains("KIND:layer:head"));
    CHECK_THAT(error("E:0:-1"), Catch::Contains("number >= 0"));
    for (const char* spec : {"E:+0:1", "E:0: 1", "E:0:1x", "E:0:99999999999"})  // only digits, and no overflow
        CHECK_THAT(error(spec), Catch::Contains("must be a number >= 0, got"));
    CHECK_THAT(error("E:0:1,,A:0:0"), Catch::Contains("empty item"));
    CHECK_THAT(error(""), Catch::Contains("names no head"));
    CHECK(tf::parse_head_kinds("A,E,A") == std::vector<tf::HeadKind>{tf::HeadKind::A, tf::HeadKind::E});
    CHECK_THROWS_WITH(tf::parse_head_kinds("E,X"), Catch::Contains("got 'X'"));
}

TEST_CASE("heads: importance is normalised per layer, batch importance is <W_o^h, dL/dW_o^h>, b_k gets none",
          "[heads]") {
    tf::Transformer model(tiny_head_model(), 3);
    const auto data = random_examples(12, 5);
    tf::HeadStudyOptions opt;
    opt.batch_tokens = 100000;  // one batch: the batch granularity is then one gate gradient per head
    opt.granularity = tf::Granularity::batch;
    const tf::HeadReport r = tf::study_heads(model, data, opt);
    REQUIRE(r.heads.size() == std::size_t(4 * (2 + 1 + 1)));
    CHECK(r.batches == 1);
    CHECK(r.pairs == 12);
    for (const char* layer : {"E:0:", "E:1:", "D:0:", "A:0:"}) {
        double sq = 0;
        for (int h = 0; h < 4; ++h) sq += std::pow(find_head(r, layer + std::to_string(h)).importance, 2);
        CHECK(sq == Approx(1.0).epsilon(1e-9));
    }
    // After the study the parameters hold ∂L/∂θ of the summed NLL: the identity can be checked on them.
    for (const auto& [kind, layer] : {std::pair{tf::HeadKind::E, 1}, {tf::HeadKind::A, 0}}) {
        const tf::MultiHeadAttention& m = tf::attention_of(model, kind, layer);
        for (int h = 0; h < 4; ++h) {
            double frobenius = 0;
            for (std::int64_t row = 0; row < m.C; ++row)
                for (std::int64_t k = h * m.D; k < (h + 1) * m.D; ++k)
                    frobenius += double(m.out_proj.weight.data()[row * m.C + k]) * m.out_proj.weight.grad()[row * m.C + k];
            const tf::HeadStats& s = find_head(r, tf::HeadId{kind, layer, h}.str());
            INFO(s.id.str());
            CHECK(s.importance_raw == Approx(std::fabs(frobenius)).epsilon(1e-4));
            CHECK(s.importance_signed_raw == Approx(frobenius).epsilon(1e-4));  // its sign too
            CHECK(s.grad_bk < 1e-4 * s.grad_bq);  // float32 rounding only
            CHECK(s.grad_wo > 0);
        }
    }
    CHECK(model.encoder[0].self_attn.gate.shape() == tf::Shape{1, 4, 1, 1});  // the model's gates are back
}

TEST_CASE("heads: token importance is at least sentence importance, which is at least batch importance", "[heads]") {
    tf::Transformer model(tiny_head_model(), 4);
    const auto data = random_examples(10, 6);
    tf::HeadStudyOptions opt;
    opt.batch_tokens = 100000;
    opt.normalise = false;
    std::vector<tf::HeadReport> r;
    for (auto g : {tf::Granularity::token, tf::Granularity::sentence, tf::Granularity::batch}) {
        opt.granularity = g;
        r.push_back(tf::study_heads(model, data, opt));
    }
    // |Σ| ≤ Σ|·|: per head, N_q·token ≥ B·sentence ≥ 1·batch (the sums of absolute values shrink as the
    // absolute value moves outwards).
    for (std::size_t i = 0; i < r[0].heads.size(); ++i) {
        INFO(r[0].heads[i].id.str());
        const double n_q = double(r[0].heads[i].id.kind == tf::HeadKind::E ? r[0].src_tokens : r[0].tgt_tokens);
        CHECK(r[0].heads[i].importance_raw * n_q >= r[1].heads[i].importance_raw * 10 * (1 - 1e-9));
        CHECK(r[1].heads[i].importance_raw * 10 >= r[2].heads[i].importance_raw * (1 - 1e-9));
        // The signed sum has no absolute value to move: the same Σ ∂L/∂ξ at every granularity, over its N.
        CHECK(r[0].heads[i].importance_signed_raw * n_q == Approx(r[2].heads[i].importance_signed_raw).epsilon(1e-6));
        CHECK(r[1].heads[i].importance_signed_raw * 10 == Approx(r[2].heads[i].importance_signed_raw).epsilon(1e-6));
    }
}

TEST_CASE("heads: token and sentence importance do not depend on --batch-tokens, batch importance does",
          "[heads]") {
    tf::Transformer model(tiny_head_model(), 4);
    const auto data = random_examples(10, 6);
    tf::HeadStudyOptions opt;
    opt.normalise = false;
    auto study = [&](tf::Granularity g, std::int64_t batch_tokens) {
        opt.granularity = g;
        opt.batch_tokens = batch_tokens;
        return tf::study_heads(model, data, opt);
    };
    for (auto g : {tf::Granularity::token, tf::Granularity::sentence}) {
        const auto one = study(g, 100000), many = study(g, 30);
        REQUIRE(many.batches > 1);
        for (std::size_t i = 0; i < one.heads.size(); ++i)
            CHECK(one.heads[i].importance_raw == Approx(many.heads[i].importance_raw).epsilon(1e-5));
    }
    const auto one = study(tf::Granularity::batch, 100000), many = study(tf::Granularity::batch, 30);
    double largest_change = 0;
    for (std::size_t i = 0; i < one.heads.size(); ++i)
        largest_change = std::max(largest_change, std::fabs(one.heads[i].importance_raw - many.heads[i].importance_raw) /
                                                      std::max(one.heads[i].importance_raw, 1e-12));
    CHECK(largest_change > 1e-3);  // as docs/usage.md says: compare batch results at one --batch-tokens only
}

TEST_CASE("heads: with zero query/key weights every head attends uniformly, and the statistics say so", "[heads]") {
    tf::Transformer model(tiny_head_model(), 7);
    for (auto& [name, m] : model.attentions())
        for (std::int64_t i = 0; i < 2 * m->C * m->C; ++i) m->in_proj_weight.data()[i] = 0;  // W_q, W_k
    for (auto& [name, m] : model.attentions())
        for (std::int64_t i = 0; i < 2 * m->C; ++i) m->in_proj_bias.data()[i] = 0;
    std::vector<tf::Example> data(1);
    data[0].src = {5, 6, 7, 8};   // S = 5 with EOS
    data[0].tgt = {9, 10, 11};    // T = 4 with BOS
    const tf::HeadReport r = tf::study_heads(model, data, {});
    const tf::HeadStats& e = find_head(r, "E:0:2");
    CHECK(e.entropy == Approx(std::log(5.0)).epsilon(1e-5));
    CHECK(e.entropy_normalised == Approx(1.0).epsilon(1e-5));
    CHECK(e.eos_share == Approx(0.2).epsilon(1e-5));
    CHECK(e.confidence == Approx(0.2).epsilon(1e-5));
    CHECK(e.mean_distance == Approx(40.0 / 25).epsilon(1e-5));  // Σ_i Σ_j |i − j| / 25 over 5 positions
    // The causal decoder: query t sees t + 1 keys with weight 1/(t+1) each.
    const tf::HeadStats& d = find_head(r, "D:0:0");
    double entropy = 0, distance = 0, bos = 0;
    for (int t = 0; t < 4; ++t) {
        entropy += std::log(t + 1.0);
        bos += 1.0 / (t + 1);
        distance += t / 2.0;  // Σ_j (t − j)/(t + 1) for j ≤ t
    }
    CHECK(d.entropy == Approx(entropy / 4).epsilon(1e-5));
    CHECK(d.entropy_normalised == Approx(1.0).epsilon(1e-5));  // over the 3 queries with 2+ keys
    CHECK(d.bos_share == Approx(bos / 4).epsilon(1e-5));
    CHECK(d.mean_distance == Approx(distance / 4).epsilon(1e-5));
    CHECK(d.eos_share == 0);
}

TEST_CASE("heads: masking every head of a layer leaves its attention output equal to the out-projection bias",
          "[heads]") {
    tf::Transformer model(tiny_head_model(), 8);
    tf::mask_heads(model, tf::parse_head_list("E:1:0,E:1:1,E:1:2,E:1:3", model.config));
    tf::MultiHeadAttention& m = tf::attention_of(model, tf::HeadKind::E, 1);
    for (std::int64_t i = 0; i < m.out_proj.bias.numel(); ++i) m.out_proj.bias.data()[i] = tf::real(0.1 * i);
    tf::Tensor x = tf::random_tensor({2, 3, 16}, 1, -1, 1, false);
    tf::Tensor y = m.forward(x, x, tf::Tensor(), tf::Pass{});
    for (std::int64_t r = 0; r < 6; ++r)
        for (std::int64_t i = 0; i < 16; ++i) CHECK(y.data()[r * 16 + i] == Approx(0.1 * i).margin(1e-6));
    tf::mask_heads(model, {});
    CHECK(m.gate.to_vector() == std::vector<tf::real>(4, 1));
}

TEST_CASE("heads: the command writes heads.json and heads.csv for every head, bad input is one line on stderr",
          "[heads][cli]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string cli = shell_quote(TF_CLI) + " --threads 1 ";
    const std::string model = train_tiny_model(tmp, 3), out = tmp / "heads", err = tmp / "err";
    const std::string heads = cli + "heads --model " + shell_quote(model) + " --src " + shell_quote(toy + "test.src") +
                              " --tgt " + shell_quote(toy + "test.tgt") + " --out " + shell_quote(out) +
                              " --mask-heads A:0:1 >" + shell_quote(tmp / "table") + " 2>" + shell_quote(err);
    REQUIRE(std::system(heads.c_str()) == 0);
    const auto j = nlohmann::json::parse(read_all(out + "/heads.json"));
    CHECK(j.at("pairs") == 1000);
    REQUIRE(j.at("heads").size() == 6);  // E, D, A × 1 layer × 2 heads
    CHECK(j.at("heads")[5].at("head") == "A:0:1");
    CHECK(split_lines(read_all(out + "/heads.csv")).size() == 7);
    // What the file was made from: the model's file and checksum, the data, the masked head.
    const auto& made = j.at("made_from");
    CHECK(made.at("model") == model);
    CHECK(made.at("weights") == model + "/model.safetensors");
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", tf::crc32c(read_all(model + "/model.safetensors")));
    CHECK(made.at("weights_checksum") == std::string("crc32c:") + hex);
    CHECK(made.at("data") == nlohmann::json::array({toy + "test.src", toy + "test.tgt"}));
    CHECK(made.at("pairs_read") == 1000);
    CHECK(made.at("pairs_used") == 1000);
    CHECK(made.at("masked_heads") == nlohmann::json::array({"A:0:1"}));
    for (const auto& h : j.at("heads")) {
        CHECK(h.at("masked").get<bool>() == (h.at("head") == "A:0:1"));
        // |mean| <= mean of |.|: the signed importance never exceeds the absolute one in size.
        CHECK(std::fabs(h.at("importance_signed_raw").get<double>()) <= h.at("importance_raw").get<double>() + 1e-12);
    }
    CHECK_THAT(read_all(tmp / "table"), Catch::Contains("A = encoder-decoder (cross) attention"));

    for (const std::string& bad : {std::string(" --mask-heads A:3:0"), std::string(" --granularity word")}) {
        INFO(bad);
        const std::string cmd = cli + "heads --model " + shell_quote(model) + " --src " + shell_quote(toy + "test.src") +
                                " --tgt " + shell_quote(toy + "test.tgt") + " --out " + shell_quote(tmp / "x") + bad +
                                " >/dev/null 2>" + shell_quote(err);
        CHECK(std::system(cmd.c_str()) != 0);
        CHECK(split_lines(read_all(err)).size() == 1);
        CHECK_FALSE(std::filesystem::exists(tmp / "x"));
    }
    write_all(tmp / "empty.src", "");
    write_all(tmp / "empty.tgt", "");
    const std::string empty = cli + "heads --model " + shell_quote(model) + " --src " + shell_quote(tmp / "empty.src") +
                              " --tgt " + shell_quote(tmp / "empty.tgt") + " --out " + shell_quote(tmp / "x") +
                              " >/dev/null 2>" + shell_quote(err);
    CHECK(std::system(empty.c_str()) != 0);
    CHECK_THAT(read_all(err), Catch::Contains("no pair to study"));
}

TEST_CASE("heads: importance and gradient norms equal PyTorch's (tests/golden/*/heads.safetensors)", "[heads][golden]") {
    for (const std::string name : {"post_untied", "pre_tied_decoder", "post_tied_all"}) {
        INFO("config " << name);
        const std::string dir = std::string(TF_SOURCE_DIR) + "/tests/golden/" + name + "/";
        const tf::SafetensorsFile weights = tf::load_safetensors(dir + "weights.safetensors");
        const tf::SafetensorsFile expected = tf::load_safetensors(dir + "heads.safetensors");
        const auto batch = nlohmann::json::parse(read_all(dir + "batch.json"));
        tf::Transformer model(tf::model_config_from_metadata(weights.metadata));
        tf::load_into(model.parameters(), weights);
        std::vector<tf::Example> data;  // the batch's rows as pairs: source tokens before EOS, target tokens before EOS
        for (std::size_t b = 0; b < batch.at("src").size(); ++b) {
            tf::Example e;
            for (int x : batch.at("src")[b]) {
                if (x == model.config.eos_id) break;
                e.src.push_back(x);
            }
            for (int x : batch.at("target")[b]) {
                if (x == model.config.eos_id) break;
                e.tgt.push_back(x);
            }
            data.push_back(e);
        }
        tf::HeadStudyOptions opt;
        opt.normalise = false;
        for (auto g : {tf::Granularity::token, tf::Granularity::sentence, tf::Granularity::batch}) {
            opt.granularity = g;
            const tf::HeadReport r = tf::study_heads(model, data, opt);
            CHECK(r.batches == 1);
            for (const char kind : {'E', 'D', 'A'}) {
                const int layers = int(kind == 'E' ? model.config.enc_layers : model.config.dec_layers);
                for (int l = 0; l < layers; ++l) {
                    const std::string key = std::string(1, kind) + "." + std::to_string(l) + ".";
                    auto ours = [&](auto field) {
                        std::vector<tf::real> v;
                        for (const auto& h : r.heads)
                            if (tf::to_char(h.id.kind) == kind && h.id.layer == l) v.push_back(tf::real(field(h)));
                        return v;
                    };
                    auto check = [&](const std::string& what, const std::vector<tf::real>& got) {
                        const auto& want = expected.tensors.at(key + what).values;
                        REQUIRE(got.size() == want.size());
                        double diff = 0, scale = 0;
                        for (std::size_t i = 0; i < got.size(); ++i) {
                            diff = std::max(diff, std::fabs(double(got[i]) - double(want[i])));
                            scale = std::max(scale, std::fabs(double(want[i])));
                        }
                        INFO(key << what << ": max diff " << diff << " of " << scale);
                        CHECK(diff <= 1e-4 * scale);
                    };
                    check(std::string("importance_") + tf::to_string(g), ours([](const tf::HeadStats& h) { return h.importance_raw; }));
                    check("grad_wq", ours([](const tf::HeadStats& h) { return h.grad_wq; }));
                    check("grad_wk", ours([](const tf::HeadStats& h) { return h.grad_wk; }));
                    check("grad_wv", ours([](const tf::HeadStats& h) { return h.grad_wv; }));
                    check("grad_wo", ours([](const tf::HeadStats& h) { return h.grad_wo; }));
                    check("grad_bq", ours([](const tf::HeadStats& h) { return h.grad_bq; }));
                    check("grad_bv", ours([](const tf::HeadStats& h) { return h.grad_bv; }));
                }
            }
        }
    }
}

TEST_CASE("heads: paired bootstrap p-values: a real improvement is significant, noise and no change are not",
          "[heads][ablate]") {
    std::vector<std::string> refs, perfect, half, nearly;
    for (int i = 0; i < 200; ++i) {
        const std::string ref = "the dog number " + std::to_string(i) + " sees a small cat near the house .";
        refs.push_back(ref);
        perfect.push_back(ref);
        half.push_back(i % 2 ? ref : "a cat walks .");
        nearly.push_back(i == 7 ? "the dog number 7 sees a cat near the house ." : ref);
    }
    auto stats = [&](const std::vector<std::string>& hyps) {
        std::vector<tf::BleuScore> out;
        for (std::size_t i = 0; i < hyps.size(); ++i) out.push_back(tf::corpus_bleu({hyps[i]}, {refs[i]}));
        return out;
    };
    const auto p_half = tf::paired_bootstrap_p_value(stats(perfect), stats(half), 500, 1);
    CHECK(p_half == Approx(1.0 / 501));  // every resample shows the gap
    CHECK(tf::paired_bootstrap_p_value(stats(perfect), stats(perfect), 500, 1) == 1.0);
    CHECK(tf::paired_bootstrap_p_value(stats(perfect), stats(nearly), 500, 1) > 0.05);  // one word in 200 lines
    CHECK(tf::paired_bootstrap_p_value(stats(perfect), stats(nearly), 500, 1) ==
          tf::paired_bootstrap_p_value(stats(perfect), stats(nearly), 500, 1));  // seeded
    CHECK_THROWS_WITH(tf::paired_bootstrap_p_value(stats(perfect), {}, 500, 1), Catch::Contains("same"));
}

TEST_CASE("heads: Holm and Benjamini-Hochberg adjusted p-values equal R's p.adjust, in the input's order",
          "[heads][ablate]") {
    // Worked by hand: sorted 0.005 (4th), 0.01 (1st), 0.03 (3rd), 0.04 (2nd), m = 4.
    // Holm: 4·0.005 = 0.02, max(0.02, 3·0.01) = 0.03, max(0.03, 2·0.03) = 0.06, max(0.06, 1·0.04) = 0.06.
    // BH: 4·0.005/1 = 0.02, 4·0.01/2 = 0.02, 4·0.03/3 = 0.04, 4·0.04/4 = 0.04; running minimum from the top.
    const std::vector<double> p = {0.01, 0.04, 0.03, 0.005};
    const auto holm = tf::holm_adjusted(p), bh = tf::benjamini_hochberg_adjusted(p);
    const std::vector<double> want_holm = {0.03, 0.06, 0.06, 0.02}, want_bh = {0.02, 0.04, 0.04, 0.02};
    for (std::size_t i = 0; i < p.size(); ++i) {
        CHECK(holm[i] == Approx(want_holm[i]));
        CHECK(bh[i] == Approx(want_bh[i]));
    }
    // Adjusted values never exceed 1 and never fall below the raw ones.
    const std::vector<double> big = {0.5, 0.9, 0.2};
    for (double q : tf::holm_adjusted(big)) CHECK(q <= 1.0);
    const auto bh_big = tf::benjamini_hochberg_adjusted(big);
    for (std::size_t i = 0; i < big.size(); ++i) CHECK(bh_big[i] >= big[i]);
    CHECK(tf::holm_adjusted({}).empty());
}

TEST_CASE("heads: the paired bootstrap's intervals cover the real difference and shrink to it when it is constant",
          "[heads][ablate]") {
    std::vector<std::string> refs, half;
    for (int i = 0; i < 200; ++i) {
        const std::string ref = "the dog number " + std::to_string(i) + " sees a small cat near the house .";
        refs.push_back(ref);
        half.push_back(i % 2 ? ref : "a cat walks .");
    }
    tf::SentenceScores base, sys;
    for (std::size_t i = 0; i < refs.size(); ++i) {
        base.bleu.push_back(tf::corpus_bleu({refs[i]}, {refs[i]}));
        sys.bleu.push_back(tf::corpus_bleu({half[i]}, {refs[i]}));
        // Every sentence 10 tokens; the system's NLL is 0.5 nats/token higher on each: ΔNLL is 0.5 in every
        // resample, so its interval is [0.5, 0.5] whatever is drawn.
        base.nll.push_back({1.0 * 10, 10});
        sys.nll.push_back({1.5 * 10, 10});
    }
    const auto c = tf::paired_bootstrap(base, sys, 400, 0.95, 7);
    const double real = tf::corpus_bleu(half, refs).score - 100.0;
    CHECK(c.delta_bleu.low <= real);
    CHECK(c.delta_bleu.high >= real);
    CHECK(c.delta_bleu.high < 0);  // half the sentences wrong: every resample loses BLEU
    CHECK(c.delta_nll.low == Approx(0.5));
    CHECK(c.delta_nll.high == Approx(0.5));
    CHECK(c.p_value == tf::paired_bootstrap_p_value(base.bleu, sys.bleu, 400, 7));  // the same resamples
    // A wider confidence gives a wider interval.
    const auto wide = tf::paired_bootstrap(base, sys, 400, 0.99, 7);
    CHECK(wide.delta_bleu.low <= c.delta_bleu.low);
    CHECK(wide.delta_bleu.high >= c.delta_bleu.high);
    CHECK_THROWS_WITH(tf::paired_bootstrap(base, sys, 400, 1.0, 7), Catch::Contains("confidence"));
    sys.nll.pop_back();
    CHECK_THROWS_WITH(tf::paired_bootstrap(base, sys, 400, 0.95, 7), Catch::Contains("same"));
}

TEST_CASE("heads: per-sentence NLL sums to the teacher-forced loss's NLL, whatever the batching",
          "[heads][ablate]") {
    tf::Transformer model(tf_test::tiny_model_config(13, 16, 2, 32, 1, 1, 16), 3);
    std::vector<tf::Example> examples;
    for (int i = 0; i < 9; ++i) {
        tf::Example e;
        for (int t = 0; t < 1 + i % 5; ++t) e.src.push_back(3 + (i + t) % 10);
        for (int t = 0; t < 2 + i % 4; ++t) e.tgt.push_back(3 + (2 * i + t) % 10);
        examples.push_back(e);
    }
    const tf::LossReport mean = tf::teacher_forced_loss(model, examples, 4096, 0.0);
    for (std::int64_t batch_tokens : {4096, 12, 1}) {
        INFO("batch tokens " << batch_tokens);
        const auto each = tf::per_example_nll(model, examples, batch_tokens);
        REQUIRE(each.size() == examples.size());
        double sum = 0;
        std::int64_t tokens = 0;
        for (std::size_t i = 0; i < each.size(); ++i) {
            CHECK(each[i].tokens == std::int64_t(examples[i].tgt.size() + 1));  // the tokens and EOS
            CHECK(each[i].nll_sum > 0);
            sum += each[i].nll_sum;
            tokens += each[i].tokens;
        }
        CHECK(tokens == mean.tokens);
        CHECK(sum / double(tokens) == Approx(mean.nll).epsilon(1e-5));
    }
}

TEST_CASE("heads ablate: one row per head and per all-but-one, with BLEU, delta and p, bad input named",
          "[heads][ablate][cli]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string cli = shell_quote(TF_CLI) + " --threads 1 ";
    const std::string model = train_tiny_model(tmp, 3), err = tmp / "err";
    const auto src = split_lines(read_all(toy + "test.src")), ref = split_lines(read_all(toy + "test.tgt"));
    write_all(tmp / "s", join_lines({src.begin(), src.begin() + 40}));
    write_all(tmp / "r", join_lines({ref.begin(), ref.begin() + 40}));
    const std::string ablate = cli + "heads ablate --model " + shell_quote(model) + " --src " + shell_quote(tmp / "s") +
                               " --ref " + shell_quote(tmp / "r") + " --samples 50 --json " + shell_quote(tmp / "a.json") +
                               " >" + shell_quote(tmp / "table") + " 2>" + shell_quote(err);
    REQUIRE(std::system(ablate.c_str()) == 0);
    const auto j = nlohmann::json::parse(read_all(tmp / "a.json"));
    REQUIRE(j.at("single").size() == 6);
    REQUIRE(j.at("all_but_one").size() == 6);
    CHECK(j.at("single")[0].at("masked") == nlohmann::json::array({"E:0:0"}));
    CHECK(j.at("all_but_one")[0].at("masked") == nlohmann::json::array({"E:0:1"}));
    CHECK(j.at("samples") == 50);
    CHECK(j.at("seed") == 12345);
    CHECK(j.at("family_size") == 12);
    CHECK(j.at("sentences") == 40);
    CHECK(j.at("nll_sentences").get<int>() > 0);
    CHECK(j.at("base_nll").get<double>() > 0);
    for (const char* table : {"single", "all_but_one"})
        for (const auto& row : j.at(table)) {
            const double p = row.at("p_value"), holm = row.at("p_holm"), bh = row.at("p_bh");
            CHECK(p > 0);
            CHECK(p <= 1);
            CHECK(holm >= p);  // corrections only raise p
            CHECK(holm <= 1);
            CHECK(bh >= p);
            CHECK(bh <= holm);  // Holm is the stricter of the two
            CHECK(row.at("significant_holm").get<bool>() == (holm < 0.05));
            CHECK(row.at("delta").get<double>() == Approx(row.at("bleu").get<double>() - j.at("base_bleu").get<double>()));
            CHECK(row.at("delta_nll").get<double>() ==
                  Approx(row.at("nll").get<double>() - j.at("base_nll").get<double>()));
            CHECK(row.at("delta_ci")[0].get<double>() <= row.at("delta_ci")[1].get<double>());
            CHECK(row.at("delta_nll_ci")[0].get<double>() <= row.at("delta_nll_ci")[1].get<double>());
        }
    const std::string table = read_all(tmp / "table");
    CHECK_THAT(table, Catch::Contains("of 6 uncorrected"));
    CHECK_THAT(table, Catch::Contains("after Holm"));
    CHECK_THAT(table, Catch::Contains("seed 12345"));
    const std::string missing = cli + "heads ablate --model " + shell_quote(model) + " --src " + shell_quote(tmp / "s") +
                                " 2>" + shell_quote(err);
    CHECK(std::system(missing.c_str()) != 0);
    CHECK_THAT(read_all(err), Catch::Contains("--ref"));
}

TEST_CASE("heads prune: --step is a fraction or a percentage, read whole, one line when it is not", "[heads][prune][cli]") {
    TempDir tmp;
    const std::string err = tmp / "err";
    const auto step = [&](const std::string& value) {
        // Checked before any model or file is read: the paths need not exist.
        const std::string cmd = shell_quote(TF_CLI) + " --threads 1 heads prune --model " + shell_quote(tmp / "none") +
                                " --src x --ref y --order random --step " + shell_quote(value) + " >/dev/null 2>" + shell_quote(err);
        CHECK(std::system(cmd.c_str()) != 0);
        return read_all(err);
    };
    for (const std::string bad : {"abc", "0.1x", " 0.1", "10%%", "%", ""}) {
        INFO("--step '" << bad << "'");
        const std::string e = step(bad);
        CHECK(split_lines(e).size() == 1);
        CHECK_THAT(e, Catch::Contains("--step: expected a fraction such as 0.1 or 10%, got '" + bad + "'"));
    }
    for (const std::string outside : {"0", "150%", "1.5"}) {
        INFO("--step '" << outside << "'");
        CHECK_THAT(step(outside), Catch::Contains("--step: must be in (0, 100%]"));
    }
}

TEST_CASE("heads prune: the curve starts unpruned, masks by rank in steps, keeps one head per layer on request",
          "[heads][prune]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string model_dir = train_tiny_model(tmp, 3);
    tf::ModelBundle bundle = tf::load_model_dir(model_dir);
    const auto src_all = split_lines(read_all(toy + "test.src")), ref_all = split_lines(read_all(toy + "test.tgt"));
    const std::vector<std::string> src(src_all.begin(), src_all.begin() + 30), ref(ref_all.begin(), ref_all.begin() + 30);
    tf::ParallelText text;
    text.source = src;
    text.target = ref;
    const auto examples = tf::encode_parallel(text, bundle.tokenizers, 60).examples;

    tf::PruneOptions opt;
    opt.step = 0.5;
    const auto curve = tf::prune_heads(*bundle.model, bundle.tokenizers, src, ref, src, ref, opt);
    REQUIRE(curve.size() == 3);  // 0, 3 and 6 of the 6 heads
    CHECK(curve[0].masked.empty());
    CHECK(curve[1].masked.size() == 3);
    CHECK(curve[2].masked.size() == 6);
    CHECK(curve[2].fraction == 1.0);
    // The unpruned point is the model as it is: BLEU as `eval` would compute it.
    tf::DecodeOptions decode;
    CHECK(curve[0].bleu == Approx(tf::corpus_bleu(tf::translate_lines(*bundle.model, bundle.tokenizers, src, decode), ref).score));
    // The first step masks the three least important heads by the study's ranking (normalised importance).
    const tf::HeadReport r = tf::study_heads(*bundle.model, examples, {});
    std::vector<std::pair<double, std::string>> ranked;
    for (const auto& h : r.heads) ranked.push_back({h.importance, h.id.str()});
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (int i = 0; i < 3; ++i) CHECK(curve[1].masked[std::size_t(i)].str() == ranked[std::size_t(i)].second);
    CHECK(bundle.model->encoder[0].self_attn.gate.to_vector() == std::vector<tf::real>(2, 1));  // gates restored

    // Steps of 10% of 6 heads: 0.6, 1.2, 1.8 ... round up to 1, 2, 2, 3, ...; a step that rounds to the last
    // one's count is passed over, and the curve goes on to every head.
    opt.step = 0.1;
    opt.order = tf::PruneOrder::random;
    const auto fine = tf::prune_heads(*bundle.model, bundle.tokenizers, src, ref, {}, {}, opt);
    REQUIRE(fine.size() == 7);
    for (std::size_t i = 0; i < fine.size(); ++i) CHECK(fine[i].masked.size() == i);

    opt.keep_one_per_layer = true;
    opt.order = tf::PruneOrder::random;
    opt.step = 1.0 / 6;
    const auto kept = tf::prune_heads(*bundle.model, bundle.tokenizers, src, ref, {}, {}, opt);
    REQUIRE(kept.size() == 4);  // 0..3 masked: one head of each of the 3 attentions stays
    for (const char* kind : {"E", "D", "A"}) {
        int masked = 0;
        for (const auto& h : kept.back().masked) masked += h.str().rfind(kind, 0) == 0;
        CHECK(masked == 1);
    }
    const auto again = tf::prune_heads(*bundle.model, bundle.tokenizers, src, ref, {}, {}, opt);
    for (std::size_t i = 0; i < kept.size(); ++i) CHECK(again[i].masked == kept[i].masked);  // seeded
    CHECK_THROWS_WITH(tf::prune_heads(*bundle.model, bundle.tokenizers, src, {}, src, ref, opt),
                      Catch::Contains("30 source lines but 0"));
}

TEST_CASE("heads: translate --mask-heads gives the translations of the masked model, a bad spec is one line",
          "[heads][cli]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string cli = shell_quote(TF_CLI) + " --threads 1 ";
    const std::string model_dir = train_tiny_model(tmp, 20);
    const auto all = split_lines(read_all(toy + "test.src"));
    const std::vector<std::string> src(all.begin(), all.begin() + 20);
    write_all(tmp / "in", join_lines(src));
    auto translate = [&](const std::string& flags) {
        const std::string cmd = cli + "translate --model " + shell_quote(model_dir) + flags + " <" + shell_quote(tmp / "in") +
                                " >" + shell_quote(tmp / "out") + " 2>" + shell_quote(tmp / "err");
        return std::system(cmd.c_str()) == 0 ? split_lines(read_all(tmp / "out")) : std::vector<std::string>{"failed"};
    };
    tf::ModelBundle bundle = tf::load_model_dir(model_dir);
    tf::mask_heads(*bundle.model, tf::parse_head_list("A:0:0,E:0:1", bundle.model->config));
    const auto masked = tf::translate_lines(*bundle.model, bundle.tokenizers, src, tf::DecodeOptions{});
    CHECK(translate(" --mask-heads A:0:0,E:0:1") == masked);
    CHECK(translate(" --mask-heads A:0:7") == std::vector<std::string>{"failed"});
    CHECK(split_lines(read_all(tmp / "err")).size() == 1);
    CHECK_THAT(read_all(tmp / "err"), Catch::Contains("heads 0..1"));
}

TEST_CASE("heads: the value norm is ||sum_j a_ij v_j W_o^h||: zero without W_o^h, doubled with 2 W_o^h", "[heads]") {
    tf::Transformer model(tiny_head_model(), 12);
    const auto data = random_examples(6, 13);
    tf::MultiHeadAttention& m = tf::attention_of(model, tf::HeadKind::A, 0);
    const std::int64_t C = m.C, D = m.D;
    for (std::int64_t r = 0; r < C; ++r)
        for (std::int64_t c = 0; c < D; ++c) m.out_proj.weight.data()[r * C + 1 * D + c] = 0;  // head 1's columns
    const tf::HeadReport before = tf::study_heads(model, data, {});
    CHECK(find_head(before, "A:0:1").value_norm == 0);
    CHECK(find_head(before, "A:0:2").value_norm > 0);
    const double v2 = find_head(before, "A:0:2").value_norm;
    for (std::int64_t r = 0; r < C; ++r)
        for (std::int64_t c = 0; c < D; ++c) m.out_proj.weight.data()[r * C + 2 * D + c] *= 2;  // head 2's columns
    // The head's output o (before W_o) of cross-attention 0 does not depend on W_o of the same layer.
    CHECK(find_head(tf::study_heads(model, data, {}), "A:0:2").value_norm == Approx(2 * v2).epsilon(1e-5));
}
