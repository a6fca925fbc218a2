// tapeformer explain (explain.h): the walkthrough's numbers are the model's — its final logits are
// Transformer::forward's, its chosen tokens are greedy decoding's, its gradient norms are those of the
// real loss — in every model layout; the invariants hold; the command narrows and fails as documented.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>

#include "tapeformer/autograd.h"
#include "tapeformer/decode.h"
#include "tapeformer/teach/explain.h"
#include "helpers.h"

using namespace tf_test;

namespace {

tf::TokenizerPair words(const std::vector<std::string_view>& lines) {
    tf::TokenizerOptions o;
    o.kind = tf::TokenizerKind::word;
    o.vocab_size = 0;
    auto t = tf::WordTokenizer::train(lines, o);
    return {t, t};
}

tf::ModelConfig tiny(std::int64_t V, tf::NormPosition norm, tf::Tying tie) {
    tf::ModelConfig c = tf_test::tiny_model_config(V, 8, 2, 12, 2, 2, 40);  // V, C, H, F, layers, positions
    c.norm = norm;
    c.tie = tie;
    return c;
}

std::vector<std::string> stage_ids(const tf::Explanation& ex, const std::string& part, int layer) {
    std::vector<std::string> ids;
    for (const auto& s : ex.stages)
        if (s.part == part && s.layer == layer) ids.push_back(s.id);
    return ids;
}

}  // namespace

TEST_CASE("explain: final logits are Transformer::forward's and chosen tokens greedy decoding's, every layout", "[explain]") {
    const tf::TokenizerPair tok = words({"the dog sees a cat on the mat", "ein hund sieht eine katze"});
    const std::int64_t V = tok.source->vocab_size();
    for (auto norm : {tf::NormPosition::Post, tf::NormPosition::Pre})
        for (auto tie : {tf::Tying::None, tf::Tying::All})
            for (bool gated : {false, true}) {
                INFO("norm " << tf::to_string(norm) << ", tie " << tf::to_string(tie) << ", head gate " << gated);
                tf::Transformer model(tiny(V, norm, tie), 7);
                if (gated) model.decoder[1].multihead_attn.gate.data()[1] = 0;  // a masked head
                const tf::Explanation ex = tf::explain(model, tok, "  the dog sees a cat ");
                CHECK(ex.checks_passed);
                tf::NoGradGuard no_grad;
                const std::int64_t S = std::int64_t(ex.src.size()), T = std::int64_t(ex.dec_in.size());
                CHECK(S == 6);  // five words + </s>
                const tf::Tensor logits = model.forward(ex.src, 1, S, ex.dec_in, T, tf::Pass{});
                REQUIRE(logits.shape() == ex.logits.shape());
                for (std::int64_t i = 0; i < logits.numel(); ++i) REQUIRE(ex.logits.data()[i] == logits.data()[i]);
                // Greedy decoding (one position at a time, over a cache) chose the target explain fed the decoder;
                // explain's argmax at each position must name the same tokens.
                const tf::Translation greedy = tf::greedy_search(model, ex.src, 1, S, tf::DecodeOptions{}).at(0);
                REQUIRE(ex.target_decoded);
                REQUIRE(T == std::int64_t(greedy.tokens.size()) + 1);
                for (std::size_t t = 0; t < greedy.tokens.size(); ++t) CHECK(ex.chosen[t] == greedy.tokens[t]);
                if (greedy.ended) CHECK(ex.chosen.back() == model.config.eos_id);
            }
}

TEST_CASE("explain: the stages come in textbook order with their shapes", "[explain]") {
    const tf::TokenizerPair tok = words({"a b c d e"});
    tf::Transformer model(tiny(tok.source->vocab_size(), tf::NormPosition::Post, tf::Tying::None));
    const std::string tgt = "e d";
    tf::ExplainOptions o;
    o.target = &tgt;
    const tf::Explanation ex = tf::explain(model, tok, "a b c", o);
    CHECK(stage_ids(ex, "input", -1) == std::vector<std::string>{"text", "tokens", "ids"});
    CHECK(stage_ids(ex, "encoder", -1) == std::vector<std::string>{"embed", "scale", "positional"});
    const std::vector<std::string> attention = {"q", "k", "v", "scores", "mask", "softmax", "context", "merge", "out_proj", "add_norm"};
    const std::vector<std::string> ffn = {"ffn_hidden", "ffn_out", "add_norm"};
    std::vector<std::string> enc = {"qkv"};
    enc.insert(enc.end(), attention.begin(), attention.end());
    enc.insert(enc.end(), ffn.begin(), ffn.end());
    CHECK(stage_ids(ex, "encoder", 0) == enc);
    std::vector<std::string> dec = enc;  // causal self-attention as the encoder's, then cross-attention
    dec.insert(dec.end() - 3, {"q_proj", "kv_proj"});
    dec.insert(dec.end() - 3, attention.begin(), attention.end());
    CHECK(stage_ids(ex, "decoder", 1) == dec);
    CHECK(stage_ids(ex, "output", -1) == std::vector<std::string>{"logits", "probs", "chosen"});
    CHECK(ex.dec_in.size() == 3);  // <s> e d
    for (const auto& s : ex.stages) {
        if (s.id == "scores" && s.block == "cross-attention") CHECK(s.value.shape() == tf::Shape{1, 2, 3, 4});  // (B, H, T, S)
        if (s.id == "qkv") CHECK(s.value.shape().last() == 24);                                               // 3C
        if (s.id == "softmax" && s.block == "causal self-attention") {
            CHECK(s.value.data()[1] == 0);  // query <s> cannot see position 1
            CHECK(s.text.empty());
        }
        CHECK_FALSE(s.where.empty());
    }
    // The printout draws each mask: the causal one row by row, with -inf above the diagonal.
    tf::ExplainView masks;
    masks.stages = {"mask"};
    const std::string printed = tf::format_explanation(ex, masks);
    CHECK(printed.find("row = query, column = key:") != std::string::npos);
    CHECK(printed.find("-inf") != std::string::npos);
    CHECK(ex.stages[1].text == "a | b | c | </s>");
}

TEST_CASE("explain: --backward gives the gradient norms of the real loss and leaves no parameter gradient", "[explain]") {
    const tf::TokenizerPair tok = words({"a b c d e"});
    tf::Transformer model(tiny(tok.source->vocab_size(), tf::NormPosition::Post, tf::Tying::None), 3);
    tf::ExplainOptions o;
    o.backward = true;
    const tf::Explanation ex = tf::explain(model, tok, "a b c d", o);
    for (const auto& p : model.parameters()) {
        const float* g = static_cast<const tf::Tensor&>(p.tensor).grad();
        if (g)
            for (std::int64_t i = 0; i < p.tensor.numel(); ++i) REQUIRE(g[i] == 0);
    }
    // The same loss through the model's forward: the gradient reaching the logits must be the same.
    std::vector<std::int32_t> target(ex.dec_in.begin() + 1, ex.dec_in.end());
    target.push_back(model.config.eos_id);
    tf::Tensor logits = model.forward(ex.src, 1, std::int64_t(ex.src.size()), ex.dec_in, std::int64_t(ex.dec_in.size()), tf::Pass{});
    tf::Tensor loss = tf::sequence_loss(logits, target, model.config.pad_id, 0);
    CHECK(loss.item() == Approx(ex.loss).epsilon(1e-6));
    tf::backward(loss);
    double n2 = 0;
    for (float g : logits.grad_vector()) n2 += double(g) * g;
    for (auto& p : model.parameters()) p.tensor.zero_grad();
    bool saw_logits = false, saw_embed = false;
    for (const auto& s : ex.stages) {
        if (s.id == "logits") {
            saw_logits = true;
            CHECK(s.grad_norm == Approx(std::sqrt(n2)).epsilon(1e-5));
        }
        if (s.id == "embed" && s.part == "encoder") saw_embed = s.grad_norm > 0;  // the gradient reached the input
        if (s.id == "mask" || s.id == "probs") CHECK(s.grad_norm < 0);           // displays, not on the loss's path
    }
    CHECK(saw_logits);
    CHECK(saw_embed);
    const std::string all = tf::format_explanation(ex, tf::ExplainView{-1, -1, {}, false, false, true});
    REQUIRE(all.find("== backward") != std::string::npos);
    const std::string text = all.substr(all.find("== backward"));
    CHECK(text.find("[1] text") == std::string::npos);  // text has no tensor: not in the reverse list
    REQUIRE(text.find(" embed ") != std::string::npos);
    CHECK(text.find(" logits ") < text.find(" embed "));  // reverse order: the logits come first
}

TEST_CASE("explain: matrices are cut to --rows × --cols, and printed whole with 0 (--full)", "[explain]") {
    const tf::TokenizerPair tok = words({"a b c d e f g h i"});
    tf::Transformer model(tiny(tok.source->vocab_size(), tf::NormPosition::Post, tf::Tying::None));
    const std::string sentence = "a b c d e f g h i";  // S = 10 with </s>
    tf::ExplainOptions o;
    o.target = &sentence;
    const tf::Explanation ex = tf::explain(model, tok, sentence, o);
    tf::ExplainView v;
    v.layer = 0, v.head = 0, v.stages = {"softmax"};
    // The rows of the first printed matrix (encoder layer 0, head 0): lines of numbers up to the next heading.
    auto matrix_rows = [&](const tf::ExplainView& view) {
        const std::vector<std::string> lines = split_lines(tf::format_explanation(ex, view));
        std::vector<std::string> rows;
        std::size_t i = 0;
        while (i < lines.size() && lines[i].find("head 0:") == std::string::npos) ++i;
        for (++i; i < lines.size() && lines[i].find("head") == std::string::npos && lines[i].find("==") == std::string::npos; ++i)
            if (lines[i].find("0.") != std::string::npos) rows.push_back(lines[i]);
        return rows;
    };
    auto numbers = [](const std::string& row) {
        std::size_t n = 0;
        for (std::size_t at = row.find("0."); at != std::string::npos; at = row.find("0.", at + 1)) ++n;
        return n;
    };
    const auto excerpt = matrix_rows(v);  // the default: 6 × 8 of the 10 × 10 weights, and what was left out
    REQUIRE(excerpt.size() == 6);
    CHECK(numbers(excerpt[0]) == 8);
    CHECK_THAT(excerpt[0], Catch::Contains("(10 columns; --cols or --full for more)"));
    CHECK_THAT(tf::format_explanation(ex, v), Catch::Contains("… (10 rows; --rows or --full for more)"));
    v.rows = 0, v.cols = 0;
    const auto whole = matrix_rows(v);
    REQUIRE(whole.size() == 10);
    for (const std::string& row : whole) CHECK(numbers(row) == 10);
    CHECK_THAT(tf::format_explanation(ex, v), !Catch::Contains("…"));
    v.rows = 2, v.cols = 3;
    const auto small = matrix_rows(v);
    REQUIRE(small.size() == 2);
    CHECK(numbers(small[1]) == 3);
}

TEST_CASE("explain: the command on an untrained model narrows, checks and refuses bad flags", "[explain][cli]") {
    TempDir tmp("explain");
    const std::string out = tmp / "out.txt", err = tmp / "err.txt";
    const std::string cli = shell_quote(TF_CLI) + " --threads 1 explain --init ";
    auto run = [&](const std::string& args) { return std::system((cli + args + " >" + shell_quote(out) + " 2>" + shell_quote(err)).c_str()); };

    REQUIRE(run("'the dog sees a cat' --check") == 0);
    std::string text = read_all(out);
    CHECK(text.find("checks: all passed") != std::string::npos);
    CHECK(text.find("== decoder layer 0, causal self-attention ==") != std::string::npos);
    CHECK(text.find("computed in decoder.layers.0.multihead_attn (MultiHeadAttention)") != std::string::npos);  // the walk's name
    CHECK(text.find("check FAIL") == std::string::npos);
    CHECK(text.find("masked weights are exactly 0") != std::string::npos);

    REQUIRE(run("'the dog sees a cat' --layer 0 --head 1 --stage softmax") == 0);
    text = read_all(out);
    CHECK(text.find("head 1:") != std::string::npos);
    CHECK(text.find("head 0:") == std::string::npos);
    CHECK(text.find("qkv") == std::string::npos);
    CHECK(text.find("(B, H, S, S) = (1, 2, 6, 6)") != std::string::npos);

    REQUIRE(run("'a b' --no-values --backward --d-model 16 --heads 4 --norm pre") == 0);
    text = read_all(out);
    CHECK(text.find("head 0:") == std::string::npos);
    CHECK(text.find("(B, H, S, D) = (1, 4, 3, 4)") != std::string::npos);
    CHECK(text.find("|dL/dx|") != std::string::npos);

    REQUIRE(run("'a b c d e f g h i' --layer 0 --head 0 --stage softmax --full") == 0);
    text = read_all(out);
    CHECK(text.find("(B, H, S, S) = (1, 2, 10, 10)") != std::string::npos);
    CHECK(text.find("…") == std::string::npos);  // nothing left out

    for (const std::string bad : {"'a b' --stage nonsense", "'a b' --head 2", "'a b' --layer 3", "''", "'a b' --heads 3",
                                  "'a b' --full --rows 3", "'a b' --cols -1"}) {
        INFO(bad);
        CHECK(run(bad) != 0);
        const std::vector<std::string> lines = split_lines(read_all(err));
        REQUIRE(lines.size() == 1);
        CHECK(lines[0].rfind("tapeformer:", 0) == 0);
    }
    CHECK(std::system((shell_quote(TF_CLI) + " explain 'a b' >/dev/null 2>" + shell_quote(err)).c_str()) != 0);
    CHECK(read_all(err).find("--model DIR or --init") != std::string::npos);
}

TEST_CASE("explain and tape: the commands on a trained model directory", "[explain][tape][cli]") {
    TempDir tmp("explain_model");
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/", model = tmp / "model";
    const std::string train = shell_quote(TF_CLI) + " --threads 1 train --train-src " + shell_quote(toy + "valid.src") +
                              " --train-tgt " + shell_quote(toy + "valid.tgt") +
                              " --tokenizer word --vocab-size 0 --d-model 16 --heads 2 --ffn 32 --enc-layers 2" +
                              " --dec-layers 1 --max-steps 5 --out " + shell_quote(model) + " >/dev/null 2>&1";
    REQUIRE(std::system(train.c_str()) == 0);
    const std::string out = tmp / "out.txt";
    const std::string src = "'the blue men that sing .'", tgt = "'loi donon blavoi .'";
    REQUIRE(std::system((shell_quote(TF_CLI) + " --threads 1 explain --model " + shell_quote(model) + " " + src +
                         " --check > " + shell_quote(out)).c_str()) == 0);
    std::string text = read_all(out);
    CHECK(text.find("2+1 layers, C 16, H 2, D 8") != std::string::npos);
    CHECK(text.find("the greedy translation") != std::string::npos);
    CHECK(text.find("== encoder layer 1, feed-forward ==") != std::string::npos);
    CHECK(text.find("checks: all passed") != std::string::npos);
    REQUIRE(std::system((shell_quote(TF_CLI) + " --threads 1 explain --model " + shell_quote(model) + " " + src + " --tgt " + tgt +
                         " --stage chosen > " + shell_quote(out)).c_str()) == 0);
    text = read_all(out);
    CHECK(text.find("T = 5 decoder positions (<s> + --tgt)") != std::string::npos);
    CHECK(text.find("after <s> -> ") != std::string::npos);
    REQUIRE(std::system((shell_quote(TF_CLI) + " --threads 1 tape --model " + shell_quote(model) + " --src " + src + " --tgt " + tgt +
                         " > " + shell_quote(out)).c_str()) == 0);
    text = read_all(out);
    CHECK(text.find("encoder.layers.1.self_attn.in_proj_weight (48, 16)") != std::string::npos);
    // Flags that shape an untrained model are refused with a trained one, in one line.
    for (const std::string& cmd : {std::string(" explain --model ") + shell_quote(model) + " " + src + " --heads 4",
                                   std::string(" tape --model ") + shell_quote(model) + " --d-model 32"}) {
        INFO(cmd);
        CHECK(std::system((shell_quote(TF_CLI) + cmd + " >/dev/null 2>" + shell_quote(out)).c_str()) != 0);
        REQUIRE(split_lines(read_all(out)).size() == 1);
        CHECK(read_all(out).find("--model DIR brings its own") != std::string::npos);
    }
    CHECK(text.find("backward visits") != std::string::npos);
}
