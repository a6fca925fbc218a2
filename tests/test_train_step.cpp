// The one training step (train_step.h) that train and bench train both run: its hooks see each phase and
// the unclipped gradients without changing a bit; a non-finite loss stops it before any weight changes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tapeformer/run/train.h"
#include "tapeformer/run/train_step.h"
#include "helpers.h"

namespace {

tf::ModelConfig tiny_model() { return tf_test::tiny_model_config(12, 8, 2, 16, 1, 1, 16); }  // V, C, H, F, layers, positions

// Two rows; pad = 0, BOS = 1, EOS = 2, words from 4.
struct TinyBatch {
    std::vector<std::int32_t> src{5, 6, 2, 7, 2, 0};     // (2, 3)
    std::vector<std::int32_t> dec_in{1, 8, 9, 1, 10, 0};  // (2, 3)
    std::vector<std::int32_t> target{8, 9, 2, 10, 2, 0};  // (2, 3)
    tf::StepBatch step() const { return tf::StepBatch{src, dec_in, target, 2, 3, 3}; }
};

// Every parameter's bytes, in order: equal exactly when every weight has the same bits.
std::vector<unsigned char> weight_bytes(tf::Transformer& model) {
    std::vector<unsigned char> bytes;
    for (const tf::NamedTensor& p : model.parameters()) {
        const auto* data = reinterpret_cast<const unsigned char*>(p.tensor.data());
        bytes.insert(bytes.end(), data, data + p.tensor.numel() * sizeof(tf::real));
    }
    return bytes;
}

}  // namespace

TEST_CASE("train step: hooks see the four phases in order and the unclipped gradients, and change no bit",
          "[train][step]") {
    const TinyBatch batch;
    tf::Transformer plain(tiny_model(), 7), hooked(tiny_model(), 7);
    tf::Adam plain_adam(plain.parameters(), tf::AdamOptions{}), hooked_adam(hooked.parameters(), tf::AdamOptions{});
    tf::Rng plain_rng(11), hooked_rng(11);
    tf::StepSettings s;
    s.lr = 1e-2;
    s.clip = 0.05;  // small: clipping acts on every step

    std::vector<std::string> phases;
    std::int64_t records = 0;
    double norm_seen = -1;
    tf::StepHooks hooks;
    hooks.phase_begins = [&](tf::StepPhase p) { phases.push_back(std::string("begin ") + tf::to_string(p)); };
    hooks.phase_ends = [&](tf::StepPhase p) { phases.push_back(std::string("end ") + tf::to_string(p)); };
    hooks.backward_record = [&](const tf::TapeRecord&) { ++records; };
    hooks.before_update = [&](const tf::StepResult& r) {
        phases.push_back("before_update");
        norm_seen = tf::grad_norm(hooked_adam.params());  // the gradients are there, not yet scaled
        CHECK(norm_seen == r.grad_norm);
        CHECK(tf::tape().records().empty());
    };
    for (std::int64_t step = 1; step <= 3; ++step) {
        s.step = step;
        phases.clear();
        records = 0;
        const tf::StepResult a = tf::train_step(tf::StepParts{plain, plain_adam, nullptr, &plain_rng}, batch.step(), s);
        const tf::StepResult b = tf::train_step(tf::StepParts{hooked, hooked_adam, nullptr, &hooked_rng}, batch.step(), s, hooks);
        CHECK(phases == std::vector<std::string>{"begin fwd", "end fwd", "begin bwd", "end bwd", "begin clip", "end clip",
                                                 "before_update", "begin optim", "end optim"});
        CHECK(records > 0);
        CHECK(a.loss.loss == b.loss.loss);
        CHECK(a.grad_norm == b.grad_norm);
        CHECK(b.grad_norm > s.clip);
        CHECK(b.loss.tokens == 5);
        CHECK(weight_bytes(plain) == weight_bytes(hooked));
        CHECK(plain_rng.offset == hooked_rng.offset);
        for (const tf::NamedTensor& p : hooked.parameters()) CHECK_FALSE(p.tensor.has_grad());  // set to none
    }
}

TEST_CASE("train step: a non-finite loss stops the step before any weight changes, naming the op with check_nan",
          "[train][step]") {
    const TinyBatch batch;
    tf::Transformer model(tiny_model(), 7);
    tf::Adam adam(model.parameters(), tf::AdamOptions{});
    tf::Rng rng(11);
    // The whole first parameter (the source embedding): one NaN value alone may be dropped by the embedding's
    // dropout and leave the loss finite, depending on the mask.
    tf::Tensor first = model.parameters().front().tensor;
    std::fill(first.data(), first.data() + first.numel(), std::numeric_limits<tf::real>::quiet_NaN());
    // NaN's bits compare equal to themselves: the bytes show that nothing moved.
    const std::vector<unsigned char> before = weight_bytes(model);
    tf::StepSettings s;
    s.lr = 1e-2;
    s.step = 4;
    for (bool check_nan : {false, true}) {
        s.check_nan = check_nan;
        bool optimizer_reached = false;
        tf::StepHooks hooks;
        hooks.phase_begins = [&](tf::StepPhase p) { optimizer_reached |= p == tf::StepPhase::optimizer; };
        try {
            tf::train_step(tf::StepParts{model, adam, nullptr, &rng}, batch.step(), s, hooks);
            FAIL("NaN weights gave a finite loss");
        } catch (const tf::NonFiniteStep& e) {
            CHECK(e.of_loss);
            CHECK(e.step == 4);
            CHECK(std::string(e.what()).rfind("non-finite loss at step 4", 0) == 0);
            CHECK((e.where.find("first non-finite value produced by op #") != std::string::npos) == check_nan);
        }
        CHECK_FALSE(optimizer_reached);
        CHECK(tf::tape().records().empty());
        CHECK(weight_bytes(model) == before);
    }
}

TEST_CASE("train: stop reasons keep the words of the log line", "[train][step]") {
    CHECK(std::string(tf::to_string(tf::StopReason::max_steps)) == "max steps");
    CHECK(std::string(tf::to_string(tf::StopReason::epochs)) == "epochs");
    CHECK(std::string(tf::to_string(tf::StopReason::time_budget)) == "time budget");
    CHECK(std::string(tf::to_string(tf::StopReason::interrupted)) == "interrupted");
}

// ---- gradient accumulation (--accumulate) ---------------------------------------------------------------

namespace {

// Micro-batch A: 5 target tokens; micro-batch B: 4. Unequal counts, so that averaging the two means (instead
// of weighting each by its share of the 9 tokens) would give other gradients.
struct TwoMicroBatches {
    std::vector<std::int32_t> a_src{5, 6, 2, 7, 2, 0}, a_dec{1, 8, 9, 1, 10, 0}, a_tgt{8, 9, 2, 10, 2, 0};      // (2, 3)
    std::vector<std::int32_t> b_src{4, 2, 0, 9, 8, 2}, b_dec{1, 11, 0, 1, 6, 0}, b_tgt{11, 2, 0, 6, 2, 0};      // (2, 3)
    // A ∪ B: the four rows in one batch (the same S and T, so no other padding).
    std::vector<std::int32_t> ab_src, ab_dec, ab_tgt;  // (4, 3)
    TwoMicroBatches() {
        for (auto [to, x, y] : {std::tuple{&ab_src, &a_src, &b_src}, std::tuple{&ab_dec, &a_dec, &b_dec},
                                std::tuple{&ab_tgt, &a_tgt, &b_tgt}}) {
            *to = *x;
            to->insert(to->end(), y->begin(), y->end());
        }
    }
    std::vector<tf::StepBatch> micro() const {
        return {tf::StepBatch{a_src, a_dec, a_tgt, 2, 3, 3}, tf::StepBatch{b_src, b_dec, b_tgt, 2, 3, 3}};
    }
    tf::StepBatch together() const { return tf::StepBatch{ab_src, ab_dec, ab_tgt, 4, 3, 3}; }
};

std::vector<double> gradients(tf::Optimizer& optimizer) {
    std::vector<double> g;
    for (const tf::NamedTensor& named : optimizer.params()) {
        const tf::Tensor& p = named.tensor;
        for (std::int64_t i = 0; i < p.numel(); ++i) g.push_back(p.has_grad() ? double(p.grad()[i]) : 0.0);
    }
    return g;
}

std::vector<double> weights(tf::Transformer& model) {
    std::vector<double> w;
    for (const tf::NamedTensor& p : model.parameters())
        for (std::int64_t i = 0; i < p.tensor.numel(); ++i) w.push_back(double(p.tensor.data()[i]));
    return w;
}

tf::ModelConfig no_dropout_model() {
    tf::ModelConfig m = tiny_model();
    m.dropout = m.attention_dropout = m.activation_dropout = 0;
    return m;
}

}  // namespace

// The gradient check of accumulation: backward of micro-batch k seeded with tokens_k / tokens, summed over k,
// must be ∂/∂θ of the global batch's mean loss, which is what one backward over A ∪ B computes. The two differ
// only in the order of float32 additions (each matmul's reduction over rows is split in two and the 1/tokens
// factor is applied as (tokens_k / tokens) · (1 / tokens_k)): a few ulps per reduction of at most ~64 terms
// here, so 1e-5 of the largest gradient (about 80 ulps of it) bounds rounding, while a wrong weighting (the
// plain mean of the two means: factors 1/2 instead of 5/9 and 4/9) moves gradients by ~10% of their size.
TEST_CASE("train step: --accumulate 2 over A and B gives the gradients and the update of one batch A ∪ B",
          "[step][accumulate]") {
    const TwoMicroBatches data;
    tf::Transformer accumulated(no_dropout_model(), 7), together(no_dropout_model(), 7);  // dropout off
    tf::Sgd sgd_a(accumulated.parameters(), tf::SgdOptions{}), sgd_t(together.parameters(), tf::SgdOptions{});
    tf::Rng rng_a(11), rng_t(11);
    tf::StepSettings s;
    s.lr = 0.5;
    s.step = 1;
    s.clip = 0.05;  // small: clipping (once, on the global gradient) acts
    std::vector<double> g_a, g_t;
    tf::StepHooks hooks_a, hooks_t;
    hooks_a.before_update = [&](const tf::StepResult&) { g_a = gradients(sgd_a); };
    hooks_t.before_update = [&](const tf::StepResult&) { g_t = gradients(sgd_t); };
    const tf::StepResult ra = tf::train_step(tf::StepParts{accumulated, sgd_a, nullptr, &rng_a}, data.micro(), s, hooks_a);
    const tf::StepResult rt = tf::train_step(tf::StepParts{together, sgd_t, nullptr, &rng_t}, data.together(), s, hooks_t);

    CHECK(ra.loss.tokens == 9);
    CHECK(rt.loss.tokens == 9);
    CHECK(ra.loss.loss == Approx(rt.loss.loss).epsilon(1e-6));
    CHECK(ra.loss.nll == Approx(rt.loss.nll).epsilon(1e-6));
    CHECK(ra.grad_norm == Approx(rt.grad_norm).epsilon(1e-5));
    CHECK(rt.grad_norm > s.clip);
    REQUIRE(g_a.size() == g_t.size());
    const double bound = 1e-5 * tf_test::largest_magnitude(g_t);
    REQUIRE(bound > 0);
    double worst = 0;
    for (std::size_t i = 0; i < g_a.size(); ++i) worst = std::max(worst, std::abs(g_a[i] - g_t[i]));
    INFO("largest gradient " << tf_test::largest_magnitude(g_t) << ", largest difference " << worst);
    CHECK(worst <= bound);

    // After the step (SGD: θ −= lr · clip · g, so the weights differ by at most lr · clip · the gradient
    // bound; Adam's first step, ≈ lr · sign(g), would turn rounding in a gradient near 0 into a full step).
    const std::vector<double> w_a = weights(accumulated), w_t = weights(together);
    const double clip_factor = s.clip / rt.grad_norm;
    double worst_w = 0;
    for (std::size_t i = 0; i < w_a.size(); ++i) worst_w = std::max(worst_w, std::abs(w_a[i] - w_t[i]));
    INFO("largest weight difference " << worst_w);
    CHECK(worst_w <= s.lr * clip_factor * bound + 1e-6 * tf_test::largest_magnitude(w_t));  // + float32 rounding of the weights
    CHECK(rng_a.offset == rng_t.offset);  // accumulation leaves the run's dropout stream alone
}

TEST_CASE("train step: the wrong weighting of micro-batches (the mean of their means) is told apart",
          "[step][accumulate]") {
    // The check above is able to fail: scaling A's gradient by 1/2 (the mean of means) instead of 5/9.
    const TwoMicroBatches data;
    tf::Transformer accumulated(no_dropout_model(), 7), together(no_dropout_model(), 7);
    tf::Sgd sgd_a(accumulated.parameters(), tf::SgdOptions{}), sgd_t(together.parameters(), tf::SgdOptions{});
    tf::StepSettings s;
    s.lr = 0;
    s.step = 1;
    s.clip = 0;
    std::vector<double> g_t, g_mean_of_means;
    tf::StepHooks hooks_t;
    hooks_t.before_update = [&](const tf::StepResult&) { g_t = gradients(sgd_t); };
    tf::train_step(tf::StepParts{together, sgd_t, nullptr, nullptr}, data.together(), s, hooks_t);
    // Each micro-batch alone (its own mean), halved and summed.
    const auto micro = data.micro();
    for (const tf::StepBatch& b : micro) {
        tf::StepHooks h;
        h.before_update = [&](const tf::StepResult&) {
            const std::vector<double> g = gradients(sgd_a);
            if (g_mean_of_means.empty()) g_mean_of_means.assign(g.size(), 0.0);
            for (std::size_t i = 0; i < g.size(); ++i) g_mean_of_means[i] += 0.5 * g[i];
        };
        tf::train_step(tf::StepParts{accumulated, sgd_a, nullptr, nullptr}, b, s, h);
    }
    double worst = 0;
    for (std::size_t i = 0; i < g_t.size(); ++i) worst = std::max(worst, std::abs(g_mean_of_means[i] - g_t[i]));
    CHECK(worst > 1e-5 * tf_test::largest_magnitude(g_t) * 100);  // far outside the bound the case above checks
}

TEST_CASE("train step: an accumulating step's dropout is a pure function of (run seed, step, micro-batch)",
          "[step][accumulate]") {
    const tf::Rng run(tf::hash64(5, 0xD409));
    CHECK(tf::micro_batch_dropout(run, 3, 1).seed == tf::micro_batch_dropout(tf::Rng(run.seed, 1234), 3, 1).seed);
    CHECK(tf::micro_batch_dropout(run, 3, 1).offset == 0);
    CHECK(tf::micro_batch_dropout(run, 3, 0).seed != tf::micro_batch_dropout(run, 3, 1).seed);
    CHECK(tf::micro_batch_dropout(run, 3, 0).seed != tf::micro_batch_dropout(run, 4, 0).seed);

    // With dropout on, the same micro-batches give the same step whatever the run stream's position.
    tf::ModelConfig m = tiny_model();
    m.dropout = m.attention_dropout = m.activation_dropout = 0.3;
    const TwoMicroBatches data;
    tf::Transformer x(m, 7), y(m, 7);
    tf::Sgd sx(x.parameters(), tf::SgdOptions{}), sy(y.parameters(), tf::SgdOptions{});
    tf::Rng rx(run.seed, 0), ry(run.seed, 999);
    tf::StepSettings s;
    s.lr = 0.5;
    s.step = 2;
    const tf::StepResult a = tf::train_step(tf::StepParts{x, sx, nullptr, &rx}, data.micro(), s);
    const tf::StepResult b = tf::train_step(tf::StepParts{y, sy, nullptr, &ry}, data.micro(), s);
    CHECK(a.loss.loss == b.loss.loss);
    CHECK(weight_bytes(x) == weight_bytes(y));
    CHECK(rx.offset == 0);
    CHECK(ry.offset == 999);
}
