// Reference mode (reference_ops.h): each fast op equals its textbook form within what float rounding allows,
// the switch really takes the fast paths out (no BLAS product, no fused op on the tape, one thread), and a
// model trained in reference mode follows the fast run's losses and learns the copy task.
//
// The tolerances come from the error bound of a floating-point sum (Higham, "Accuracy and Stability of
// Numerical Algorithms", §3.1): a sum of n terms computed in any order is within γ_n·Σ|terms| of the exact
// sum, γ_n = n·u/(1 − n·u) ≈ n·u, u = 2⁻²⁴ the unit roundoff of float. The fast ops and the reference ops
// sum in different orders (blocked kernels, 16 lanes, double), so their results may differ by the two errors
// together. Where a test can compute Σ|terms| for each value (matmul) it does; elsewhere the terms are
// bounded by the largest value of the result.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "tapeformer/data/tasks.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/nn/transformer.h"
#include "tapeformer/ops.h"
#include "tapeformer/reference_ops.h"
#include "tapeformer/run/checkpoint.h"
#include "tapeformer/run/evaluate.h"
#include "tapeformer/run/train.h"
#include "training.h"
#include "helpers.h"

using tf::real;
using tf::Shape;
using tf::Tensor;
using tf_test::TempDir;

namespace {

const double kU = std::ldexp(1.0, -24);  // u, float's unit roundoff

Tensor random(const Shape& shape, std::uint64_t seed, bool grad = true) { return tf::random_tensor(shape, seed, -1, 1, grad); }

// An op's output followed by its inputs' gradients, for an upstream gradient drawn from `seed`.
using Results = std::vector<std::vector<real>>;

template <class F>
Results run_op(F f, std::vector<Tensor> inputs, std::uint64_t seed = 99) {
    Tensor y = f(inputs);
    std::vector<real> up = tf::random_tensor(y.shape(), seed, -1, 1, false).to_vector();
    Results out{y.to_vector()};
    tf::backward(y, up);
    for (Tensor& t : inputs) {
        out.push_back(t.grad_vector());
        t.zero_grad();
    }
    return out;
}

// f on the same inputs, fast and then in reference mode.
template <class F>
std::pair<Results, Results> fast_and_reference(F f, const std::vector<Tensor>& inputs) {
    Results fast = run_op(f, inputs);
    tf::ReferenceModeScope reference;
    Results ref = run_op(f, inputs);
    return {fast, ref};
}

// |fast − ref| ≤ tol · max|ref| for every value of every result.
void check_close(const Results& fast, const Results& ref, double tol) {
    REQUIRE(fast.size() == ref.size());
    for (std::size_t r = 0; r < ref.size(); ++r) {
        REQUIRE(fast[r].size() == ref[r].size());
        double scale = 0, worst = 0;
        for (real v : ref[r]) scale = std::max(scale, std::fabs(double(v)));
        for (std::size_t i = 0; i < ref[r].size(); ++i) worst = std::max(worst, std::fabs(double(fast[r][i]) - double(ref[r][i])));
        INFO("result " << r << " (0: the output, then the inputs' gradients): max |fast − reference| " << worst << ", bound "
                       << tol * scale << " (max |value| " << scale << ")");
        CHECK(worst <= tol * scale);
    }
}

}  // namespace

TEST_CASE("reference ops: the switch sets one thread and gives the thread count back", "[reference]") {
    const int before = tf::num_threads();
    CHECK_FALSE(tf::reference_mode());
    {
        tf::ReferenceModeScope reference;
        CHECK(tf::reference_mode());
        CHECK(tf::num_threads() == 1);
        tf::set_threads(4);  // asks in vain
        CHECK(tf::num_threads() == 1);
        {
            tf::ReferenceModeScope fast(false);  // a scope can switch it off again
            CHECK_FALSE(tf::reference_mode());
            CHECK(tf::num_threads() == before);
        }
        CHECK(tf::reference_mode());
    }
    CHECK_FALSE(tf::reference_mode());
    CHECK(tf::num_threads() == before);
}

TEST_CASE("reference ops: matmul equals the fast one within the rounding bound of each dot product", "[reference]") {
    // Each value is a dot product Σ_k a_k·b_k (forward: over K; dA over N; dB over M): the two results differ
    // by at most 2·γ_n·Σ|a_k·b_k|, with n the longest of the three sums. The bound Σ|a_k·b_k| of every value,
    // forward and backward, is the same op on |a|, |b| and |upstream|.
    struct Case {
        Shape a, b;
        bool ta, tb;
        real alpha;
    };
    const Case cases[] = {{{7, 5}, {5, 9}, false, false, 1},    {{5, 7}, {5, 9}, true, false, 1},
                          {{7, 5}, {9, 5}, false, true, 0.5},   {{5, 7}, {9, 5}, true, true, 2},
                          {{2, 3, 70, 33}, {2, 3, 33, 40}, false, false, 1},  // batched, long enough for tiles
                          {{2, 3, 33, 70}, {2, 3, 40, 33}, true, true, 0.25},
                          {{4, 30, 64}, {200, 64}, false, true, 1}};          // a 2-D b shared by every row (a linear layer)
    for (const Case& c : cases) {
        INFO("a " << c.a.str() << (c.ta ? "ᵀ" : "") << " @ b " << c.b.str() << (c.tb ? "ᵀ" : "") << ", alpha " << c.alpha);
        auto f = [&](const std::vector<Tensor>& in) { return tf::matmul(in[0], in[1], c.ta, c.tb, c.alpha); };
        const Tensor a = random(c.a, 1), b = random(c.b, 2);
        const auto [fast, ref] = fast_and_reference(f, {a, b});
        // Σ|terms|: the reference op on the absolute values, with the absolute upstream gradient.
        auto abs_of = [](const Tensor& t) {
            std::vector<real> v = t.to_vector();
            for (real& x : v) x = std::fabs(x);
            return Tensor::from(v, t.shape()).set_requires_grad(true);
        };
        Results bound;
        {
            tf::ReferenceModeScope reference;
            Tensor aa = abs_of(a), ab = abs_of(b);
            Tensor y = f({aa, ab});
            std::vector<real> up = tf::random_tensor(y.shape(), 99, -1, 1, false).to_vector();
            for (real& x : up) x = std::fabs(x);
            bound = {y.to_vector()};
            tf::backward(y, up);
            bound.push_back(aa.grad_vector());
            bound.push_back(ab.grad_vector());
        }
        // The longest of the three sums: K (forward), N (dA) or the rows M of op(a) (dB; all rows of a when b is
        // shared by them).
        const std::int64_t K = c.ta ? c.a.dims[c.a.rank - 2] : c.a.dims[c.a.rank - 1];
        const std::int64_t N = c.tb ? c.b.dims[c.b.rank - 2] : c.b.dims[c.b.rank - 1];
        const bool shared_b = c.b.rank == 2 && c.a.rank > 2;
        const std::int64_t M = shared_b ? c.a.numel() / K : (c.ta ? c.a.dims[c.a.rank - 1] : c.a.dims[c.a.rank - 2]);
        const std::int64_t n = std::max({M, N, K});
        for (std::size_t r = 0; r < ref.size(); ++r) {
            REQUIRE(fast[r].size() == ref[r].size());
            std::size_t over = 0;
            double worst = 0;
            for (std::size_t i = 0; i < ref[r].size(); ++i) {
                const double d = std::fabs(double(fast[r][i]) - double(ref[r][i]));
                worst = std::max(worst, d / (2 * n * kU * double(bound[r][i]) + 1e-30));
                over += d > 2 * n * kU * double(bound[r][i]);
            }
            INFO("result " << r << ": the largest difference is " << worst << " of its bound");
            CHECK(over == 0);
        }
    }
}

TEST_CASE("reference ops: softmax, log-sum-exp and the loss equal the fast ones within float rounding", "[reference]") {
    // softmax: each y_j = e^(x_j − m)/Σ_k e^(x_k − m) goes through one exp (exp_fast within 2 ulp, std::exp
    // within 1), a sum of N positive terms (γ_N relative) and a division: (N + 4)·u relative for each side.
    SECTION("softmax with a key mask and a row masked everywhere") {
        const std::int64_t B = 3, H = 2, T = 5, S = 37;
        std::vector<real> m(B * S, 0);
        for (std::int64_t s = 30; s < S; ++s) m[0 * S + s] = -INFINITY;  // padded keys of row 0
        for (std::int64_t s = 0; s < S; ++s) m[2 * S + s] = -INFINITY;   // row 2: every key masked
        const Tensor mask = Tensor::from(m, {B, 1, 1, S});
        auto f = [&](const std::vector<Tensor>& in) { return tf::softmax(in[0], mask); };
        const auto [fast, ref] = fast_and_reference(f, {random({B, H, T, S}, 3)});
        check_close(fast, ref, 2 * (S + 4) * kU);
        for (std::int64_t i = 2 * H * T * S; i < B * H * T * S; ++i) REQUIRE(ref[0][i] == 0);  // the all-masked row
    }
    // The label-smoothed loss: a log-sum-exp over V logits per row (summed in double by the reference, in 16
    // float lanes by the fast op) and a mean over rows; its gradient p_ij − target_ij, p from one exp.
    SECTION("cross_entropy with label smoothing and ignored rows") {
        const std::int64_t N = 12, V = 300;
        std::vector<std::int32_t> target(N);
        for (std::int64_t i = 0; i < N; ++i) target[i] = std::int32_t((i * 37) % V);
        target[3] = target[7] = 0;  // ignored (padding)
        tf::CrossEntropyStats fast_stats, ref_stats;
        auto f = [&](tf::CrossEntropyStats* stats) {
            return [&, stats](const std::vector<Tensor>& in) { return tf::cross_entropy(in[0], target, 0, real(0.1), stats); };
        };
        const Tensor logits = tf::random_tensor({N, V}, 4, -4, 4);
        const Results fast = run_op(f(&fast_stats), {logits});
        tf::ReferenceModeScope reference;
        const Results ref = run_op(f(&ref_stats), {logits});
        check_close(fast, ref, 2 * (V + 4) * kU);
        CHECK(ref_stats.count == fast_stats.count);
        CHECK(std::fabs(ref_stats.nll_sum - fast_stats.nll_sum) <= 2 * (V + 4) * kU * fast_stats.nll_sum);
    }
}

TEST_CASE("reference ops: layer norm, with and without its residual and dropout, equals the fast one", "[reference]") {
    // Mean and variance are sums of C terms, each of the size of the row's values (uniform in [−1, 1), σ ≈ 0.58):
    // μ and σ² each within γ_C of their Σ|terms|, which carry into x̂ = (x − μ)/σ as about C·u·max|x|/σ; the
    // backward's two means as much again. 4·(C + 4)·u of the largest value covers both sides' errors.
    const std::int64_t B = 3, T = 7, C = 48;
    const Tensor x = random({B, T, C}, 5), r = random({B, T, C}, 6);
    const Tensor gamma = tf::random_tensor({C}, 7, 0.5, 1.5), beta = random({C}, 8);
    const double tol = 4 * (C + 4) * kU;
    SECTION("layer_norm") {
        const auto [fast, ref] = fast_and_reference(
            [](const std::vector<Tensor>& in) { return tf::layer_norm(in[0], in[1], in[2]); }, {x, gamma, beta});
        check_close(fast, ref, tol);
    }
    SECTION("add_layer_norm") {
        const auto [fast, ref] = fast_and_reference(
            [](const std::vector<Tensor>& in) { return tf::add_layer_norm(in[0], in[1], in[2], in[3]); }, {x, r, gamma, beta});
        check_close(fast, ref, tol);
    }
    SECTION("add_dropout_layer_norm: the same draws") {
        auto f = [](const std::vector<Tensor>& in) {
            tf::Rng rng(21);
            return tf::add_dropout_layer_norm(in[0], in[1], real(0.3), rng, in[2], in[3]);
        };
        const auto [fast, ref] = fast_and_reference(f, {x, r, gamma, beta});
        check_close(fast, ref, tol);
    }
}

TEST_CASE("reference ops: the copying ops give the fast ones' bits", "[reference]") {
    // No sums: the same products and copies in either form, so the same bits.
    SECTION("relu_dropout") {
        auto f = [](const std::vector<Tensor>& in) {
            tf::Rng rng(22);
            return tf::relu_dropout(in[0], real(0.25), rng);
        };
        const auto [fast, ref] = fast_and_reference(f, {random({4, 9, 33}, 9)});
        CHECK(fast == ref);
    }
    SECTION("slice_heads") {
        auto f = [](const std::vector<Tensor>& in) { return tf::slice_heads(in[0], 12, 24, 3); };
        const auto [fast, ref] = fast_and_reference(f, {random({2, 5, 36}, 10)});
        CHECK(fast == ref);
    }
}

TEST_CASE("reference ops: a linear layer and attention over heads equal the fast fused ops", "[reference]") {
    SECTION("affine: x Wᵀ + b, a sum of C products and the bias") {
        const std::int64_t C = 64;
        auto f = [](const std::vector<Tensor>& in) { return tf::affine(in[0], in[1], in[2]); };
        const auto [fast, ref] = fast_and_reference(f, {random({3, 11, C}, 11), random({40, C}, 12), random({40}, 13)});
        check_close(fast, ref, 2 * (3 * 11 + 4) * kU);  // the longest sum: dW over the 33 rows
    }
    // Per head: scores over D, softmax over Tk, the context over Tk, and backward's sums over D, Tk and Tq;
    // the terms are bounded by the largest value as above, with both sides' errors and the softmax's own.
    SECTION("attention_heads: self-attention with a causal mask and dropout, and cross-attention") {
        const std::int64_t B = 2, Tq = 9, Tk = 13, H = 3, D = 8, C = H * D;
        std::vector<real> causal(Tq * Tq, 0);
        for (std::int64_t i = 0; i < Tq; ++i)
            for (std::int64_t j = i + 1; j < Tq; ++j) causal[i * Tq + j] = -INFINITY;
        const Tensor self_mask = Tensor::from(causal, {1, 1, Tq, Tq});
        const double tol = 4 * (Tk + D + 4) * kU;
        {
            auto f = [&](const std::vector<Tensor>& in) {
                tf::Rng rng(23);
                return tf::attention_heads(in[0], 0, in[0], C, 2 * C, H, D, self_mask, real(0.2), rng);
            };
            const auto [fast, ref] = fast_and_reference(f, {random({B, Tq, 3 * C}, 14)});
            check_close(fast, ref, tol);
        }
        {
            auto f = [&](const std::vector<Tensor>& in) {
                tf::Rng rng(24);
                return tf::attention_heads(in[0], 0, in[1], 0, C, H, D, Tensor(), real(0), rng);
            };
            const auto [fast, ref] = fast_and_reference(f, {random({B, Tq, C}, 15), random({B, Tk, 2 * C}, 16)});
            check_close(fast, ref, tol);
        }
    }
}

TEST_CASE("reference ops: every product that reaches gemm in reference mode is the three loops", "[reference]") {
    // A product called directly (not through an op) is computed by reference::gemm, bit for bit, with a bias.
    const std::int64_t M = 70, N = 50, K = 300;  // large enough to be tiled on the fast path
    const std::vector<float> a = tf_test::uniform(M * K, 1), b = tf_test::uniform(N * K, 2), bias = tf_test::uniform(N, 3);
    std::vector<real> expected(M * N), got(M * N, real(7));
    for (std::int64_t i = 0; i < M; ++i) std::copy(bias.begin(), bias.end(), expected.begin() + i * N);
    tf::reference::gemm(false, true, M, N, K, 1, a.data(), K, b.data(), K, 1, expected.data(), N);
    tf::ReferenceModeScope reference;
    tf::gemm_group({tf::GemmCall{false, true, M, N, K, 1, a.data(), K, b.data(), K, 0, got.data(), N, 1, 0, 0, 0, bias.data()}});
    CHECK(got == expected);
}

namespace {

// One forward and backward of a small model: the loss, every gradient, and the ops on its tape.
struct Step {
    std::vector<std::vector<real>> values;
    std::set<std::string> ops;
    std::int64_t products = 0;  // calls into gemm (blas.h) during the step
};

Step model_step() {
    tf::ModelConfig config = tf_test::tiny_model_config(40, 16, 2, 32, 1, 1, 16);
    config.dropout = config.attention_dropout = config.activation_dropout = real(0.1);
    const std::int64_t B = 3, S = 7, T = 6;
    std::vector<std::int32_t> src(B * S), dec_in(B * T), target(B * T);
    for (std::int64_t i = 0; i < B * S; ++i) src[i] = 4 + std::int32_t((i * 7) % 36);
    for (std::int64_t i = 0; i < B * T; ++i) {
        dec_in[i] = 4 + std::int32_t((i * 5) % 36);
        target[i] = i % T == T - 1 && i / T == 1 ? 0 : 4 + std::int32_t((i * 11) % 36);  // one padded target
    }
    tf::Transformer model(config, 11);
    tf::Rng dropout(5);
    tf::Pass pass;
    pass.dropout_rng = &dropout;
    pass.fuse_attention = true;  // as training runs it
    Step step;
    tf::ProductTimer products;
    Tensor logits = model.forward(src, B, S, dec_in, T, pass);
    Tensor loss = tf::sequence_loss(logits, target, 0, real(0.1));
    for (const tf::TapeRecord& r : tf::tape().records()) step.ops.insert(r.op);
    tf::backward(loss);
    step.products = products.calls;
    step.values.push_back(loss.to_vector());
    for (const auto& p : model.parameters()) step.values.emplace_back(p.tensor.grad(), p.tensor.grad() + p.tensor.numel());
    return step;
}

}  // namespace

TEST_CASE("reference ops: reference mode takes the fast paths out of a model's step and keeps its numbers",
          "[reference]") {
    const Step fast = model_step();
    Step ref;
    {
        tf::ReferenceModeScope reference;
        ref = model_step();
    }
    // The fast step runs its products through gemm and records the fused ops; the reference step neither.
    CHECK(fast.products > 0);
    CHECK(fast.ops.count("affine") == 1);
    CHECK(fast.ops.count("attention_heads") == 1);
    CHECK(fast.ops.count("affine_relu_dropout") == 1);  // the feed-forward networks' first layers
    CHECK(ref.products == 0);
    for (const char* fused : {"affine", "attention_heads", "slice_heads", "add_layer_norm", "add_dropout_layer_norm", "relu_dropout",
                              "affine_relu_dropout"}) {
        INFO(fused);
        CHECK(ref.ops.count(fused) == 0);
    }
    CHECK(ref.ops.count("matmul") == 1);
    CHECK(ref.ops.count("softmax") == 1);
    CHECK(ref.ops.count("layer_norm") == 1);
    // The same loss and gradients up to rounding: sums of at most V = 40 terms per op (B·T = 18, C = 16 and
    // F = 32 are shorter), through a dozen ops in a row (two layers, attention, the loss): both sides' error
    // of 2·(40 + 4)·u per op, a dozen times over. (Measured on AMD EPYC Zen 5: at most 0.011 of this bound.)
    check_close(fast.values, ref.values, 12 * 2 * (40 + 4) * kU);
}

namespace {

tf::TrainConfig copy_config(const TempDir& tmp, const std::string& out, std::int64_t steps) {
    tf::TrainConfig c = tf_test::copy_task_config(tmp / "copy", tmp / out, steps);
    c.log_every = 1;
    c.checkpoint_every = 100000;
    c.threads = 0;
    return c;
}

void write_copy_task(const TempDir& tmp) {
    auto task = tf::SequenceTaskOptions::defaults_for(tf::SequenceTask::copy);
    task.valid = task.test = 100;
    tf::write_sequence_task(tmp / "copy", task);
}

std::string train_logged(const tf::TrainConfig& c) {
    const int threads = tf::num_threads();
    std::ostringstream log;
    tf::train(c, log, false);
    tf::set_threads(threads);
    return log.str();
}

}  // namespace

TEST_CASE("reference ops: ten training steps in reference mode give the fast run's losses", "[reference][train]") {
    TempDir tmp;
    write_copy_task(tmp);
    train_logged(copy_config(tmp, "fast", 10));
    std::string log;
    {
        tf::ReferenceModeScope reference;
        log = train_logged(copy_config(tmp, "reference", 10));
    }
    CHECK(log.find("1 thread; reference ops") != std::string::npos);
    const std::vector<double> fast = tf_test::train_losses(tmp / "fast"), ref = tf_test::train_losses(tmp / "reference");
    REQUIRE(fast.size() == 10);
    REQUIRE(ref.size() == fast.size());
    for (std::size_t i = 0; i < fast.size(); ++i) {
        INFO("step " << i + 1 << ": fast loss " << fast[i] << ", reference loss " << ref[i]);
        // A step's loss differs by rounding as a model step's does above (up to 12·2·(32 + 4)·u ≈ 5e-5 for this
        // model: C = 32, V = 14), and each Adam update adds the weights' own small drift: 1e-4 for ten steps.
        // (Measured on AMD EPYC Zen 5: the two runs' losses agree to 7e-8 at every step.)
        CHECK(std::fabs(ref[i] - fast[i]) <= 1e-4 * fast[i]);
    }
}

TEST_CASE("reference ops: a model trained in reference mode learns the copy task", "[reference][learns][train]") {
    TempDir tmp;
    write_copy_task(tmp);
    tf::TrainConfig c = copy_config(tmp, "run", 300);
    c.log_every = 50;
    {
        tf::ReferenceModeScope reference;
        train_logged(c);
    }
    const std::vector<double> losses = tf_test::train_losses(tmp / "run");
    REQUIRE(losses.size() == 6);
    const tf::ModelBundle bundle = tf::load_model_dir(tmp / "run");
    const auto src = tf_test::split_lines(tf_test::read_all(tmp / "copy/test.src"));
    const auto hyps = tf::translate_lines(*bundle.model, bundle.tokenizers, src, tf::DecodeOptions{});
    REQUIRE(hyps.size() == src.size());
    int exact = 0;
    for (std::size_t i = 0; i < src.size(); ++i) exact += hyps[i] == src[i];
    INFO("losses at steps 50..300: " << losses[0] << " ... " << losses.back() << "; exact copies " << exact << " of " << src.size());
    // From 2.67 at step 50 towards the floor that label smoothing (0.1 over 14 symbols) leaves, about 0.5:
    // 0.57 at step 300, and every test sequence copied (AMD EPYC Zen 5), as the fast run does from step 300.
    CHECK(losses.back() < 0.25 * losses.front());
    CHECK(exact >= 90);
}

TEST_CASE("reference ops: tapeformer --reference trains the copy preset, checks gradients and says so", "[reference][cli]") {
    TempDir tmp;
    const std::string in = "cd " + tf_test::shell_quote(tmp.str()) + " && ";
    auto run = [&](const std::string& args) {  // `tapeformer <args>` in tmp; the exit status, stderr in tmp/err
        const int raw = std::system((in + tf_test::shell_quote(TF_CLI) + " " + args + " </dev/null >out 2>err").c_str());
        return raw != -1 && WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    };
    REQUIRE(run("data copy --out data/copy") == 0);
    REQUIRE(run("--threads 2 --reference train --preset copy --out run --max-steps 4 --log-every 2 --valid-every 4") == 0);
    const std::string err = tf_test::read_all(tmp / "err");
    INFO(err);
    CHECK(err.find("1 thread; reference ops (src/reference_ops.cpp)") != std::string::npos);
    CHECK(err.find("valid @ step 4") != std::string::npos);
    REQUIRE(run("--reference gradcheck --filter layer_norm") == 0);  // the float64 reference ops' backwards
    CHECK(tf_test::read_all(tmp / "out").find("--reference: the reference ops") != std::string::npos);
    REQUIRE(run("--help") == 0);
    CHECK(tf_test::read_all(tmp / "out").find("--reference") != std::string::npos);
    CHECK(run("--reference bench train --precision bf16 --steps 1") == 1);
    CHECK(tf_test::split_lines(tf_test::read_all(tmp / "err")).size() == 1);
    CHECK(tf_test::read_all(tmp / "err").find("reference mode") != std::string::npos);
}
