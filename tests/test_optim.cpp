// Optimizers and gradient checks: three-step trajectories against the update formulas evaluated in double
// (each reproduced by torch.optim 1.13 in float64 to the last digit: tests/golden/make_optim_trajectories.py
// --check), convergence on a quadratic through the tape, tied parameters, clipping, non-finite detection
// and state round trips.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"
#include "tapeformer/optim.h"

using Catch::Matchers::Contains;
using tf::real;

namespace {

tf::Tensor param(const std::vector<real>& values) {
    tf::Tensor t = tf::Tensor::from(values, tf::Shape{static_cast<std::int64_t>(values.size())});
    t.set_requires_grad();
    return t;
}

void set_grad(tf::Tensor t, const std::vector<real>& g) {
    REQUIRE(static_cast<std::int64_t>(g.size()) == t.numel());
    std::copy(g.begin(), g.end(), t.grad());
}

void check_close(const std::vector<real>& got, const std::vector<double>& want, double margin) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("element " << i);
        CHECK(got[i] == Approx(want[i]).margin(margin));
    }
}

// The parameter p0 and the three gradients every trajectory below uses. The gradients are fixed (not
// functions of p), so the numbers depend on the update rule alone.
const std::vector<real> kP0 = {0.5f, -1.0f, 2.0f};
const std::vector<std::vector<real>> kGrads = {{0.1f, -0.2f, 0.3f}, {-0.05f, 0.4f, 0.0f}, {0.2f, 0.1f, -0.3f}};

// Runs three steps of `opt` on p with kGrads (scaled by grad_scale); returns p after each step.
std::vector<std::vector<real>> trajectory(tf::Optimizer& opt, tf::Tensor p, double lr, real grad_scale = 1) {
    std::vector<std::vector<real>> out;
    for (const auto& g : kGrads) {
        std::vector<real> scaled = g;
        for (real& x : scaled) x *= grad_scale;
        set_grad(p, scaled);
        opt.step(lr);
        out.push_back(p.to_vector());
    }
    return out;
}

// float32 arithmetic on values of magnitude ≤ 2 over three steps: a few ulps (2.4e-7 each).
constexpr double kMargin = 1e-6;

}  // namespace

// ---- Adam / AdamW trajectories -----------------------------------------------------------------------------------
// Expected values: the torch 1.13 update in double, per element, t = 1, 2, 3:
//   Adam:  g' = g + wd·p;                AdamW: p ← p·(1 − lr·wd), g' = g
//   m = β1·m + (1−β1)·g'   v = β2·v + (1−β2)·g'²   p ← p − lr/(1−β1^t) · m / (√v/√(1−β2^t) + ε)
// torch.optim.Adam / AdamW 1.13 with the same settings in float64 gave the identical digits
// (tests/golden/make_optim_trajectories.py prints them and --check compares them with this file).

TEST_CASE("Adam (L2 weight decay) follows torch.optim.Adam for three steps", "[optim]") {
    tf::Tensor p = param(kP0);
    tf::Adam adam({{"w", p}}, {0.9, 0.98, 1e-9, /*weight_decay=*/0.1});
    auto traj = trajectory(adam, p, 0.01);
    // Step 1 moves each element by lr against the sign of g': 0.5 → 0.49, −1 → −0.99, 2 → 1.99.
    check_close(traj[0], {0.49000000006666666, -0.99000000003333333, 1.99000000002}, kMargin);
    check_close(traj[1], {0.48331702803154969, -0.99054294487928329, 1.9809904006636709}, kMargin);
    check_close(traj[2], {0.47522768701557483, -0.99097897446868655, 1.9753176792682494}, kMargin);
    CHECK(adam.step_count(0) == 3);

    // The moments after step 3 (torch: state['exp_avg'], state['exp_avg_sq']).
    auto state = adam.state();
    REQUIRE(state.size() == 3);
    CHECK(state[0].name == "adam.step.w");
    CHECK(state[0].tensor.item() == 3);
    CHECK(state[1].name == "adam.m.w");
    check_close(state[1].tensor.to_vector(), {0.036893170280915495, 0.0028845705509071657, 0.04821990400681671}, 1e-7);
    CHECK(state[2].name == "adam.v.w");
    check_close(state[2].tensor.to_vector(), {0.00166557229234203, 0.003504517487138985, 0.005785855712723523}, 1e-8);
}

TEST_CASE("AdamW (decoupled weight decay) follows torch.optim.AdamW for three steps", "[optim]") {
    tf::Tensor p = param(kP0);
    tf::AdamW adamw({{"w", p}}, {0.9, 0.98, 1e-9, /*weight_decay=*/0.1});
    auto traj = trajectory(adamw, p, 0.01);
    // Step 1: p·(1 − 0.01·0.1) − 0.01·sign(g): 0.5·0.999 − 0.01 = 0.4895, −0.999 + 0.01 = −0.989, 1.998 − 0.01 = 1.988.
    check_close(traj[0], {0.4895000001, -0.98900000004999999, 1.9880000000333333}, kMargin);
    check_close(traj[1], {0.48633942299825378, -0.99166153916816624, 1.9792790023704947}, kMargin);
    check_close(traj[2], {0.47930794475844146, -0.99483228488037645, 1.9781583713794786}, kMargin);
}

TEST_CASE("Adam with PyTorch's default betas and eps (0.999, 1e-8)", "[optim]") {
    tf::Tensor p = param(kP0);
    tf::Adam adam({{"w", p}}, {0.9, 0.999, 1e-8, 0});
    auto traj = trajectory(adam, p, 0.01);
    check_close(traj[0], {0.49000000099999991, -0.99000000050000003, 1.9900000003333334}, kMargin);
    check_close(traj[1], {0.48733663094033908, -0.99366103565460373, 1.9832994181079155}, kMargin);
    check_close(traj[2], {0.48075551543513811, -0.99781754749638352, 1.984158095217337}, kMargin);
}

TEST_CASE("Adam adds eps after the bias-corrected sqrt(v), as PyTorch does", "[optim]") {
    // Gradients of 1e-3 with eps = 1e-3 make eps's placement visible. PyTorch: denom = √v/√(1−β2^t) + ε.
    // The paper's "efficient version" (step lr·√(1−β2^t)/(1−β1^t), denom √v + ε) would end at
    // (0.4968022, −1.0008331, 1.9953497) instead: ~7e-3 away.
    tf::Tensor p = param(kP0);
    tf::Adam adam({{"w", p}}, {0.9, 0.98, 1e-3, 0});
    auto traj = trajectory(adam, p, 0.01, 0.01f);
    // Step 1: lr · |g| / (|g| + ε) = 0.01 · 1e-3/2e-3 = 0.005 for the first element.
    check_close(traj[0], {0.495, -0.99333333333333329, 1.9924999999999999}, kMargin);
    check_close(traj[1], {0.49382267176543659, -0.99610883075109569, 1.987931550064028}, kMargin);
    check_close(traj[2], {0.49008596958938622, -0.99912828944320564, 1.9885412837919869}, kMargin);
}

TEST_CASE("Adam on a large parameter (the threaded path) matches a naive double loop", "[optim]") {
    const std::int64_t n = 100003;  // above the parallel threshold, and not a multiple of any vector width
    std::vector<real> p0(n), g0(n);
    for (std::int64_t i = 0; i < n; ++i) {
        p0[i] = static_cast<real>(std::sin(0.001 * i));
        g0[i] = static_cast<real>(0.1 * std::cos(0.37 * i));
    }
    tf::Tensor p = param(p0);
    tf::AdamW opt({{"big", p}}, {0.9, 0.98, 1e-9, 0.01});
    // Reference: two AdamW steps in double with the same gradient.
    std::vector<double> ref(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
    const double lr = 0.003;
    for (int t = 1; t <= 2; ++t) {
        set_grad(p, g0);
        opt.step(lr);
        for (std::int64_t i = 0; i < n; ++i) {
            ref[i] *= 1 - lr * 0.01;
            m[i] = 0.9 * m[i] + 0.1 * g0[i];
            v[i] = 0.98 * v[i] + 0.02 * static_cast<double>(g0[i]) * g0[i];
            ref[i] -= lr / (1 - std::pow(0.9, t)) * m[i] / (std::sqrt(v[i]) / std::sqrt(1 - std::pow(0.98, t)) + 1e-9);
        }
    }
    const std::vector<real> got = p.to_vector();
    double worst = 0;
    for (std::int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
    CHECK(worst < 1e-6);
}

// ---- SGD trajectories ---------------------------------------------------------------------------------------------
// Expected values: the torch 1.13 update in double: d = g + wd·p; buf = d (step 1) or μ·buf + (1−damp)·d;
// d = buf (or d + μ·buf with Nesterov); p ← p − lr·d. torch.optim.SGD in float64 gave the same digits
// (tests/golden/make_optim_trajectories.py --check).

TEST_CASE("SGD with momentum and weight decay follows torch.optim.SGD for three steps", "[optim]") {
    tf::Tensor p = param(kP0);
    tf::Sgd sgd({{"w", p}}, {/*momentum=*/0.9, 0, false, /*weight_decay=*/0.01});
    auto traj = trajectory(sgd, p, 0.1);
    // Step 1: buf = g + 0.01·p; p − 0.1·buf: 0.5 − 0.1·(0.1 + 0.005) = 0.4895.
    check_close(traj[0], {0.48949999999999999, -0.97899999999999998, 1.968}, kMargin);
    check_close(traj[1], {0.48456050000000001, -0.99912099999999993, 1.9372320000000001}, kMargin);
    check_close(traj[2], {0.45963038950000001, -1.026230779, 1.9376035680000001}, kMargin);
    auto state = sgd.state();
    REQUIRE(state.size() == 1);
    CHECK(state[0].name == "sgd.momentum_buffer.w");
}

TEST_CASE("SGD without momentum, with Nesterov, and with dampening", "[optim]") {
    SECTION("plain: p ← p − lr·g, no state") {
        tf::Tensor p = param(kP0);
        tf::Sgd sgd({{"w", p}});
        auto traj = trajectory(sgd, p, 0.1);
        check_close(traj[0], {0.49, -0.98, 1.97}, kMargin);
        check_close(traj[1], {0.495, -1.02, 1.97}, kMargin);
        check_close(traj[2], {0.475, -1.03, 2.0}, kMargin);
        CHECK(sgd.state().empty());
    }
    SECTION("Nesterov, μ = 0.9") {
        tf::Tensor p = param(kP0);
        tf::Sgd sgd({{"w", p}}, {0.9, 0, /*nesterov=*/true, 0});
        auto traj = trajectory(sgd, p, 0.1);
        // Step 1: buf = g; d = g + 0.9·g = 1.9·g; 0.5 − 0.1·0.19 = 0.481.
        check_close(traj[0], {0.481, -0.962, 1.943}, kMargin);
        check_close(traj[1], {0.4824, -1.0218, 1.9187}, kMargin);
        check_close(traj[2], {0.44116, -1.05862, 1.95383}, kMargin);
    }
    SECTION("μ = 0.5, dampening 0.3 (not applied on the first step)") {
        tf::Tensor p = param(kP0);
        tf::Sgd sgd({{"w", p}}, {0.5, 0.3, false, 0});
        auto traj = trajectory(sgd, p, 0.1);
        check_close(traj[0], {0.49, -0.98, 1.97}, kMargin);
        check_close(traj[1], {0.4885, -0.998, 1.955}, kMargin);  // buf = 0.5·0.1 + 0.7·(−0.05) = 0.015
        check_close(traj[2], {0.47375, -1.014, 1.9685}, kMargin);
    }
}

// ---- behaviour --------------------------------------------------------------------------------------------------

TEST_CASE("Adam minimises a quadratic through the tape", "[optim]") {
    // L = Σ (p − target)², dL/dp = 2(p − target).
    tf::Tensor p = param({3.0f, -2.0f, 1.0f, 0.5f});
    const tf::Tensor target = tf::Tensor::from({1.0f, 2.0f, -1.0f, 0.0f}, tf::Shape{4});
    tf::Adam adam({{"p", p}});
    double first_loss = 0, loss_value = 0;
    const int steps = 1500;
    for (int s = 1; s <= steps; ++s) {
        adam.zero_grad();
        tf::Tensor d = tf::sub(p, target);               // (4)
        tf::Tensor loss = tf::sum_all(tf::mul(d, d));    // ()
        loss_value = loss.item();
        if (s == 1) first_loss = loss_value;
        tf::backward(loss);
        adam.step(0.05 * (1.0 - static_cast<double>(s - 1) / steps));  // decay to 0 to settle at the minimum
    }
    CHECK(first_loss == Approx(4 + 16 + 4 + 0.25));
    CHECK(loss_value < 1e-4);
    check_close(p.to_vector(), {1.0, 2.0, -1.0, 0.0}, 1e-2);
}

TEST_CASE("a parameter listed under two names (tied weights) is updated once", "[optim]") {
    tf::Tensor shared = param(kP0);
    tf::Tensor alone = param(kP0);
    // The model lists the tied table twice; a reshape view of it is the same storage too.
    tf::ParamList tied = {{"embed.weight", shared}, {"out.weight", shared}, {"view", shared.reshape(tf::Shape{3, 1})}};
    tf::Adam a(tied);
    tf::Adam b({{"w", alone}});
    REQUIRE(a.params().size() == 1);
    CHECK(a.params()[0].name == "embed.weight");
    for (int s = 0; s < 3; ++s) {
        set_grad(shared, kGrads[s]);
        set_grad(alone, kGrads[s]);
        a.step(0.01);
        b.step(0.01);
    }
    CHECK(shared.to_vector() == alone.to_vector());  // bit for bit: one update per step, not three
    CHECK(a.step_count(0) == 3);
    auto state = a.state();
    REQUIRE(state.size() == 3);
    CHECK(state[1].name == "adam.m.embed.weight");

    // Same for SGD; and different tensors under one name are refused.
    tf::Sgd sgd(tied);
    CHECK(sgd.params().size() == 1);
    CHECK_THROWS_WITH(tf::Adam({{"w", param({1.0f})}, {"w", param({2.0f})}}), Contains("both named 'w'"));
}

TEST_CASE("parameters without a gradient are skipped and count their own steps, as in torch", "[optim]") {
    tf::Tensor a = param({1.0f, 1.0f});
    tf::Tensor b = param({1.0f, 1.0f});  // no gradient buffer until later
    tf::Tensor frozen = param({1.0f});
    frozen.set_requires_grad(false);
    set_grad(frozen, {1.0f});            // a stale buffer on a frozen parameter is ignored
    tf::Adam adam({{"a", a}, {"b", b}, {"frozen", frozen}});
    set_grad(a, {1.0f, -1.0f});
    adam.step(0.1);
    CHECK(b.to_vector() == std::vector<real>{1.0f, 1.0f});
    CHECK(frozen.to_vector() == std::vector<real>{1.0f});
    CHECK(adam.step_count(0) == 1);
    CHECK(adam.step_count(1) == 0);
    CHECK(adam.state().size() == 3);  // only a's entries

    set_grad(b, {2.0f, -2.0f});
    adam.step(0.1);
    CHECK(adam.step_count(0) == 2);
    CHECK(adam.step_count(1) == 1);
    // b's first step is bias-corrected as step 1: it moves by lr·g/(|g| + ε) ≈ lr.
    check_close(b.to_vector(), {0.9, 1.1}, kMargin);
}

TEST_CASE("zero_grad clears gradients and keeps the buffers", "[optim]") {
    tf::Tensor p = param(kP0);
    tf::Sgd sgd({{"w", p}});
    set_grad(p, {1.0f, 2.0f, 3.0f});
    sgd.zero_grad();
    CHECK(p.has_grad());
    CHECK(p.grad_vector() == std::vector<real>{0.0f, 0.0f, 0.0f});
}

TEST_CASE("zero_grad(set_to_none) gives the buffers back, the next backward writes them as before, and step "
          "skips a parameter no backward reached",
          "[optim]") {
    tf::Tensor p = param(kP0), q = param(kP0), kept = param(kP0);
    tf::Adam adam({{"p", p}, {"q", q}});
    tf::Adam reference({{"kept", kept}});
    set_grad(p, kGrads[0]);
    set_grad(q, kGrads[0]);
    set_grad(kept, kGrads[0]);
    adam.step(0.01);
    reference.step(0.01);
    adam.zero_grad(/*set_to_none=*/true);
    reference.zero_grad();
    CHECK(!p.has_grad());
    CHECK(p.grad_vector() == std::vector<real>{0.0f, 0.0f, 0.0f});
    // A backward through p only: p's gradient is written afresh, q has none and keeps its values.
    tf::Tensor loss = tf::sum_all(tf::mul(p, tf::Tensor::from({0.5f, -1.0f, 2.0f}, tf::Shape{3})));
    tf::backward(loss);
    tf::Tensor loss2 = tf::sum_all(tf::mul(kept, tf::Tensor::from({0.5f, -1.0f, 2.0f}, tf::Shape{3})));
    tf::backward(loss2);
    CHECK(p.grad_vector() == kept.grad_vector());
    const std::vector<real> q_before = q.to_vector();
    adam.step(0.01);
    reference.step(0.01);
    CHECK(p.to_vector() == kept.to_vector());  // the same update as with a zeroed buffer
    CHECK(q.to_vector() == q_before);          // no gradient: skipped, as torch skips .grad = None
    CHECK(adam.step_count(1) == 1);
}

TEST_CASE("optimizer settings and learning rates are validated", "[optim]") {
    tf::Tensor p = param(kP0);
    CHECK_THROWS_WITH(tf::Adam({{"w", p}}, {1.0, 0.98, 1e-9, 0}), Contains("Adam") && Contains("beta1"));
    CHECK_THROWS_WITH(tf::AdamW({{"w", p}}, {0.9, -0.1, 1e-9, 0}), Contains("AdamW") && Contains("beta2"));
    CHECK_THROWS_WITH(tf::Adam({{"w", p}}, {0.9, 0.98, -1.0, 0}), Contains("eps"));
    CHECK_THROWS_WITH(tf::Sgd({{"w", p}}, {0.0, 0, true, 0}), Contains("Nesterov"));
    CHECK_THROWS_WITH(tf::Sgd({{"w", p}}, {0.9, 0, false, -1}), Contains("weight_decay"));
    CHECK_THROWS_WITH(tf::Adam({{"missing", tf::Tensor()}}), Contains("'missing'") && Contains("undefined"));
    tf::Adam adam({{"w", p}});
    CHECK_THROWS_WITH(adam.step(-1e-3), Contains("learning rate"));
    CHECK_THROWS_WITH(adam.step(std::numeric_limits<double>::quiet_NaN()), Contains("learning rate"));
    // Plain tensors are named by position, as torch keys its state.
    tf::ParamList named = tf::named_by_index({p, param({1.0f})});
    CHECK(named[0].name == "0");
    CHECK(named[1].name == "1");
}

// ---- state round trip -----------------------------------------------------------------------------------------------

namespace {

// Trains two steps, snapshots parameters and optimizer state, restores both into fresh objects, and checks
// that steps 3 and 4 agree bit for bit with the uninterrupted run.
template <class Opt, class Options>
void check_round_trip(Options options, double lr) {
    tf::Tensor p = param(kP0), q = param({0.25f, -0.75f});
    Opt opt({{"p", p}, {"q", q}}, options);
    auto feed = [](tf::Tensor& t, tf::Tensor& u, int s) {
        set_grad(t, kGrads[s % 3]);
        set_grad(u, {static_cast<real>(0.1 * (s + 1)), static_cast<real>(-0.3 + 0.2 * s)});
    };
    for (int s = 0; s < 2; ++s) {
        feed(p, q, s);
        opt.step(lr);
    }
    std::vector<tf::NamedTensor> saved = opt.state();
    saved.push_back({"model.p", p.clone()});  // other entries of a checkpoint are ignored by load_state
    tf::Tensor p2 = param(p.to_vector()), q2 = param(q.to_vector());
    Opt resumed({{"p", p2}, {"q", q2}}, options);
    resumed.load_state(saved);
    for (int s = 2; s < 4; ++s) {
        feed(p, q, s);
        feed(p2, q2, s);
        opt.step(lr);
        resumed.step(lr);
    }
    CHECK(p2.to_vector() == p.to_vector());
    CHECK(q2.to_vector() == q.to_vector());
    CHECK(p.to_vector() != kP0);
}

}  // namespace

TEST_CASE("optimizer state saved and loaded continues identically", "[optim]") {
    SECTION("Adam") { check_round_trip<tf::Adam>(tf::AdamOptions{0.9, 0.98, 1e-9, 0.1}, 0.01); }
    SECTION("AdamW") { check_round_trip<tf::AdamW>(tf::AdamOptions{0.9, 0.98, 1e-9, 0.1}, 0.01); }
    SECTION("SGD with momentum") { check_round_trip<tf::Sgd>(tf::SgdOptions{0.9, 0.1, false, 0.01}, 0.1); }

    SECTION("the snapshot is a copy, not a view of the live state") {
        tf::Tensor p = param(kP0);
        tf::Adam adam({{"w", p}});
        set_grad(p, kGrads[0]);
        adam.step(0.01);
        auto snap = adam.state();
        const std::vector<real> m1 = snap[1].tensor.to_vector();
        adam.step(0.01);
        CHECK(snap[1].tensor.to_vector() == m1);
        CHECK(snap[0].tensor.item() == 1);
    }
}

TEST_CASE("load_state rejects entries that do not fit", "[optim]") {
    tf::Tensor p = param(kP0);
    tf::Adam adam({{"w", p}});
    set_grad(p, kGrads[0]);
    adam.step(0.01);
    const auto good = adam.state();

    auto with = [&](std::size_t i, tf::NamedTensor e) {
        auto s = good;
        s[i] = std::move(e);
        return s;
    };
    tf::Adam fresh({{"w", param(kP0)}});
    CHECK_THROWS_WITH(fresh.load_state(with(1, {"adam.m.other", tf::Tensor::zeros(tf::Shape{3})})),
                      Contains("'adam.m.other' names no parameter"));
    CHECK_THROWS_WITH(fresh.load_state(with(1, {"adam.m.w", tf::Tensor::zeros(tf::Shape{4})})),
                      Contains("shape (4)") && Contains("(3)"));
    CHECK_THROWS_WITH(fresh.load_state(with(0, {"adam.step.w", tf::Tensor::scalar(1.5f)})), Contains("whole step count"));
    CHECK_THROWS_WITH(fresh.load_state(with(2, {"adam.bogus.w", tf::Tensor::zeros(tf::Shape{3})})),
                      Contains("unknown state entry 'adam.bogus.w'"));
    CHECK_THROWS_WITH(fresh.load_state({good[0], good[1]}), Contains("incomplete"));
    // Nothing for this optimizer: it starts fresh.
    fresh.load_state({{"sgd.momentum_buffer.w", tf::Tensor::zeros(tf::Shape{3})}});
    CHECK(fresh.state().empty());
    // SGD refuses a buffer for an unknown parameter too.
    tf::Sgd sgd({{"w", param(kP0)}}, {0.9, 0, false, 0});
    CHECK_THROWS_WITH(sgd.load_state({{"sgd.momentum_buffer.x", tf::Tensor::zeros(tf::Shape{3})}}),
                      Contains("names no parameter"));
}

// ---- gradient norm, clipping, non-finite gradients -------------------------------------------------------------------

TEST_CASE("clip_grad_norm scales to max_norm and returns the norm before clipping", "[optim]") {
    tf::Tensor a = param({3.0f, 4.0f}), b = param({12.0f}), no_grad = param({100.0f});
    set_grad(a, {3.0f, 4.0f});
    set_grad(b, {12.0f});
    tf::ParamList params = {{"a", a}, {"b", b}, {"no_grad", no_grad}};
    REQUIRE_FALSE(no_grad.has_grad());

    CHECK(tf::grad_norm(params) == Approx(13.0).epsilon(1e-12));  // √(9 + 16 + 144)
    // A larger max_norm leaves the gradients alone.
    CHECK(tf::clip_grad_norm(params, 100.0) == Approx(13.0).epsilon(1e-12));
    CHECK(a.grad_vector() == std::vector<real>{3.0f, 4.0f});

    // coef = 1 / (13 + 1e-6); torch.nn.utils.clip_grad_norm_ 1.13 (float64) gives
    // a.grad = (0.23076921301775288, 0.3076922840236705), b.grad = (0.9230768520710115).
    CHECK(tf::clip_grad_norm(params, 1.0) == Approx(13.0).epsilon(1e-12));
    check_close(a.grad_vector(), {0.23076921301775288, 0.3076922840236705}, 1e-7);
    check_close(b.grad_vector(), {0.9230768520710115}, 1e-7);
    CHECK(tf::grad_norm(params) == Approx(1.0).epsilon(1e-6));
    CHECK_FALSE(no_grad.has_grad());

    CHECK_THROWS_WITH(tf::clip_grad_norm(params, 0.0), Contains("max_norm"));
    CHECK(tf::clip_grad_norm(params, std::numeric_limits<double>::infinity()) == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("step(lr, clip_coefficient) gives the same bits as clip_grad_norm then step(lr), for every optimizer",
          "[optim]") {
    // Parameters of several sizes (more than one piece of 8192 values), gradients large enough to clip.
    tf::Rng rng(7);
    std::vector<std::vector<real>> values, grads;
    for (const std::int64_t n : {3, 8192, 20000}) {
        std::vector<real> v(n), g(n);
        for (auto& x : v) x = static_cast<real>(rng.normal());
        for (auto& x : g) x = static_cast<real>(3 * rng.normal());
        values.push_back(v);
        grads.push_back(g);
    }
    const auto make = [&](std::vector<tf::Tensor>& ts) {
        tf::ParamList params;
        for (std::size_t i = 0; i < values.size(); ++i) {
            ts.push_back(param(values[i]));
            params.push_back({"p" + std::to_string(i), ts.back()});
        }
        return params;
    };
    const auto set_grads = [&](std::vector<tf::Tensor>& ts) {
        for (std::size_t i = 0; i < ts.size(); ++i) set_grad(ts[i], grads[i]);
    };
    for (const std::string kind : {"adam", "adamw", "sgd"}) {
        INFO(kind);
        std::vector<tf::Tensor> a, b;
        const tf::ParamList pa = make(a), pb = make(b);
        const auto optimizer = [&](const tf::ParamList& p) -> std::unique_ptr<tf::Optimizer> {
            if (kind == "adam") return std::make_unique<tf::Adam>(p, tf::AdamOptions{0.9, 0.98, 1e-9, 0.01});
            if (kind == "adamw") return std::make_unique<tf::AdamW>(p, tf::AdamOptions{0.9, 0.98, 1e-9, 0.01});
            return std::make_unique<tf::Sgd>(p, tf::SgdOptions{0.9, 0, true, 0.01});
        };
        auto oa = optimizer(pa), ob = optimizer(pb);
        for (int step = 0; step < 3; ++step) {
            set_grads(a);
            set_grads(b);
            tf::clip_grad_norm(pa, 1.0);
            oa->step(1e-3);
            ob->step(1e-3, tf::clip_coefficient(tf::grad_norm(pb), 1.0));
        }
        for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].to_vector() == b[i].to_vector());
    }
}

TEST_CASE("gradient norms count a tied parameter once and do not depend on threading", "[optim]") {
    tf::Tensor w = param({3.0f, 4.0f});
    set_grad(w, {3.0f, 4.0f});
    tf::ParamList tied = {{"embed.weight", w}, {"out.weight", w}};
    CHECK(tf::grad_norm(tied) == Approx(5.0).epsilon(1e-12));  // not 5·√2
    CHECK(tf::clip_grad_norm(tied, 1.0) == Approx(5.0).epsilon(1e-12));
    check_close(w.grad_vector(), {0.6, 0.8}, 1e-6);  // scaled once, not twice

    // A large gradient goes through the blocked, threaded sum: n · 0.5² = 25000.75 exactly in double.
    tf::Tensor big = param(std::vector<real>(100003, 0.0f));
    set_grad(big, std::vector<real>(100003, 0.5f));
    CHECK(tf::grad_norm({{"big", big}}) == Approx(std::sqrt(100003 * 0.25)).epsilon(1e-14));
}

TEST_CASE("first_nonfinite_grad names the first parameter with a NaN or infinite gradient", "[optim]") {
    tf::Tensor a = param({1.0f, 2.0f}), b = param({1.0f}), c = param(std::vector<real>(50000, 1.0f));
    set_grad(a, {0.5f, -0.5f});
    set_grad(b, {1.0f});
    set_grad(c, std::vector<real>(50000, 0.25f));
    tf::ParamList params = {{"encoder.a", a}, {"decoder.b", b}, {"big", c}};
    CHECK_FALSE(tf::first_nonfinite_grad(params).has_value());

    c.grad()[49999] = std::numeric_limits<real>::infinity();  // the last element of the threaded path
    CHECK(tf::first_nonfinite_grad(params) == std::string("big"));
    b.grad()[0] = std::numeric_limits<real>::quiet_NaN();
    CHECK(tf::first_nonfinite_grad(params) == std::string("decoder.b"));  // list order decides

    // The norm is non-finite then, and clipping leaves the gradients as they are.
    CHECK(std::isnan(tf::clip_grad_norm(params, 1.0)));
    CHECK(a.grad_vector() == std::vector<real>{0.5f, -0.5f});
}

// ---- the weight average (--ema) ------------------------------------------------------------------------------------

TEST_CASE("WeightAverage follows a ← a + (1 − d_t)(p − a), d_t = min(decay, (1 + t)/(10 + t)), per value", "[optim]") {
    // A parameter large enough to be cut into several pieces (the threaded path) and a small one.
    std::vector<real> big0(20000);
    for (std::size_t i = 0; i < big0.size(); ++i) big0[i] = real(std::sin(0.1 * double(i)));
    tf::Tensor big = param(big0), small = param(kP0);
    tf::WeightAverage average({{"big", big}, {"small", small}}, 0.5);
    std::vector<double> want_big(big0.begin(), big0.end()), want_small(kP0.begin(), kP0.end());
    for (int t = 1; t <= 4; ++t) {
        // New weights, as an optimizer step would leave them.
        for (std::int64_t i = 0; i < big.numel(); ++i) big.data()[i] = real(std::cos(0.01 * double(i * t)));
        for (std::int64_t i = 0; i < 3; ++i) small.data()[i] = kP0[i] + real(t) * kGrads[t % 3][i];
        average.update(t);
        // d_1 = 2/11, d_2 = 3/12, then the cap 0.5 from t = 8 on: here t = 3, 4 give 4/13, 5/14.
        const double d = std::min(0.5, (1.0 + t) / (10.0 + t));
        for (std::size_t i = 0; i < want_big.size(); ++i) want_big[i] += (1 - d) * (big.data()[i] - want_big[i]);
        for (std::size_t i = 0; i < 3; ++i) want_small[i] += (1 - d) * (small.data()[i] - want_small[i]);
    }
    const std::vector<real> last_big = big.to_vector(), last_small = small.to_vector();
    average.swap_into_parameters();
    check_close(big.to_vector(), want_big, 1e-6);
    check_close(small.to_vector(), want_small, 1e-6);
    CHECK(big.to_vector() != last_big);  // the average is not the last weights
    average.swap_into_parameters();      // and swapping back restores them exactly
    CHECK(big.to_vector() == last_big);
    CHECK(small.to_vector() == last_small);

    SECTION("the cap: late updates forget 1 − decay of the average") {
        tf::Tensor p = param({0.0f});
        tf::WeightAverage a({{"p", p}}, 0.9);
        p.data()[0] = 1.0f;
        a.update(1000);  // (1 + t)/(10 + t) > 0.9: d = 0.9
        {
            tf::AveragedWeightsScope scope(&a);
            CHECK(p.data()[0] == Approx(0.1).margin(1e-7));
        }
        CHECK(p.data()[0] == 1.0f);  // the scope swapped back
    }
}

TEST_CASE("WeightAverage keeps tied parameters once, round-trips its state and refuses state that does not fit",
          "[optim]") {
    tf::Tensor shared = param(kP0);
    tf::WeightAverage average({{"embed.weight", shared}, {"out.weight", shared}}, 0.9);
    auto state = average.state();
    REQUIRE(state.size() == 1);
    CHECK(state[0].name == "ema.embed.weight");

    shared.data()[0] = 7.0f;
    average.update(1);
    tf::Tensor other = param(kP0);
    tf::WeightAverage restored({{"embed.weight", other}, {"out.weight", other}}, 0.9);
    restored.load_state(average.state());
    CHECK(restored.state()[0].tensor.to_vector() == average.state()[0].tensor.to_vector());

    CHECK_THROWS_WITH(restored.load_state({}), Contains("no state entry 'ema.embed.weight'"));
    CHECK_THROWS_WITH(restored.load_state({{"ema.other", tf::Tensor::zeros(tf::Shape{3})}}), Contains("names no parameter"));
    CHECK_THROWS_WITH(restored.load_state({{"ema.embed.weight", tf::Tensor::zeros(tf::Shape{4})}}), Contains("shape (4)"));
    CHECK_THROWS_WITH(tf::WeightAverage({{"w", param(kP0)}}, 1.0), Contains("decay must be in (0, 1)"));
    CHECK_THROWS_WITH(tf::WeightAverage({{"w", param(kP0)}}, 0.0), Contains("decay must be in (0, 1)"));
    CHECK_THROWS_WITH(average.update(0), Contains(">= 1"));
}
