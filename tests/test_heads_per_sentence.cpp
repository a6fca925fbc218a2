// `heads --per-sentence` (heads.h SentenceHeads, head_formats.h sentence_heads_json_line): each pair's own gate
// gradients, whatever its batch; the file-wide importances are their sums; the command's JSONL.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tapeformer/study/heads.h"
#include "head_fixtures.h"
#include "helpers.h"

using namespace tf_test;

namespace {

// What the callback was handed, copied (its example pointer is only good while the data lives).
struct Seen {
    std::int64_t line;
    std::vector<tf::HeadId> heads;
    std::vector<std::vector<double>> gate_grad;
};

std::vector<Seen> per_sentence(tf::Transformer& model, const std::vector<tf::Example>& data, tf::HeadStudyOptions opt,
                               tf::HeadReport* report = nullptr) {
    std::vector<Seen> seen;
    opt.per_sentence = [&](const tf::SentenceHeads& s) { seen.push_back({s.example->line, s.heads, s.gate_grad}); };
    const tf::HeadReport r = tf::study_heads(model, data, opt);
    if (report) *report = r;
    return seen;
}

}  // namespace

TEST_CASE("heads --per-sentence: each pair's gate gradients, in file order, the same in any batch", "[heads]") {
    tf::Transformer model(tiny_head_model(), 4);
    auto data = random_examples(10, 6);
    for (std::size_t i = 0; i < data.size(); ++i) data[i].line = std::int64_t(2 * i + 1);  // as if every other line were empty
    tf::HeadStudyOptions opt;
    opt.normalise = false;
    opt.batch_tokens = 100000;
    const std::vector<Seen> one = per_sentence(model, data, opt);
    opt.batch_tokens = 30;
    tf::HeadReport many_report;
    const std::vector<Seen> many = per_sentence(model, data, opt, &many_report);
    REQUIRE(many_report.batches > 1);
    REQUIRE(one.size() == data.size());
    REQUIRE(many.size() == data.size());
    for (std::size_t p = 0; p < data.size(); ++p) {
        INFO("pair " << p);
        CHECK(one[p].line == std::int64_t(2 * p + 1));
        CHECK(many[p].line == one[p].line);
        REQUIRE(one[p].heads.size() == std::size_t(4 * (2 + 1 + 1)));
        for (std::size_t h = 0; h < one[p].heads.size(); ++h) {
            INFO(one[p].heads[h].str());
            const std::size_t queries = (one[p].heads[h].kind == tf::HeadKind::E ? data[p].src.size() : data[p].tgt.size()) + 1;
            REQUIRE(one[p].gate_grad[h].size() == queries);  // source + EOS, or BOS + target
            REQUIRE(many[p].gate_grad[h].size() == queries);
            // The pair's own gradient: another batch changes only the rounding of the products it went through.
            const double scale = largest_magnitude(one[p].gate_grad[h]);
            for (std::size_t t = 0; t < queries; ++t) CHECK(std::fabs(one[p].gate_grad[h][t] - many[p].gate_grad[h][t]) <= 1e-5 * scale);
        }
    }
}

TEST_CASE("heads --per-sentence: the file's token, sentence and signed importances are sums over its pairs", "[heads]") {
    tf::Transformer model(tiny_head_model(), 7);
    const auto data = random_examples(9, 8);
    tf::HeadStudyOptions opt;
    opt.normalise = false;
    opt.batch_tokens = 40;
    for (const tf::Granularity g : {tf::Granularity::token, tf::Granularity::sentence}) {
        opt.granularity = g;
        tf::HeadReport r;
        const std::vector<Seen> seen = per_sentence(model, data, opt, &r);
        for (std::size_t h = 0; h < r.heads.size(); ++h) {
            INFO(r.heads[h].id.str() << " " << tf::to_string(g));
            double magnitude = 0, sentences = 0, signed_sum = 0;
            for (const Seen& s : seen) {
                REQUIRE(s.heads[h].str() == r.heads[h].id.str());
                double sum = 0;
                for (double v : s.gate_grad[h]) {
                    magnitude += std::fabs(v);
                    sum += v;
                }
                sentences += std::fabs(sum);
                signed_sum += sum;
            }
            const double n = g == tf::Granularity::token
                                 ? double(r.heads[h].id.kind == tf::HeadKind::E ? r.src_tokens : r.tgt_tokens)
                                 : double(r.pairs);
            CHECK(r.heads[h].importance_raw == Approx((g == tf::Granularity::token ? magnitude : sentences) / n).epsilon(1e-9));
            CHECK(r.heads[h].importance_signed_raw == Approx(signed_sum / n).epsilon(1e-9));
        }
    }
}

TEST_CASE("heads --per-sentence: a pair's signed importance is <W_o^h, dL/dW_o^h> of its loss alone", "[heads]") {
    tf::Transformer model(tiny_head_model(), 9);
    const auto data = random_examples(6, 10);
    tf::HeadStudyOptions opt;
    opt.batch_tokens = 100000;  // pair 3 in a batch of six
    const std::vector<Seen> seen = per_sentence(model, data, opt);
    // Pair 3 alone: after the study the parameters hold the gradient of its loss only.
    tf::study_heads(model, {data[3]}, opt);
    for (std::size_t h = 0; h < seen[3].heads.size(); ++h) {
        const tf::HeadId id = seen[3].heads[h];
        INFO(id.str());
        const tf::MultiHeadAttention& m = tf::attention_of(model, id.kind, id.layer);
        double frobenius = 0;
        for (std::int64_t row = 0; row < m.C; ++row)
            for (std::int64_t k = id.head * m.D; k < (id.head + 1) * m.D; ++k)
                frobenius += double(m.out_proj.weight.data()[row * m.C + k]) * m.out_proj.weight.grad()[row * m.C + k];
        double signed_sum = 0;
        for (double v : seen[3].gate_grad[h]) signed_sum += v;
        CHECK(signed_sum == Approx(frobenius).epsilon(1e-4));
    }
}

TEST_CASE("heads --per-sentence: the command writes a JSON line per pair with its line, tokens and gradients",
          "[heads][cli]") {
    TempDir tmp("per_sentence");
    const std::string model = train_tiny_model(tmp, 3);
    // Five pairs, the third empty on the target side: skipped, so the lines read 1, 2, 4, 5, 6.
    write_all(tmp / "s.src", "the dog sees a cat .\nthe cat sleeps .\nthe men sing .\na dog .\nthe green queens watched us .\nthey like us .\n");
    write_all(tmp / "s.tgt", "loi kantent .\nloi ke .\n\nloi .\nloi donon .\nke .\n");
    const std::string args = "heads --model " + shell_quote(model) + " --src " + shell_quote(tmp / "s.src") + " --tgt " +
                             shell_quote(tmp / "s.tgt") + " --out " + shell_quote(tmp / "out");
    const Run plain = run_cli(tmp, args);
    REQUIRE(plain.status == 0);
    CHECK_FALSE(std::filesystem::exists(tmp / "out/heads_per_sentence.jsonl"));  // only when asked

    const Run run = run_cli(tmp, args + " --per-sentence");
    INFO(run.err);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.out, Catch::Contains("heads_per_sentence.jsonl"));
    const nlohmann::json study = nlohmann::json::parse(read_all(tmp / "out/heads.json")).at("heads");
    const std::vector<std::string> lines = split_lines(read_all(tmp / "out/heads_per_sentence.jsonl"));
    REQUIRE(lines.size() == 5);
    std::vector<double> magnitude(study.size(), 0.0);
    double src_tokens = 0, tgt_tokens = 0;
    for (std::size_t p = 0; p < lines.size(); ++p) {
        const auto j = nlohmann::json::parse(lines[p]);
        CHECK(j.at("line") == std::vector<int>{1, 2, 4, 5, 6}[p]);
        const auto src = j.at("src").get<std::vector<std::string>>(), tgt_in = j.at("tgt_in").get<std::vector<std::string>>();
        CHECK(src.back() == "</s>");
        CHECK(tgt_in.front() == "<s>");
        src_tokens += double(src.size());
        tgt_tokens += double(tgt_in.size());
        REQUIRE(j.at("heads").size() == study.size());  // E, D, A × 1 layer × 2 heads, in heads.json's order
        for (std::size_t h = 0; h < study.size(); ++h) {
            const auto& jh = j.at("heads")[h];
            CHECK(jh.at("head") == study[h].at("head"));
            const auto g = jh.at("gate_grad").get<std::vector<double>>();
            CHECK(g.size() == (study[h].at("kind") == "E" ? src.size() : tgt_in.size()));
            double sum = 0, abs_sum = 0;
            for (double v : g) {
                sum += v;
                abs_sum += std::fabs(v);
            }
            // The file holds each number at float precision (9 digits), read back here as doubles within
            // ~6e-8 of each value; a signed sum can cancel, so its error is bounded by Σ|g|, not by |Σ g|.
            const double printed = 1e-7 * abs_sum;
            CHECK(jh.at("importance_signed").get<double>() == Approx(sum).margin(printed));
            CHECK(jh.at("importance_sentence").get<double>() == Approx(std::fabs(sum)).margin(printed));
            CHECK(jh.at("importance_token").get<double>() == Approx(abs_sum / double(g.size())).epsilon(1e-6));
            magnitude[h] += abs_sum;
        }
    }
    // heads.json's token importance (raw) is the file's Σ|g| over its query tokens, from the same gradients.
    for (std::size_t h = 0; h < study.size(); ++h)
        CHECK(study[h].at("importance_raw").get<double>() ==
              Approx(magnitude[h] / (study[h].at("kind") == "E" ? src_tokens : tgt_tokens)).epsilon(1e-6));

    // An output that would replace an input is refused before anything is written.
    std::filesystem::remove(tmp / "out/heads_per_sentence.jsonl");
    std::filesystem::create_symlink(tmp / "s.src", tmp / "out/heads_per_sentence.jsonl");
    const std::string before = read_all(tmp / "s.src");
    const Run refused = run_cli(tmp, args + " --per-sentence");
    CHECK(refused.status != 0);
    CHECK(split_lines(refused.err).size() == 1);
    CHECK(read_all(tmp / "s.src") == before);
}
