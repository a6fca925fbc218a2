// train --overfit-batch (train.h): training on one batch again and again must drive its loss to about 0 —
// the debugging habit of checking that model, loss and optimizer can fit anything at all.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <sstream>

#include "tapeformer/blas.h"
#include "tapeformer/run/train.h"
#include "helpers.h"

using namespace tf_test;
using nlohmann::json;

namespace {

// The first `n` lines of data/toy/<name>, written to tmp/<name>.
std::string toy_head(const TempDir& tmp, const std::string& name, std::size_t n) {
    auto lines = split_lines(read_all(std::string(TF_SOURCE_DIR) + "/data/toy/" + name));
    lines.resize(n);
    return write_file(tmp, name, join_lines(lines));
}

}  // namespace

TEST_CASE("train --overfit-batch: a tiny model fits one batch to a loss near 0 within 300 steps", "[train][overfit]") {
    TempDir tmp("overfit");
    tf::TrainConfig c;
    c.data.train_src = toy_head(tmp, "train.src", 300);
    c.data.train_tgt = toy_head(tmp, "train.tgt", 300);
    c.data.tokenizer = tf::TokenizerKind::word;
    c.data.vocab_size = 0;
    c.data.max_len = 40;
    c.data.batch_tokens = 200;  // the first few sentences of the file
    c.model.d_model = 32;
    c.model.heads = 2;
    c.model.ffn = 64;
    c.model.enc_layers = c.model.dec_layers = 1;
    c.model.dropout = c.model.attention_dropout = c.model.activation_dropout = 0.1;  // as configured: on
    c.model.max_len = 64;
    c.optim.label_smoothing = 0;  // so that the loss itself can reach 0
    c.optim.schedule.kind = tf::ScheduleKind::Constant;  // 300 steps: loss 0.016 on an AMD EPYC (bar 0.05)
    c.optim.schedule.lr = 3e-3;
    c.optim.schedule.warmup = 20;
    c.out_dir = tmp / "run";
    c.threads = 1;
    c.max_steps = 300;
    c.log_every = 10;
    c.overfit_batch = true;
    std::ostringstream log;
    tf::TrainResult r;
    {
        ThreadsGuard threads;
        r = tf::train(c, log, false);
    }
    INFO(log.str());
    CHECK(log.str().find("--overfit-batch: every step trains on the first") != std::string::npos);
    std::vector<double> losses;
    for (const std::string& line : split_lines(read_all(tmp / "run/metrics.jsonl"))) {
        const json j = json::parse(line);
        if (j.at("type") == "train") losses.push_back(j.at("loss").get<double>());
    }
    REQUIRE(losses.size() == 30);
    CHECK(losses.front() > 2.0);   // it starts as a guess over the vocabulary ...
    CHECK(losses.back() < 0.05);   // ... and ends having learnt the batch by heart
    CHECK(r.last_loss < 0.05);
    CHECK(r.stop_reason == tf::StopReason::max_steps);
    // Only one batch was ever seen: the epoch never ends.
    CHECK(json::parse(read_all(tmp / "run/state.json")).at("step") == 300);

    // Epochs cannot end with one batch, so they cannot stop such a run.
    tf::TrainConfig bad = c;
    bad.max_steps = 0;
    bad.epochs = 2;
    CHECK_THROWS_WITH(bad.validate(), Catch::Contains("--overfit-batch") && Catch::Contains("--max-steps or --time-budget"));
}
