// The decoder-only model (ModelConfig::arch): its parameters and walk, its causal forward, generation
// (cached == uncached logits, the same seed gives the same tokens, greedy / top-k / top-p), its settings,
// and the CLI commands run on a tiny trained one.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/generate.h"
#include "tapeformer/model_settings.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/random.h"
#include "tapeformer/run/train_settings.h"
#include "helpers.h"

using tf::Tensor;
using Ids = std::vector<std::int32_t>;

namespace {

tf::ModelConfig lm_config(tf::NormPosition norm = tf::NormPosition::Pre) {
    tf::ModelConfig c = tf_test::tiny_model_config(17, 16, 2, 32, 1, 2, 24);
    c.arch = tf::Architecture::DecoderOnly;
    c.norm = norm;
    c.dropout = c.attention_dropout = c.activation_dropout = 0;
    return c;
}

}  // namespace

TEST_CASE("a decoder-only model has no encoder, no cross-attention and one token table", "[decoder_only]") {
    tf::Transformer model(lm_config());
    std::vector<std::string> names;
    for (const tf::NamedTensor& p : model.parameters()) names.push_back(p.name);
    CHECK(names.front() == "embed.weight");
    CHECK(names.back() == "generator.weight");
    for (const std::string& n : names) {
        INFO(n);
        CHECK(n.find("encoder") == std::string::npos);
        CHECK(n.find("src_embed") == std::string::npos);
        CHECK(n.find("multihead_attn") == std::string::npos);
        CHECK(n.find("norm3") == std::string::npos);
    }
    CHECK(std::count(names.begin(), names.end(), "decoder.layers.1.norm2.weight") == 1);  // the FFN's norm
    CHECK(std::count(names.begin(), names.end(), "decoder.norm.weight") == 1);            // pre-norm's final norm
    // Attention modules: the two causal self-attentions only.
    const auto attn = model.attentions();
    REQUIRE(attn.size() == 2);
    CHECK(attn[0].first == "decoder.layers.0.self_attn");
    // The walk's count is the shape-only count, and smaller than the encoder-decoder of the same sizes.
    tf::ModelConfig ed = lm_config();
    ed.arch = tf::Architecture::EncoderDecoder;
    CHECK(model.parameter_count() == lm_config().parameter_count());
    CHECK(model.parameter_count() < ed.parameter_count());
    // C·V table + per layer (4 C² + 4 C attention, 2 C F + F + C FFN, 2 × 2 C norms) + 2 C final norm + V·C generator.
    const std::int64_t C = 16, F = 32, V = 17;
    CHECK(model.parameter_count() == V * C + 2 * (4 * C * C + 4 * C + 2 * C * F + F + C + 4 * C) + 2 * C + V * C);
}

TEST_CASE("arch is in the model metadata, and metadata without it is an encoder-decoder", "[decoder_only]") {
    auto m = tf::to_metadata(lm_config());
    CHECK(m.at("arch") == "decoder-only");
    CHECK(tf::model_config_from_metadata(m).arch == tf::Architecture::DecoderOnly);
    m.erase("arch");
    CHECK(tf::model_config_from_metadata(m).arch == tf::Architecture::EncoderDecoder);
    m["arch"] = "gpt";
    CHECK_THROWS_WITH(tf::model_config_from_metadata(m), Catch::Contains("arch") && Catch::Contains("decoder-only"));
}

TEST_CASE("decoder-only forward is causal: a logit never depends on a later token", "[decoder_only]") {
    for (tf::NormPosition norm : {tf::NormPosition::Post, tf::NormPosition::Pre}) {
        tf::Transformer model(lm_config(norm), 3);
        tf::NoGradGuard no_grad;
        const Ids a = {1, 5, 6, 7, 8, 9}, b = {1, 5, 6, 7, 12, 3};  // differ from position 4 on
        Tensor la = model.forward({}, 1, 0, a, 6, tf::Pass{}), lb = model.forward({}, 1, 0, b, 6, tf::Pass{});  // (1, 6, V)
        REQUIRE(la.size(2) == 17);
        for (std::int64_t i = 0; i < 4 * 17; ++i) CHECK(la.data()[i] == lb.data()[i]);
        double diff = 0;
        for (std::int64_t i = 4 * 17; i < 6 * 17; ++i) diff += std::abs(double(la.data()[i]) - double(lb.data()[i]));
        CHECK(diff > 1e-3);
    }
}

TEST_CASE("generate: each cached step's logits equal the full forward's at that position", "[decoder_only]") {
    for (tf::NormPosition norm : {tf::NormPosition::Post, tf::NormPosition::Pre}) {
        tf::Transformer model(lm_config(norm), 5);
        model.decoder[1].self_attn.gate.data()[0] = tf::real(0.5);  // the head gates too
        const Ids prompt = {7, 3, 9};
        tf::GenerateOptions o;
        o.temperature = 1.0;
        o.max_tokens = 12;
        o.seed = 11;
        std::vector<std::vector<tf::real>> seen;
        const tf::Generation g = tf::generate(model, prompt, o, [&](const tf::real* l, std::int64_t V) { seen.emplace_back(l, l + V); });
        REQUIRE(!seen.empty());
        Ids seq = {1};
        seq.insert(seq.end(), prompt.begin(), prompt.end());
        seq.insert(seq.end(), g.tokens.begin(), g.tokens.end());
        const std::int64_t T = static_cast<std::int64_t>(seq.size()), V = 17;
        tf::NoGradGuard no_grad;
        Tensor full = model.forward({}, 1, 0, seq, T, tf::Pass{});  // (1, T, V)
        for (std::size_t s = 0; s < seen.size(); ++s) {
            INFO("step " << s);
            const tf::real* want = full.data() + (prompt.size() + s) * V;  // the position of the token fed last
            double scale = 0, err = 0;
            for (std::int64_t j = 0; j < V; ++j) {
                scale = std::max(scale, std::abs(double(want[j])));
                err = std::max(err, std::abs(double(seen[s][j]) - double(want[j])));
            }
            CHECK(err <= 1e-5 * scale);
        }
    }
}

TEST_CASE("generate: the same seed gives the same tokens, other seeds other tokens, greedy needs none", "[decoder_only]") {
    tf::Transformer model(lm_config(), 2);
    tf::GenerateOptions o;
    o.max_tokens = 15;
    o.seed = 42;
    const tf::Generation a = tf::generate(model, {4, 5}, o), b = tf::generate(model, {4, 5}, o);
    CHECK(a.tokens == b.tokens);
    bool other = false;
    for (std::uint64_t s = 1; s <= 4; ++s) {
        o.seed = s;
        other = other || tf::generate(model, {4, 5}, o).tokens != a.tokens;
    }
    CHECK(other);
    // greedy: seed-independent, and top-k 1 / a tiny top-p sample the argmax
    tf::GenerateOptions greedy;
    greedy.temperature = 0;
    greedy.max_tokens = 15;
    const tf::Generation g1 = tf::generate(model, {4, 5}, greedy);
    greedy.seed = 99;
    CHECK(tf::generate(model, {4, 5}, greedy).tokens == g1.tokens);
    tf::GenerateOptions k1 = o;
    k1.top_k = 1;
    CHECK(tf::generate(model, {4, 5}, k1).tokens == g1.tokens);
    tf::GenerateOptions p0 = o;
    p0.top_p = 1e-6;
    CHECK(tf::generate(model, {4, 5}, p0).tokens == g1.tokens);
    for (std::int32_t t : a.tokens) CHECK((t != 0 && t != 1));  // never pad or BOS
}

TEST_CASE("choose_token: temperature, top-k and top-p on hand-computed probabilities", "[decoder_only]") {
    tf::ModelConfig c = lm_config();
    // ids: pad 0, BOS 1, EOS 2, 3, 4; probabilities of the generable ids: EOS 1/4, id 3 1/2, id 4 1/4
    const tf::real pad_bos_high = 9;  // never chosen however large
    const std::vector<tf::real> logits = {pad_bos_high, pad_bos_high, 0, tf::real(std::log(2.0)), 0};
    tf::GenerateOptions o;
    // sorted: 3 (0.5), 2 (0.25), 4 (0.25, ties to the lower id): running sums 0.5, 0.75, 1
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.0) == 3);
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.49) == 3);
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.6) == 2);
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.9) == 4);
    o.top_k = 2;  // {3, 2}, mass 0.75: u 0.9 -> 0.675 -> id 2
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.9) == 2);
    o.top_k = 0;
    o.top_p = 0.5;  // {3} reaches 0.5
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.99) == 3);
    o.top_p = 0.6;  // {3, 2}
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.99) == 2);
    o.top_p = 1;
    o.temperature = 0;
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.99) == 3);
    // a high temperature flattens: p ∝ 2^(1/T); at T = 1e6 the three are equal to 1e-6, u 0.5 -> the second
    o.temperature = 1e6;
    CHECK(tf::choose_token(logits.data(), 5, c, o, 0.5) == 2);
}

TEST_CASE("generate refuses bad options and an encoder-decoder model with a readable line", "[decoder_only]") {
    tf::GenerateOptions o;
    o.top_p = 1.5;
    CHECK_THROWS_WITH(o.validate(), Catch::Contains("--top-p") && Catch::Contains("(0, 1]"));
    o = {};
    o.temperature = -1;
    CHECK_THROWS_WITH(o.validate(), Catch::Contains("--temperature"));
    o = {};
    o.top_k = -2;
    CHECK_THROWS_WITH(o.validate(), Catch::Contains("--top-k"));
    tf::ModelConfig ed = lm_config();
    ed.arch = tf::Architecture::EncoderDecoder;
    tf::Transformer translator(ed);
    CHECK_THROWS_WITH(tf::generate(translator, {4}, tf::GenerateOptions{}), Catch::Contains("tapeformer translate"));
    tf::Transformer model(lm_config());
    CHECK_THROWS_WITH(tf::generate(model, Ids(30, 4), tf::GenerateOptions{}), Catch::Contains("positions"));
    // the longest prompt that fits: generation stops at the last position without error
    tf::GenerateOptions many;
    many.max_tokens = 100;
    const tf::Generation g = tf::generate(model, Ids(20, 4), many);
    CHECK(g.tokens.size() <= 4);
}

TEST_CASE("train settings: decoder-only needs --train-src and refuses a target file", "[decoder_only]") {
    tf::TrainConfig c;
    c.out_dir = "/tmp/none";
    c.max_steps = 5;
    c.model.arch = tf::Architecture::DecoderOnly;
    c.valid_bleu = false;  // resolve_train_config's default for decoder-only
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("--arch decoder-only needs --train-src"));
    c.data.train_src = "text.txt";
    c.validate();
    c.data.train_tgt = "other.txt";
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("--train-tgt") && Catch::Contains("encoder-decoder"));
}

#ifdef TF_CLI
namespace {

// A small text with a grammar a tiny model picks up in a few dozen steps: "the cat sees the dog ." and so on.
std::string tiny_text(std::uint64_t seed, int lines) {
    const char* nouns[] = {"cat", "dog", "bird", "fox"};
    const char* verbs[] = {"sees", "likes", "helps"};
    tf::Rng rng(seed);
    std::string text;
    for (int i = 0; i < lines; ++i)
        text += std::string("the ") + nouns[rng.below(4)] + " " + verbs[rng.below(3)] + " the " + nouns[rng.below(4)] + " .\n";
    return text;
}

void check_one_line_error(const tf_test::Run& r, const std::string& what) {
    INFO("stderr: " << r.err);
    CHECK(r.status > 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::Contains(what));
}

}  // namespace

TEST_CASE("decoder-only end to end: train, generate, and every study command on the model", "[decoder_only][cli]") {
    tf_test::TempDir tmp("lm");
    const std::string train = tf_test::write_file(tmp, "train.txt", tiny_text(1, 300));
    const std::string valid = tf_test::write_file(tmp, "valid.txt", tiny_text(2, 20));
    const std::string out = tmp / "run";
    const std::string common = " --tokenizer word --vocab-size 0 --d-model 16 --heads 2 --ffn 32 --layers 1 --max-len 10"
                               " --batch-tokens 240 --schedule cosine --lr 0.01 --warmup 5 --log-every 10";
    const tf_test::Run t = tf_test::run_cli(tmp, "train --arch decoder-only --train-src " + train + " --valid-src " + valid +
                                                     " --out " + out + common + " --max-steps 40 --valid-every 40 --checkpoint-every 40");
    INFO("train stderr: " << t.err << "\nstdout: " << t.out);
    REQUIRE(t.status == 0);
    const std::string metrics = tf_test::read_all(out + "/metrics.jsonl");
    CHECK_THAT(metrics, Catch::Contains("\"valid_ppl\""));
    CHECK_THAT(tf_test::read_all(out + "/run.json"), Catch::Contains("decoder-only"));

    // greedy: the model has learned the grammar's next word after "the cat sees"
    const tf_test::Run g = tf_test::run_cli(tmp, "generate --model " + out + " --prompt 'the cat sees' --temperature 0");
    INFO("generate stderr: " << g.err);
    REQUIRE(g.status == 0);
    CHECK(g.out.rfind("the cat sees the ", 0) == 0);
    // sampled: the same seed, the same text
    const std::string sample = "generate --model " + out + " --prompt the --seed 7 --top-k 5 --top-p 0.9 --max-tokens 12";
    const tf_test::Run s1 = tf_test::run_cli(tmp, sample), s2 = tf_test::run_cli(tmp, sample);
    REQUIRE(s1.status == 0);
    CHECK(s1.out == s2.out);
    CHECK(s1.out.rfind("the ", 0) == 0);

    check_one_line_error(tf_test::run_cli(tmp, "generate --model " + out + " --top-p 1.5"), "--top-p");
    check_one_line_error(tf_test::run_cli(tmp, "translate --model " + out, "the cat\n"), "use tapeformer generate");
    check_one_line_error(tf_test::run_cli(tmp, "train --arch decoder-only --train-src " + train + " --train-tgt " + train +
                                                   " --out " + (tmp / "x") + " --max-steps 2"),
                         "--train-tgt");

    // the study and teaching commands: no crash, no encoder or cross-attention in what they show
    const tf_test::Run e = tf_test::run_cli(tmp, "explain 'the dog likes the cat .' --model " + out);
    INFO("explain stderr: " << e.err);
    CHECK(e.status == 0);
    CHECK_THAT(e.out, Catch::Contains("decoder"));
    CHECK_THAT(e.out, !Catch::Contains("cross-attention") && !Catch::Contains("encoder.layers"));
    const tf_test::Run tp = tf_test::run_cli(tmp, "tape --model " + out + " --src 'the dog' --tgt 'the dog sees the cat .'");
    INFO("tape stderr: " << tp.err);
    CHECK(tp.status == 0);
    CHECK_THAT(tp.out, !Catch::Contains("encoder.layers") && !Catch::Contains("multihead_attn"));
    const tf_test::Run h = tf_test::run_cli(tmp, "heads --model " + out + " --src " + valid + " --out " + (tmp / "heads"));
    INFO("heads stderr: " << h.err);
    CHECK(h.status == 0);
    CHECK_THAT(h.out, Catch::Contains("D = decoder self-attention"));
    CHECK_THAT(h.out, !Catch::Contains("E = ") && !Catch::Contains("A = "));
    const tf_test::Run a = tf_test::run_cli(tmp, "attention --model " + out + " --src 'the fox helps the bird .'");
    INFO("attention stderr: " << a.err);
    CHECK(a.status == 0);
    CHECK_THAT(a.out, Catch::Contains("\"encoder_self\":[]") && Catch::Contains("\"cross\":[]"));
    const tf_test::Run r = tf_test::run_cli(tmp, "report --model " + out + " --out " + (tmp / "report.html"));
    INFO("report stderr: " << r.err);
    CHECK(r.status == 0);
    CHECK_THAT(tf_test::read_all(tmp / "report.html"), Catch::Contains("decoder-only"));
}
#endif
