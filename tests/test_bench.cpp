// The training benchmark's library function on a tiny config: every figure it reports is present and
// sane. No timing assertions: the machine may be busy.
#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tapeformer/bench.h"

using namespace tf;

namespace {
BenchTrainOptions tiny() {
    BenchTrainOptions o;
    o.d_model = 16;
    o.heads = 2;
    o.ffn = 32;
    o.layers = 1;
    o.vocab = 40;
    o.batch = 4;
    o.src_len = 6;
    o.tgt_len = 5;
    o.steps = 2;
    o.bench_warmup = 1;
    o.warmup_steps = 10;
    o.name = "tiny";
    return o;
}
}  // namespace

TEST_CASE("bench train: a tiny run reports positive rates, finite losses and torch_ref's JSON keys", "[bench]") {
    BenchTrainOptions o = tiny();
    o.eval_greedy = true;
    o.eval_reps = 1;
    o.profile = 1;
    const BenchTrainResult r = bench_train(o);

    CHECK(r.steps == 2);
    CHECK(r.params > 0);
    CHECK(r.threads > 0);
    CHECK(r.ms_per_step > 0);
    CHECK(r.ms_per_step_min > 0);
    CHECK(r.ms_per_step_min <= r.ms_per_step_median);
    CHECK(r.tgt_tokens_per_s > 0);
    CHECK(r.src_tgt_tokens_per_s > r.tgt_tokens_per_s);
    CHECK(r.tgt_nonpad_tokens_per_s > 0);
    CHECK(r.tgt_nonpad_tokens_per_s <= r.tgt_tokens_per_s);
    CHECK(r.achieved_gflop_s > 0);
    CHECK(r.peak_rss_mb > 0);
    CHECK(std::isfinite(r.loss_first));
    CHECK(std::isfinite(r.loss_last));
    CHECK(r.loss_first > 0);
    CHECK(r.has_greedy);
    CHECK(r.greedy_tokens_per_s > 0);
    CHECK(!r.backward_ms_by_op.empty());
    for (const char* phase : {"fwd", "bwd", "clip", "optim"}) {
        INFO(phase);
        REQUIRE(r.phase_ms.count(phase) == 1);
        CHECK(r.phase_ms.at(phase) >= 0);
    }
    // torch_ref.py's flops_forward for this config, by hand: per encoder layer
    // 2·24·16·48 + 2·24·16·16 + 4·4·36·16 + 4·24·16·32 = 36864 + 12288 + 9216 + 49152.
    const ForwardFlops fl = forward_flops(o);
    CHECK(fl.encoder == Approx(36864 + 12288 + 9216 + 49152));
    CHECK(r.train_gflop_per_step == Approx(3 * r.fwd_gflop_per_step));

    // The JSON line round-trips through a parser and carries the keys compare.sh and people read.
    const nlohmann::json j = nlohmann::json::parse(r.to_json().dump());
    for (const char* key : {"tgt_tokens_per_s", "src_tgt_tokens_per_s", "tgt_nonpad_tokens_per_s", "ms_per_step",
                            "ms_per_step_median", "ms_per_step_min", "peak_rss_mb", "train_gflop_per_step",
                            "fwd_gflop_per_step", "achieved_gflop_s", "phase_ms", "loss_first", "loss_last", "params",
                            "threads", "config", "greedy_tokens_per_s", "greedy_ms_per_batch"}) {
        INFO(key);
        CHECK(j.contains(key));
    }
    CHECK(j.at("config").at("d_model") == 16);
    CHECK(j.at("name") == "tiny");
}

TEST_CASE("bench train: bad options name the flag", "[bench]") {
    BenchTrainOptions o = tiny();
    o.heads = 3;  // does not divide 16
    CHECK_THROWS_WITH(bench_train(o), Catch::Contains("heads"));
    o = tiny();
    o.min_len_frac = 1.5;
    CHECK_THROWS_WITH(bench_train(o), Catch::Contains("--min-len-frac"));
}
