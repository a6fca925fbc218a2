// heads prune --method l0 (heads_l0.h): a strong penalty closes every gate, none closes the heads a frozen
// model needs less than the penalty is worth; the report's scores are those of the model it leaves behind;
// runs are seeded; the command's JSON and errors.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tapeformer/run/checkpoint.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/study/heads_l0.h"
#include "head_fixtures.h"
#include "helpers.h"

using namespace tf_test;

namespace {


std::vector<std::string> first_lines(const std::string& path, std::size_t n) {
    const auto all = split_lines(read_all(path));
    return {all.begin(), all.begin() + std::ptrdiff_t(std::min(n, all.size()))};
}

}  // namespace

TEST_CASE("heads l0: a large lambda closes every gate, the scores after are those of the model left behind, seeded",
          "[heads][prune][l0]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string dir = train_tiny_model(tmp, 40);
    const auto train_src = first_lines(toy + "valid.src", 200), train_tgt = first_lines(toy + "valid.tgt", 200);
    const auto src = first_lines(toy + "test.src", 30), ref = first_lines(toy + "test.tgt", 30);

    tf::L0Options o;
    o.steps = 150;      // Adam moves log α by about gate_lr = 0.05 a step: from 3 to below −2.4 (closed) in ~110
    o.lr = 0;           // the model stays as it is: only the gates learn
    o.lambda = 5;       // each open head costs more than the whole NLL of a step can gain back
    o.log_every = 20;
    tf::ModelBundle bundle = tf::load_model_dir(dir);
    const double bleu_loaded =
        tf::corpus_bleu(tf::translate_lines(*bundle.model, bundle.tokenizers, src, o.decode, o.batch_tokens), ref).score;
    const tf::L0Report r = tf::l0_prune_heads(*bundle.model, bundle.tokenizers, train_src, train_tgt, src, ref, o);
    CHECK(r.bleu_before == Approx(bleu_loaded));
    REQUIRE(r.heads.size() == 6);
    CHECK(r.closed == 6);
    for (const auto& h : r.heads) {
        INFO(h.id.str() << ": log alpha " << h.log_alpha << ", P(open) " << h.p_open);
        CHECK(h.closed());
        CHECK(h.log_alpha < o.init_log_alpha);
        CHECK(h.p_open < 0.5);
    }
    REQUIRE(r.progress.size() == 8);  // steps 20, 40, ..., 140 and the last, 150
    CHECK(r.progress[0].step == 20);
    CHECK(r.progress.back().step == 150);
    CHECK(r.progress.back().closed == 6);
    CHECK(r.progress.back().expected_open < r.progress[0].expected_open);
    // Every gate of the model is 0 now: the scores after are its scores.
    CHECK(bundle.model->encoder[0].self_attn.gate.to_vector() == std::vector<tf::real>(2, 0));
    CHECK(r.bleu_after ==
          Approx(tf::corpus_bleu(tf::translate_lines(*bundle.model, bundle.tokenizers, src, o.decode, o.batch_tokens), ref).score));

    // Without a penalty and with gates only on cross-attention, nothing pushes a gate of a frozen model
    // shut that it uses; the other attentions keep their gates of 1.
    tf::ModelBundle again = tf::load_model_dir(dir);
    o.lambda = 0;
    o.kinds = {tf::HeadKind::A};
    const tf::L0Report free = tf::l0_prune_heads(*again.model, again.tokenizers, train_src, train_tgt, src, ref, o);
    REQUIRE(free.heads.size() == 2);
    CHECK(free.heads[0].id.str() == "A:0:0");
    CHECK(again.model->encoder[0].self_attn.gate.to_vector() == std::vector<tf::real>(2, 1));
    CHECK(free.nll_after <= free.nll_before + 0.05);

    // Seeded: the same run twice gives the same gates.
    tf::ModelBundle third = tf::load_model_dir(dir);
    const tf::L0Report same = tf::l0_prune_heads(*third.model, third.tokenizers, train_src, train_tgt, src, ref, o);
    for (std::size_t i = 0; i < free.heads.size(); ++i) CHECK(same.heads[i].log_alpha == free.heads[i].log_alpha);

    o.steps = 0;
    CHECK_THROWS_WITH(tf::l0_prune_heads(*third.model, third.tokenizers, train_src, train_tgt, src, ref, o),
                      Catch::Contains("--l0-steps"));
}

TEST_CASE("heads prune --method l0: JSON of the gates and scores, flags of the other method are refused",
          "[heads][prune][l0][cli]") {
    TempDir tmp;
    const std::string toy = std::string(TF_SOURCE_DIR) + "/data/toy/";
    const std::string cli = shell_quote(TF_CLI) + " --threads 1 ";
    const std::string dir = train_tiny_model(tmp, 20), err = tmp / "err";
    write_all(tmp / "s", join_lines(first_lines(toy + "test.src", 20)));
    write_all(tmp / "r", join_lines(first_lines(toy + "test.tgt", 20)));
    write_all(tmp / "ts", join_lines(first_lines(toy + "valid.src", 100)));
    write_all(tmp / "tt", join_lines(first_lines(toy + "valid.tgt", 100)));
    const std::string base = cli + "heads prune --method l0 --model " + shell_quote(dir) + " --src " + shell_quote(tmp / "s") +
                             " --ref " + shell_quote(tmp / "r");
    const std::string with_data = base + " --imp-src " + shell_quote(tmp / "ts") + " --imp-tgt " + shell_quote(tmp / "tt");
    const std::string run = with_data + " --lambda 5 --l0-steps 30 --lr 0 --json " + shell_quote(tmp / "l0.json") + " >" +
                            shell_quote(tmp / "out") + " 2>" + shell_quote(err);
    REQUIRE(std::system(run.c_str()) == 0);
    const auto j = nlohmann::json::parse(read_all(tmp / "l0.json"));
    REQUIRE(j.at("models").size() == 1);
    const auto& m = j.at("models")[0];
    CHECK(m.at("temperature") == 0.33);
    CHECK(m.at("heads").size() == 6);
    CHECK(m.at("closed").get<int>() == int(m.at("closed_heads").size()));
    CHECK(m.at("before").at("bleu").is_number());
    CHECK_THAT(read_all(tmp / "out"), Catch::Contains("heads closed") && Catch::Contains("E[open heads]"));

    for (const std::string& bad : {with_data + " --order random", base, cli + "heads prune --model " + shell_quote(dir) +
                                   " --src " + shell_quote(tmp / "s") + " --ref " + shell_quote(tmp / "r") +
                                   " --order random --lambda 1"}) {
        INFO(bad);
        CHECK(std::system((bad + " >/dev/null 2>" + shell_quote(err)).c_str()) != 0);
        CHECK(split_lines(read_all(err)).size() == 1);
    }
    CHECK_THAT(read_all(err), Catch::Contains("--lambda does not apply to --method mask"));
}
