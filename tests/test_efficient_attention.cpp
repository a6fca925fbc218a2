// Tests of the efficient attentions (nn/attention.h, AttentionScore::Linear and ::Local): their two new ops
// by hand, linear attention's causal prefix sums against the non-causal form on each prefix, local
// attention's window, short training runs on the copy task, and the flags. Cached decoding against the
// uncached model is in test_decode.cpp (its variants include both), gradients in the gradcheck suite.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/data/batch.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/nn/attention.h"
#include "tapeformer/nn/linear.h"
#include "tapeformer/ops.h"
#include "tapeformer/reference_ops.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/run/train.h"
#include "training.h"
#include "helpers.h"

using tf::AttentionScore;
using tf::MultiHeadAttention;
using tf::real;
using tf::Tensor;

namespace {

Tensor random_input(std::int64_t B, std::int64_t T, std::int64_t C, std::uint64_t seed) {
    tf::Rng rng(seed);
    Tensor x = Tensor::empty({B, T, C});
    tf::init_normal(x, rng, 1.0);
    return x;
}

// x[:, t0:t1, :] as a new (B, t1 − t0, C) tensor.
Tensor positions(const Tensor& x, std::int64_t t0, std::int64_t t1) {
    const std::int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    Tensor out = Tensor::empty({B, t1 - t0, C});
    for (std::int64_t b = 0; b < B; ++b)
        std::copy(x.data() + (b * T + t0) * C, x.data() + (b * T + t1) * C, out.data() + b * (t1 - t0) * C);
    return out;
}

// Row t of each batch row of y (B, T, C) against row u of z (B, U, C).
void check_rows_equal(const Tensor& y, std::int64_t t, const Tensor& z, std::int64_t u, double tol) {
    const std::int64_t C = y.size(2);
    for (std::int64_t b = 0; b < y.size(0); ++b)
        for (std::int64_t c = 0; c < C; ++c)
            CHECK(y.data()[(b * y.size(1) + t) * C + c] == Approx(z.data()[(b * z.size(1) + u) * C + c]).margin(tol));
}

}  // namespace

TEST_CASE("efficient attention: elu_plus_one and cumsum by hand", "[ops][attention]") {
    Tensor x = Tensor::from({-1, 0, 2}, {3});
    Tensor y = tf::elu_plus_one(x);
    CHECK(y.data()[0] == Approx(std::exp(-1.0)));
    CHECK(y.data()[1] == Approx(1.0));
    CHECK(y.data()[2] == Approx(3.0));
    // (2, 3): prefix sums along axis 1, then along axis 0
    Tensor a = Tensor::from({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor r = tf::cumsum(a, 1), c = tf::cumsum(a, 0);
    CHECK(std::vector<real>(r.data(), r.data() + 6) == std::vector<real>{1, 3, 6, 4, 9, 15});
    CHECK(std::vector<real>(c.data(), c.data() + 6) == std::vector<real>{1, 2, 3, 5, 7, 9});
    CHECK_THROWS_WITH(tf::cumsum(a, 2), Catch::Contains("cumsum"));
}

TEST_CASE("efficient attention: causal linear attention at position i is the non-causal one on positions 0..i",
          "[attention][linear]") {
    tf::NoGradGuard no_grad;
    const std::int64_t B = 2, T = 6, C = 8, H = 2;
    MultiHeadAttention attn(C, H, real(0), AttentionScore::Linear);
    tf::Rng rng(3);
    attn.init(rng);
    const Tensor x = random_input(B, T, C, 4);
    const Tensor causal = attn.forward(x, x, tf::causal_mask(T), tf::Pass{});  // (B, T, C)
    for (std::int64_t i = 0; i < T; ++i) {
        const Tensor prefix = positions(x, 0, i + 1);
        const Tensor full = attn.forward(prefix, prefix, Tensor(), tf::Pass{});  // no mask: every key of 0..i
        INFO("position " << i);
        check_rows_equal(causal, i, full, i, 1e-5);
    }
}

TEST_CASE("efficient attention: a padded key adds nothing to linear attention's sums", "[attention][linear]") {
    tf::NoGradGuard no_grad;
    const std::int64_t B = 1, T = 5, C = 8, H = 2;
    MultiHeadAttention attn(C, H, real(0), AttentionScore::Linear);
    tf::Rng rng(5);
    attn.init(rng);
    const Tensor x = random_input(B, T, C, 6);
    // the last two positions padded: the same as the first three alone, for those three queries
    const Tensor padded = attn.forward(x, x, tf::key_padding_mask({4, 5, 6, 0, 0}, B, T, 0), tf::Pass{});
    const Tensor first = positions(x, 0, 3);
    const Tensor alone = attn.forward(first, first, Tensor(), tf::Pass{});
    for (std::int64_t i = 0; i < 3; ++i) check_rows_equal(padded, i, alone, i, 1e-5);
    // and in the causal + padding form the decoder gives it
    const Tensor causal = attn.forward(x, x, tf::causal_padding_mask({4, 5, 6, 0, 0}, B, T, 0), tf::Pass{});
    const Tensor causal_alone = attn.forward(first, first, tf::causal_mask(3), tf::Pass{});
    for (std::int64_t i = 0; i < 3; ++i) check_rows_equal(causal, i, causal_alone, i, 1e-5);
    // a mask of another pattern is refused, not misread
    Tensor odd = Tensor::zeros({1, 1, T, T});
    odd.data()[T - 1] = -std::numeric_limits<real>::infinity();  // row 0 drops key T−1, but not as a causal mask would
    odd.data()[1] = -std::numeric_limits<real>::infinity();
    CHECK_THROWS_WITH(attn.forward(x, x, odd, tf::Pass{}), Catch::Contains("linear attention takes"));
}

TEST_CASE("efficient attention: local attention sees only its window", "[attention][local]") {
    tf::NoGradGuard no_grad;
    const std::int64_t B = 1, T = 8, C = 8, H = 2, W = 3;
    MultiHeadAttention local(C, H, real(0), AttentionScore::Local, true, W), wide(C, H, real(0), AttentionScore::Local, true, T),
        dot(C, H, real(0), AttentionScore::Dot);
    tf::Rng rng(7);
    local.init(rng);
    for (MultiHeadAttention* m : {&wide, &dot}) {  // the same weights
        m->in_proj_weight = local.in_proj_weight;
        m->in_proj_bias = local.in_proj_bias;
        m->out_proj = local.out_proj;
    }
    const Tensor x = random_input(B, T, C, 8);
    for (bool causal : {false, true}) {
        INFO("causal " << causal);
        const Tensor mask = causal ? tf::causal_mask(T) : Tensor();
        // A window as long as the sequence is dot-product attention.
        const Tensor y_wide = wide.forward(x, x, mask, tf::Pass{}), y_dot = dot.forward(x, x, mask, tf::Pass{});
        for (std::int64_t t = 0; t < T; ++t) check_rows_equal(y_wide, t, y_dot, t, 1e-6);
        // Changing position 7 changes no output more than W − 1 = 2 positions away (and, causal, none before it).
        Tensor x2 = x.clone();
        for (std::int64_t c = 0; c < C; ++c) x2.data()[7 * C + c] += 1;
        const Tensor y = local.forward(x, x, mask, tf::Pass{}), y2 = local.forward(x2, x2, mask, tf::Pass{});
        for (std::int64_t t = 0; t < 5; ++t) check_rows_equal(y, t, y2, t, 0);
        // Position 5 sees 7 in the encoder's window (|5 − 7| < 3), not in the causal one (7 comes after it).
        double moved = 0;
        for (std::int64_t c = 0; c < C; ++c) moved += std::abs(y.data()[5 * C + c] - y2.data()[5 * C + c]);
        if (causal) CHECK(moved == 0);
        else CHECK(moved > 1e-4);
    }
}

namespace {
// The band op's output and its gradients for q, k, v under the upstream gradient up (B, H, T, D).
struct BandRun {
    std::vector<real> out, dq, dk, dv;
};

template <class F>
BandRun run_band(F attention, const Tensor& q0, const Tensor& k0, const Tensor& v0, const std::vector<real>& up) {
    Tensor q = q0.clone(), k = k0.clone(), v = v0.clone();
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad();
    Tensor y = attention(q, k, v);  // (B, H, T, D)
    BandRun r;
    r.out.assign(y.data(), y.data() + y.numel());
    tf::backward(y, up);
    r.dq.assign(q.grad(), q.grad() + q.numel());
    r.dk.assign(k.grad(), k.grad() + k.numel());
    r.dv.assign(v.grad(), v.grad() + v.numel());
    return r;
}

void check_same(const std::vector<real>& a, const std::vector<real>& b, const char* what) {
    INFO(what);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-5));
}
}  // namespace

TEST_CASE("efficient attention: the band op equals attention over the full (T, T) scores under a band mask",
          "[attention][local][ops]") {
    const std::int64_t B = 2, H = 2, T = 9, D = 4;
    const real scale = real(1) / std::sqrt(real(D)), inf = std::numeric_limits<real>::infinity();
    const Tensor q = tf::reshape(random_input(B, H * T, D, 1), tf::Shape{B, H, T, D}),
                 k = tf::reshape(random_input(B, H * T, D, 2), tf::Shape{B, H, T, D}),
                 v = tf::reshape(random_input(B, H * T, D, 3), tf::Shape{B, H, T, D});
    const Tensor up_t = random_input(1, 1, B * H * T * D, 4);
    const std::vector<real> up(up_t.data(), up_t.data() + up_t.numel());
    Tensor key_mask = Tensor::zeros({B, 1, 1, T});  // batch row 1: its last 3 keys are padding
    for (std::int64_t j = T - 3; j < T; ++j) key_mask.data()[T + j] = -inf;
    for (std::int64_t W : {1, 2, 4, 9, 20})
        for (bool causal : {false, true})
            for (bool padded : {false, true}) {
                INFO("W " << W << ", causal " << causal << ", padded " << padded);
                const Tensor km = padded ? key_mask : Tensor();
                // The full mask: −∞ outside |i − j| < W (causal: i − W < j ≤ i), the key mask inside.
                Tensor full = Tensor::full({B, 1, T, T}, -inf);  // (B, 1, T, T)
                for (std::int64_t b = 0; b < B; ++b)
                    for (std::int64_t i = 0; i < T; ++i)
                        for (std::int64_t j = 0; j < T; ++j)
                            if (j - i < (causal ? 1 : W) && i - j < W) full.data()[(b * T + i) * T + j] = padded ? key_mask.data()[b * T + j] : 0;
                const BandRun composed = run_band([&](const Tensor& a, const Tensor& b, const Tensor& c) {
                    return tf::matmul(tf::softmax(tf::matmul(a, b, false, true, scale), full), c);  // (B, H, T, D)
                }, q, k, v, up);
                const BandRun band = run_band([&](const Tensor& a, const Tensor& b, const Tensor& c) {
                    tf::Rng rng(1);
                    return tf::band_attention(a, b, c, km, W, causal, scale, real(0), rng);
                }, q, k, v, up);
                check_same(band.out, composed.out, "output");
                check_same(band.dq, composed.dq, "dq");
                check_same(band.dk, composed.dk, "dk");
                check_same(band.dv, composed.dv, "dv");
                // With dropout: the reference form draws the same mask per band slot.
                auto with_dropout = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
                    tf::Rng rng(3);
                    return tf::band_attention(a, b, c, km, W, causal, scale, real(0.3), rng);
                };
                const BandRun fast = run_band(with_dropout, q, k, v, up);
                tf::ReferenceModeScope reference;
                const BandRun plain = run_band(with_dropout, q, k, v, up);
                check_same(fast.out, plain.out, "output, dropout");
                check_same(fast.dq, plain.dq, "dq, dropout");
                check_same(fast.dk, plain.dk, "dk, dropout");
                check_same(fast.dv, plain.dv, "dv, dropout");
            }
}

namespace {
// Keeps the "weights" probe: a listener makes local attention show its (T, T) weights (the composed form).
struct WeightsProbe : tf::ForwardObserver {
    Tensor weights;
    void probe(const void*, const char*, const char* name, const Tensor& value) override {
        if (std::string(name) == "weights") weights = value.clone();
    }
};
}  // namespace

TEST_CASE("efficient attention: local attention's band op, its probed form and its head gates agree",
          "[attention][local][heads]") {
    tf::NoGradGuard no_grad;
    const std::int64_t B = 2, T = 10, C = 8, H = 2, W = 3;
    MultiHeadAttention local(C, H, real(0), AttentionScore::Local, true, W);
    tf::Rng rng(11);
    local.init(rng);
    const Tensor x = random_input(B, T, C, 12);
    std::vector<std::int32_t> ids(B * T, 1);
    ids[T + T - 1] = ids[T + T - 2] = 0;  // batch row 1 ends in two pads
    for (bool causal : {false, true})
        for (real gate1 : {real(1), real(0)}) {  // head 1 kept, or masked as --mask-heads does
            INFO("causal " << causal << ", head 1 gate " << gate1);
            local.gate.data()[1] = gate1;
            const Tensor mask = causal ? tf::causal_padding_mask(ids, B, T, 0) : tf::key_padding_mask(ids, B, T, 0);
            const Tensor y_band = local.forward(x, x, mask, tf::Pass{});  // the band op
            WeightsProbe probe;
            tf::Pass listened;
            listened.observer = &probe;
            const Tensor y_full = local.forward(x, x, mask, listened);  // composed over (T, T), weights shown
            double max_diff = 0;  // float rounding only (run with -s to see it)
            for (std::int64_t n = 0; n < y_band.numel(); ++n)
                max_diff = std::max(max_diff, double(std::abs(y_band.data()[n] - y_full.data()[n])));
            CHECK(max_diff < 1e-5);
            REQUIRE(probe.weights.defined());
            REQUIRE(probe.weights.shape() == tf::Shape{B, H, T, T});
            for (std::int64_t i = 0; i < T; ++i)  // zero outside the window
                for (std::int64_t j = 0; j < T; ++j)
                    if (j - i >= (causal ? 1 : W) || i - j >= W) CHECK(probe.weights.data()[i * T + j] == 0);
        }
    local.gate.data()[1] = 1;
}

TEST_CASE("efficient attention: a window goes with local attention only, and local needs one", "[attention][settings]") {
    CHECK_THROWS_WITH(MultiHeadAttention(8, 2, real(0), AttentionScore::Local), Catch::Contains("window"));
    CHECK_THROWS_WITH(MultiHeadAttention(8, 2, real(0), AttentionScore::Linear, true, 4), Catch::Contains("window"));
    tf::ModelConfig c = tf_test::tiny_model_config(20, 8, 2, 16, 1, 1, 32);
    c.attention = AttentionScore::Local;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("--window"));
    c.window = 4;
    CHECK_NOTHROW(c.validate());
    c.attention = AttentionScore::Dot;
    CHECK_THROWS_WITH(c.validate(), Catch::Contains("--attention local"));
}

// Each attention trains the copy task (data/tasks.h) for 1000 steps, a 1+1-layer model, and must then copy
// most held-out sequences exactly by greedy decoding: the efficient forms learn, their gradients and cached
// decoding included. 1000 steps as in test_learns.cpp: at 400 the linear model copied 90+ of 100 in a
// Release build but 81 in the sanitizer build (no -march=native: other rounding), too close to the bar.
TEST_CASE("efficient attention: linear and local models learn the copy task", "[attention][learns][train]") {
    tf_test::TempDir tmp;
    auto task = tf::SequenceTaskOptions::defaults_for(tf::SequenceTask::copy);
    task.valid = task.test = 100;
    tf::write_sequence_task(tmp / "copy", task);
    const auto src = tf_test::split_lines(tf_test::read_all(tmp / "copy/test.src"));
    struct Kind {
        AttentionScore attention;
        std::int64_t window;
        int at_least;  // exact copies out of 100
    };
    for (const Kind& kind : {Kind{AttentionScore::Linear, 0, 90}, Kind{AttentionScore::Local, 4, 90}}) {
        INFO(tf::to_string(kind.attention));
        tf::TrainConfig c = tf_test::copy_task_config(tmp / "copy",
                                                      tmp / ("run-" + std::string(tf::to_string(kind.attention))), 1000);
        c.model.attention = kind.attention;
        c.model.window = kind.window;
        std::ostringstream log;
        tf_test::ThreadsGuard threads;
        tf::train(c, log, false);
        const tf::ModelBundle bundle = tf::load_model_dir(c.out_dir);
        CHECK(bundle.model->config.attention == kind.attention);  // from the metadata
        CHECK(bundle.model->config.window == kind.window);
        const auto hyps = tf::translate_lines(*bundle.model, bundle.tokenizers, src, tf::DecodeOptions{});
        REQUIRE(hyps.size() == src.size());
        int exact = 0;
        for (std::size_t i = 0; i < src.size(); ++i) exact += hyps[i] == src[i];
        INFO(log.str());
        CHECK(exact >= kind.at_least);
    }
}

TEST_CASE("efficient attention: bad flag combinations are refused in one line", "[cli][attention]") {
    tf_test::TempDir tmp;
    const std::string out = " --out " + tf_test::shell_quote(tmp / "run");
    for (auto [flags, what] : {std::pair<const char*, const char*>{"--attention local", "needs a window: --window W"},
                               {"--attention linear --window 8", "is for --attention local"},
                               {"--window 8", "is for --attention local"},
                               {"--attention local --window -1", "--window"},
                               {"--attention sparse", "dot, additive, linear, local"}}) {
        INFO(flags);
        const tf_test::Run r = tf_test::run_cli(tmp, std::string("train --preset toy ") + flags + out);
        CHECK(r.status > 0);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        CHECK_THAT(r.err, Catch::Contains(what));
    }
    CHECK_FALSE(std::filesystem::exists(tmp / "run"));
    const tf_test::Run help = tf_test::run_cli(tmp, "train --help");
    CHECK_THAT(help.out, Catch::Contains("--window") && Catch::Contains("linear"));
}

// The whole model, not one module: a local-attention Transformer's loss and every parameter's gradient on
// a padded batch are the same, up to float rounding, whether its self-attentions run on the band or (a pass
// an observer listens to) as the full scores under a band mask.
TEST_CASE("efficient attention: a local model's gradients on a padded batch equal its probed full form's", "[attention][local]") {
    tf::ModelConfig c = tf_test::tiny_model_config(20, 16, 2, 24, 2, 2, 24);
    c.dropout = c.attention_dropout = c.activation_dropout = 0;
    c.attention = AttentionScore::Local;
    c.window = 3;
    tf::Transformer model(c, 5);
    tf::Rng rng(9);
    std::vector<tf::Example> data(4);
    for (auto& e : data) {  // 2 to 10 tokens a side: padding on both sides, windows cut by both ends
        e.src.resize(2 + rng.below(9));
        e.tgt.resize(2 + rng.below(9));
        for (auto& x : e.src) x = 4 + std::int32_t(rng.below(16));
        for (auto& x : e.tgt) x = 4 + std::int32_t(rng.below(16));
    }
    const tf::Batch b = tf::make_batch(data, {0, 1, 2, 3});
    struct Silent : tf::ForwardObserver {
        void probe(const void*, const char*, const char*, const Tensor&) override {}
    } silent;
    std::vector<std::vector<real>> grads[2];
    double losses[2] = {0, 0};
    for (int probed = 0; probed < 2; ++probed) {
        for (const auto& p : model.parameters()) {
            Tensor t = p.tensor;
            if (t.has_grad()) t.zero_grad();
        }
        tf::Pass pass;
        if (probed) pass.observer = &silent;
        Tensor logits = model.forward(b.src, b.B, b.S, b.dec_in, b.T, pass);
        Tensor loss = tf::sequence_loss(logits, b.target, c.pad_id, 0);
        losses[probed] = loss.item();
        tf::backward(loss);
        for (const auto& p : model.parameters()) grads[probed].emplace_back(p.tensor.grad(), p.tensor.grad() + p.tensor.numel());
    }
    CHECK(losses[0] == Approx(losses[1]).epsilon(1e-6));
    const auto params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
        INFO(params[i].name);
        double scale = 0, diff = 0;
        for (std::size_t j = 0; j < grads[0][i].size(); ++j) {
            scale = std::max(scale, double(std::fabs(grads[1][i][j])));
            diff = std::max(diff, double(std::fabs(grads[0][i][j] - grads[1][i][j])));
        }
        CHECK(diff <= 1e-5 * scale + 1e-9);
    }
}
