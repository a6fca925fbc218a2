// tapeformer summary (summary.h): the parameter column agrees with the model's own parameter lists, the
// multiply-adds with a count by hand, and the command works on an untrained model.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "tapeformer/teach/summary.h"
#include "helpers.h"

using namespace tf_test;

namespace {

tf::ModelConfig tiny(tf::Tying tie, tf::NormPosition norm, tf::PositionalKind positional) {
    tf::ModelConfig c = tf_test::tiny_model_config(30, 8, 2, 12, 2, 1, 32);  // V, C, H, F, layers, positions
    c.tie = tie;
    c.norm = norm;
    c.positional = positional;
    return c;
}

// Σ numel over the model's parameters whose name starts with `prefix`.
std::int64_t params_named(const tf::Transformer& m, const std::string& prefix) {
    std::int64_t n = 0;
    for (const auto& p : m.parameters())
        if (p.name.rfind(prefix, 0) == 0) n += p.tensor.numel();
    return n;
}

}  // namespace

TEST_CASE("summary: parameter counts agree with the model's parameter lists, tied tables counted once", "[summary]") {
    for (auto tie : {tf::Tying::None, tf::Tying::Decoder, tf::Tying::All})
        for (auto norm : {tf::NormPosition::Post, tf::NormPosition::Pre})
            for (auto pos : {tf::PositionalKind::Sinusoidal, tf::PositionalKind::Learned}) {
                INFO("tie " << tf::to_string(tie) << ", norm " << tf::to_string(norm) << ", " << tf::to_string(pos));
                tf::Transformer m(tiny(tie, norm, pos));
                const tf::ModelSummary s = tf::summarize(m, 2, 5, 7);
                CHECK(s.total_params == m.parameter_count());
                CHECK(s.rows[0].params == m.parameter_count());
                for (const auto& r : s.rows) {
                    if (r.name.rfind("encoder.layers.", 0) == 0 || r.name.rfind("decoder.layers.", 0) == 0) {
                        if (r.depth == 1) CHECK(r.params == params_named(m, r.name + "."));
                    }
                }
            }
}

TEST_CASE("summary: multiply-adds and shapes of a tiny model, counted by hand", "[summary]") {
    tf::Transformer m(tiny(tf::Tying::None, tf::NormPosition::Post, tf::PositionalKind::Sinusoidal));
    const std::int64_t B = 2, S = 5, T = 7, C = 8, H = 2, D = 4, F = 12, V = 30;
    const tf::ModelSummary s = tf::summarize(m, B, S, T);
    // attention over Tq queries and Tk keys: Q, K, V and output projections, Q Kᵀ, weights · V
    auto attention = [&](std::int64_t Tq, std::int64_t Tk) {
        return B * Tq * C * C + 2 * B * Tk * C * C + 2 * B * H * Tq * Tk * D + B * Tq * C * C;
    };
    const std::int64_t encoder_layer = attention(S, S) + 2 * B * S * C * F;
    const std::int64_t decoder_layer = attention(T, T) + attention(T, S) + 2 * B * T * C * F;
    CHECK(s.rows[0].mult_adds == 2 * encoder_layer + decoder_layer + B * T * C * V);
    CHECK(s.rows[0].output == tf::Shape{B, T, V});
    bool saw_cross = false;
    for (const auto& r : s.rows)
        if (r.name == "decoder.layers.0.multihead_attn") {
            saw_cross = true;
            CHECK(r.mult_adds == attention(T, S));
            CHECK(r.output == tf::Shape{B, T, C});
        }
    CHECK(saw_cross);
    CHECK_THROWS_WITH(tf::summarize(m, 1, 33, 4), Catch::Contains("32 positions"));
    CHECK_THROWS_WITH(tf::summarize(m, 0, 3, 4), Catch::Contains(">= 1"));
}

TEST_CASE("summary: tapeformer summary --init prints the table, no model is one line on stderr", "[summary][cli]") {
    TempDir tmp;
    const std::string out = tmp / "out", err = tmp / "err";
    const std::string cmd = shell_quote(TF_CLI) + " summary --init --d-model 8 --heads 2 --ffn 16 --layers 1 --vocab 20 >" +
                            shell_quote(out) + " 2>" + shell_quote(err);
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string table = read_all(out);
    CHECK_THAT(table, Catch::Contains("decoder.layers.0 (DecoderLayer)") && Catch::Contains("Total params: 1,984"));
    const std::string none = shell_quote(TF_CLI) + " summary 2>" + shell_quote(err);
    CHECK(std::system(none.c_str()) != 0);
    const auto lines = split_lines(read_all(err));
    REQUIRE(lines.size() == 1);
    CHECK_THAT(lines[0], Catch::Contains("--model") && Catch::Contains("--init"));
}
