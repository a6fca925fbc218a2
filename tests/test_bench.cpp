// The training benchmark's library function on a tiny config. No timing thresholds (the machine may be
// busy): instead, every reported figure must follow from the others and from the configuration as
// torch_ref.py defines them, the losses must be those of a model that really trains on the batches, and
// profiling must not change what is measured.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tapeformer/bench/attention_bench.h"
#include "tapeformer/bench/bench.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/pool.h"
#include "helpers.h"

using namespace tf;
using namespace tf_test;

namespace {

// B = 4 sentences, S = 6, T = 5, C = 16, F = 32, one layer each side, V = 40.
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
    o.steps = 3;
    o.bench_warmup = 1;
    o.warmup_steps = 10;
    o.name = "tiny";
    return o;
}

double sum_of(const std::map<std::string, double>& m) {
    double s = 0;
    for (const auto& [k, v] : m) s += v;
    return s;
}

}  // namespace

TEST_CASE("bench train: the parameter count is the model's, tied weights counted once", "[bench]") {
    // By hand, C = 16, F = 32, V = 40, post-norm (no final norms), sinusoidal positions (no table):
    //   attention  3C·C + 3C + C·C + C = 1088       FFN  F·C + F + C·F + C = 1072       LayerNorm  2C = 32
    //   encoder layer  1088 + 1072 + 2·32 = 2224    decoder layer  2·1088 + 1072 + 3·32 = 3344
    //   untied: source and target embeddings and the output projection, 3·V·C = 1920, + 2224 + 3344 = 7488
    //   tied: one V·C table for all three: 640 + 2224 + 3344 = 6208
    //   and the output projection's bias, V = 40, as torch_ref.py's nn.Linear has: 7528 and 6248.
    BenchTrainOptions o = tiny();
    o.steps = 0;
    CHECK(bench_train(o).params == 7528);
    o.tie_embeddings = true;
    CHECK(bench_train(o).params == 6248);
}

TEST_CASE("bench train: rates, FLOP/s and phases follow from the step time and the batch shape", "[bench]") {
    const BenchTrainOptions o = tiny();
    const BenchTrainResult r = bench_train(o);
    REQUIRE(r.steps == 3);
    REQUIRE(r.ms_per_step > 0);
    const double seconds_per_step = r.ms_per_step / 1000;
    // B·T target positions and B·(S + T) positions per step, padding included.
    CHECK(r.tgt_tokens_per_s * seconds_per_step == Approx(4 * 5));
    CHECK(r.src_tgt_tokens_per_s * seconds_per_step == Approx(4 * (6 + 5)));
    CHECK(r.achieved_gflop_s * seconds_per_step == Approx(r.train_gflop_per_step));
    // Lengths are drawn from [ceil(0.75·L), L]: with these seeds some rows are padded on both sides.
    CHECK(r.tgt_nonpad_tokens_per_s < r.tgt_tokens_per_s);
    CHECK(r.src_tgt_nonpad_tokens_per_s < r.src_tgt_tokens_per_s);
    CHECK(r.tgt_nonpad_tokens_per_s >= 0.75 * r.tgt_tokens_per_s * 0.99);  // at least ceil(0.75·T) labels a row
    CHECK(r.ms_per_step_min <= r.ms_per_step);                           // the minimum of the steps, not a sum
    // The four phases are the parts of a step, per step: together they are at most the step, and most of it.
    REQUIRE(r.phase_ms.size() == 4);
    CHECK(sum_of(r.phase_ms) <= r.ms_per_step * (1 + 1e-9));
    CHECK(sum_of(r.phase_ms) >= 0.5 * r.ms_per_step);
    // torch_ref.py's flops_forward, by hand: per encoder layer
    // 2·24·16·48 + 2·24·16·16 + 4·4·36·16 + 4·24·16·32 = 36864 + 12288 + 9216 + 49152.
    tf::Transformer model(tf_test::tiny_model_config(40, 16, 2, 32, 1, 1, 16));  // tiny()'s model
    const ForwardFlops fl = forward_flops(model, o.batch, o.src_len, o.tgt_len);
    CHECK(fl.of("encoder") == Approx(36864 + 12288 + 9216 + 49152));
    REQUIRE(fl.by_stack.size() == 3);  // the parts that compute, named by the module walk, in data order
    CHECK(fl.by_stack[0].first == "encoder");
    CHECK(fl.by_stack[1].first == "decoder");
    CHECK(fl.by_stack[2].first == "generator");
    CHECK(fl.total == Approx(fl.of("encoder") + fl.of("decoder") + fl.of("generator")));
    CHECK(r.fwd_gflop_per_step == Approx(fl.total / 1e9));
    CHECK(r.train_gflop_per_step == Approx(3 * r.fwd_gflop_per_step));
}

TEST_CASE("bench train: the losses are those of a model that trains, and repeat exactly", "[bench]") {
    BenchTrainOptions o = tiny();
    o.dropout = 0;
    o.bench_warmup = 0;
    o.steps = 9;  // the batches cycle every 8 steps: step 9 sees step 1's batch again, after 8 updates
    o.warmup_steps = 4;  // Noam peaks at step 4 with lr ≈ 0.06: a few steps are enough to learn
    const BenchTrainResult a = bench_train(o);
    // A fresh model predicts about uniformly over V = 40 words: cross-entropy near ln 40 = 3.69.
    CHECK(std::abs(a.loss_first - std::log(40.0)) < 0.5);
    CHECK(a.loss_last < a.loss_first - 0.2);  // 4.00 -> 3.66 when written
    // Same seed, same numbers, to the bit; another seed, other batches and weights.
    const BenchTrainResult b = bench_train(o);
    CHECK(b.loss_first == a.loss_first);
    CHECK(b.loss_last == a.loss_last);
    o.seed = 1;
    CHECK(bench_train(o).loss_first != a.loss_first);
}

TEST_CASE("bench train: profiling times the ops of the real backward pass, in the same memory", "[bench]") {
    BenchTrainOptions o = tiny();
    o.steps = 2;  // batches 0 and 1, as the profiled run below sees them (the peak depends on the batch)
    pool_reset_peak();
    const BenchTrainResult plain = bench_train(o);
    const std::size_t plain_peak = pool_stats().peak_bytes_asked;
    o.steps = 1;
    o.profile = 2;
    pool_reset_peak();
    const BenchTrainResult profiled = bench_train(o);
    const std::size_t profiled_peak = pool_stats().peak_bytes_asked;
    // Every op the model records shows up, and nothing else.
    for (const char* op : {"affine", "attention_heads", "embedding", "cross_entropy"}) {
        INFO(op);
        CHECK(profiled.backward_ms_by_op.count(op) == 1);
        CHECK(profiled.forward_ms_by_op.count(op) == 1);
    }
    // The products' wall time is part of a profiled step's, and the step has time outside them.
    CHECK(profiled.profile_products_ms > 0);
    CHECK(profiled.profile_products_ms < profiled.profile_step_ms);
    CHECK(profiled.profile_rounding_ms == 0);  // fp32 rounds nothing to bf16
    for (const auto& [op, ms] : profiled.backward_ms_by_op) {
        INFO(op);
        CHECK(ms >= 0);
    }
    // --composed-attention: the composed ops instead of attention_heads, the same numbers.
    o.composed_attention = true;
    const BenchTrainResult composed = bench_train(o);
    for (const char* op : {"matmul", "softmax", "slice_heads"}) {
        INFO(op);
        CHECK(composed.backward_ms_by_op.count(op) == 1);
    }
    CHECK(composed.backward_ms_by_op.count("attention_heads") == 0);
    CHECK(composed.loss_last == profiled.loss_last);
    CHECK(plain.backward_ms_by_op.empty());
    CHECK(plain.forward_ms_by_op.empty());
    // The profiled backward frees each record as it goes, as the real one does: no higher peak of what the
    // tensors asked for (the pool's own peak also counts which cached buffer served each request).
    CHECK(profiled_peak <= plain_peak);
}

TEST_CASE("bench train: --keep-values keeps what train lets go until backward: the same losses, a higher peak", "[bench]") {
    BenchTrainOptions o = tiny();
    o.layers = 2;  // a norm's output is let go where the next sublayer's norm reads it again: inside a stack
    o.bench_warmup = 0;
    o.steps = 2;
    pool_reset_peak();
    const BenchTrainResult let_go = bench_train(o);
    const std::size_t let_go_peak = pool_stats().peak_bytes_asked;
    o.keep_values = true;
    pool_reset_peak();
    const BenchTrainResult kept = bench_train(o);
    const std::size_t kept_peak = pool_stats().peak_bytes_asked;
    CHECK(kept.loss_first == let_go.loss_first);
    CHECK(kept.loss_last == let_go.loss_last);
    // At least one (B, L, C) tensor of floats more at the peak (test_determinism bounds it per sublayer).
    CHECK(kept_peak >= let_go_peak + std::size_t(o.batch * o.src_len * o.d_model) * sizeof(float));
    CHECK(nlohmann::json::parse(kept.to_json())["config"]["keep_values"] == true);
}

TEST_CASE("bench train: the JSON line carries the result under torch_ref.py's keys", "[bench]") {
    BenchTrainOptions o = tiny();
    o.eval_greedy = true;
    o.eval_reps = 1;
    const BenchTrainResult r = bench_train(o);
    REQUIRE(r.has_greedy);
    CHECK(r.greedy_tokens_per_s * r.greedy_ms_per_batch / 1000 == Approx(4 * 5));  // B·T tokens per batch
    const nlohmann::json j = nlohmann::json::parse(r.to_json());
    CHECK(j.at("name") == "tiny");
    CHECK(j.at("impl") == "tapeformer");
    CHECK(j.at("params") == r.params);
    CHECK(j.at("threads") == r.threads);
    CHECK(j.at("steps") == 3);
    CHECK(j.at("ms_per_step").get<double>() == r.ms_per_step);
    CHECK(j.at("tgt_tokens_per_s").get<double>() == r.tgt_tokens_per_s);
    CHECK(j.at("loss_first").get<double>() == r.loss_first);
    CHECK(j.at("loss_last").get<double>() == r.loss_last);
    CHECK(j.at("greedy_ms_per_batch").get<double>() == r.greedy_ms_per_batch);
    CHECK(j.at("phase_ms").at("bwd").get<double>() == r.phase_ms.at("bwd"));
    const nlohmann::json& c = j.at("config");
    CHECK(c.at("d_model") == 16);
    CHECK(c.at("enc_layers") == 1);  // --layers resolved
    CHECK(c.at("dec_layers") == 1);
    CHECK(c.at("vocab") == 40);
    CHECK(c.at("batch") == 4);
    CHECK(c.at("src_len") == 6);
    CHECK(c.at("tgt_len") == 5);
    for (const char* key : {"src_tgt_tokens_per_s", "tgt_nonpad_tokens_per_s", "src_tgt_nonpad_tokens_per_s",
                            "ms_per_step_median", "ms_per_step_min", "peak_rss_mb", "train_gflop_per_step",
                            "fwd_gflop_per_step", "achieved_gflop_s", "greedy_tokens_per_s"}) {
        INFO(key);
        CHECK(j.contains(key));
    }
}

TEST_CASE("bench train: bad options name the flag", "[bench]") {
    BenchTrainOptions o = tiny();
    o.heads = 3;  // does not divide 16
    CHECK_THROWS_WITH(bench_train(o), Catch::Contains("heads"));
    o = tiny();
    o.min_len_frac = 1.5;
    CHECK_THROWS_WITH(bench_train(o), Catch::Contains("--min-len-frac"));
}

// `bench attention` (docs/lesson-efficient-attention.md): the figures are there and the mask's size follows
// from T; no timing thresholds.
TEST_CASE("bench attention: every kind times a forward + backward and counts its memory, the mask's from T", "[bench][attention]") {
    for (const AttentionScore kind : {AttentionScore::Dot, AttentionScore::Linear, AttentionScore::Local, AttentionScore::Additive}) {
        for (const bool causal : {true, false}) {
            BenchAttentionOptions o;
            o.kind = kind;
            o.length = 24;
            o.window = 5;
            o.causal = causal;
            o.reps = 1;
            const BenchAttentionResult r = bench_attention(o);
            INFO(r.to_text());
            CHECK(r.ms_median > 0);
            CHECK(r.forward_ms_median > 0);
            CHECK(r.forward_ms_median <= r.ms_median);
            CHECK(r.peak_mb > 0);
            // the causal mask is (1, 1, T, T) floats, built before the pass; the encoder's pass has none
            CHECK(r.mask_mb == Approx(causal ? 24.0 * 24.0 * sizeof(real) / (1024.0 * 1024.0) : 0.0));
            const std::string head = std::string("attention ") + to_string(kind) + (causal ? " causal" : "") + "  T 24  B 1  C 64  H 4";
            CHECK(r.to_text().rfind(head, 0) == 0);
            CHECK((r.to_text().find(" W 5:") != std::string::npos) == (kind == AttentionScore::Local));
        }
    }
}

TEST_CASE("bench attention: bad options name the flag", "[bench][attention]") {
    BenchAttentionOptions o;
    o.length = 0;
    CHECK_THROWS_WITH(bench_attention(o), Catch::Contains("--length"));
    o = BenchAttentionOptions();
    o.heads = 3;  // does not divide 64
    CHECK_THROWS_WITH(bench_attention(o), Catch::Contains("--heads 3"));
    o = BenchAttentionOptions();
    o.kind = AttentionScore::Local;
    o.window = 0;
    CHECK_THROWS_WITH(bench_attention(o), Catch::Contains("--window"));
}

TEST_CASE("bench attention: the command prints one line per run and refuses a bad kind in one line", "[bench][attention][cli]") {
    TempDir tmp("bench_attention");
    const Run ok = run_cli(tmp, "bench attention --kind local --window 4 --length 16 --reps 1");
    INFO(ok.err);
    CHECK(ok.status == 0);
    CHECK(ok.out.rfind("attention local causal  T 16  B 1  C 64  H 4 W 4: forward+backward ", 0) == 0);
    CHECK(std::count(ok.out.begin(), ok.out.end(), '\n') == 1);
    const Run bad = run_cli(tmp, "bench attention --kind cosine --length 16");
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
    CHECK(bad.err.find("cosine") != std::string::npos);
}

// What the band buys (docs/lesson-efficient-attention.md): local attention's tensor memory grows like T, dot
// product attention's like T² (its (T, T) scores and weights). Counted by the buffer pool, not timed.
TEST_CASE("bench attention: local attention's memory grows like T, dot-product attention's like T squared", "[bench][attention]") {
    auto peak = [](AttentionScore kind, std::int64_t T) {
        BenchAttentionOptions o;
        o.kind = kind;
        o.length = T;
        o.window = 16;
        o.causal = false;  // no (T, T) mask beside the pass
        o.reps = 1;
        return bench_attention(o).peak_mb;
    };
    const double local_512 = peak(AttentionScore::Local, 512), local_1024 = peak(AttentionScore::Local, 1024);
    const double dot_512 = peak(AttentionScore::Dot, 512), dot_1024 = peak(AttentionScore::Dot, 1024);
    INFO("local " << local_512 << " -> " << local_1024 << " MiB, dot " << dot_512 << " -> " << dot_1024 << " MiB");
    CHECK(local_1024 / local_512 < 2.2);  // 2 for memory linear in T
    CHECK(dot_1024 / dot_512 > 3.4);      // 4 for memory quadratic in T
    CHECK(local_1024 < dot_1024 / 4);
}
