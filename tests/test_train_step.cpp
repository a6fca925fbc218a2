// The one training step (train_step.h) that train and bench train both run: its hooks see each phase and
// the unclipped gradients without changing a bit; a non-finite loss stops it before any weight changes.
#include <catch2/catch.hpp>

#include <cmath>
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
    model.parameters().front().tensor.data()[0] = std::numeric_limits<tf::real>::quiet_NaN();
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
            FAIL("a NaN weight gave a finite loss");
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
