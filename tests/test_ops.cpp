// Forward values of the primitive ops (ops.h) against numbers worked out by hand or from the defining
// formula in double precision, and the errors each op raises. Gradients are checked by finite
// differences in tests/f64; matmul has its own file (test_matmul.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/lanes.h"
#include "tapeformer/ops.h"
#include "tapeformer/pool.h"
#include "ops_kernels.h"  // DropoutDraws (src/)
#include "helpers.h"

using tf::real;
using tf::Shape;
using tf::Tensor;

namespace {

const real kInf = std::numeric_limits<real>::infinity();

// The message of the std::invalid_argument that f throws ("" when it throws nothing).
template <class F>
std::string error_of(F f) {
    try {
        f();
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}

// Element-wise comparison with a relative tolerance (float32 rounding: a few units of 1e-7).
void check_close(const std::vector<real>& actual, const std::vector<double>& expected, double rel = 1e-6,
                 double abs = 1e-7) {
    REQUIRE(actual.size() == expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i) {
        INFO("element " << i);
        CHECK(double(actual[i]) == Approx(expected[i]).epsilon(rel).margin(abs));
    }
}

// 0, 1, 2, ... in the given shape.
Tensor iota(const Shape& shape) {
    Tensor t = Tensor::empty(shape);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = real(i);
    return t;
}

}  // namespace

// ---- add, sub, mul, div, scale --------------------------------------------------------------------------------

TEST_CASE("ops: elementwise ops on equal shapes", "[ops]") {
    Tensor a = Tensor::from({1, -2, 3, 4}, {2, 2});
    Tensor b = Tensor::from({0.5, 4, -1, 8}, {2, 2});
    check_close(tf::add(a, b).to_vector(), {1.5, 2, 2, 12});
    check_close(tf::sub(a, b).to_vector(), {0.5, -6, 4, -4});
    check_close(tf::mul(a, b).to_vector(), {0.5, -8, -3, 32});
    check_close(tf::div(a, b).to_vector(), {2, -0.5, -3, 0.5});
    check_close(tf::scale(a, real(-1.5)).to_vector(), {-1.5, 3, -4.5, -6});
    CHECK(tf::add(a, b).shape() == Shape{2, 2});
}

TEST_CASE("ops: a bias (C) broadcasts over (B, T, C)", "[ops]") {
    Tensor x = iota({2, 2, 3});                   // (B=2, T=2, C=3)
    Tensor bias = Tensor::from({10, 20, 30}, {3});  // (C)
    Tensor y = tf::add(x, bias);
    CHECK(y.shape() == Shape{2, 2, 3});
    check_close(y.to_vector(), {10, 21, 32, 13, 24, 35, 16, 27, 38, 19, 30, 41});
    // The operand order does not matter, and sub / div stretch the same way.
    CHECK(tf::add(bias, x).to_vector() == y.to_vector());
    check_close(tf::sub(bias, x).to_vector(), {10, 19, 28, 7, 16, 25, 4, 13, 22, 1, 10, 19});
    check_close(tf::div(x, bias).to_vector(), {0, 0.05, 2.0 / 30, 0.3, 0.2, 5.0 / 30, 0.6, 0.35, 8.0 / 30, 0.9, 0.5, 11.0 / 30});
}

TEST_CASE("ops: a column (T, 1) and a row (1, C) broadcast to (T, C)", "[ops]") {
    Tensor col = Tensor::from({1, 2}, {2, 1});
    Tensor row = Tensor::from({10, 20, 30}, {1, 3});
    Tensor y = tf::mul(col, row);
    CHECK(y.shape() == Shape{2, 3});
    check_close(y.to_vector(), {10, 20, 30, 20, 40, 60});
}

TEST_CASE("ops: a key mask (B, 1, 1, S) broadcasts over scores (B, H, T, S)", "[ops]") {
    Tensor scores = Tensor::full({2, 2, 2, 3}, real(1));  // (B=2, H=2, T=2, S=3)
    Tensor mask = Tensor::from({0, 0, -100, 0, -100, -100}, {2, 1, 1, 3});
    Tensor y = tf::add(scores, mask);
    CHECK(y.shape() == Shape{2, 2, 2, 3});
    const std::vector<real> v = y.to_vector();
    for (int b = 0; b < 2; ++b)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 2; ++t)
                for (int s = 0; s < 3; ++s) {
                    INFO("b " << b << " h " << h << " t " << t << " s " << s);
                    CHECK(v[((b * 2 + h) * 2 + t) * 3 + s] == real(1) + mask.data()[b * 3 + s]);
                }
}

TEST_CASE("ops: a head gate (1, H, 1, 1) scales each head of (B, H, T, D)", "[ops]") {
    Tensor x = Tensor::full({2, 3, 2, 2}, real(2));  // (B=2, H=3, T=2, D=2)
    Tensor gate = Tensor::from({1, 0, -0.5}, {1, 3, 1, 1});
    Tensor y = tf::mul(x, gate);
    CHECK(y.shape() == Shape{2, 3, 2, 2});
    const std::vector<real> v = y.to_vector();
    for (int i = 0; i < 24; ++i) {
        const int h = (i / 4) % 3;
        INFO("element " << i << " head " << h);
        CHECK(v[i] == real(2) * gate.data()[h]);
    }
}

TEST_CASE("ops: the gradient of a stretched operand is summed over the stretched axes", "[ops]") {
    tf::tape().clear();
    Tensor x = iota({2, 3});
    Tensor bias = Tensor::zeros({3});
    x.set_requires_grad();
    bias.set_requires_grad();
    Tensor y = tf::add(x, bias);
    tf::backward(y, std::vector<real>{1, 2, 3, 4, 5, 6});
    CHECK(bias.grad_vector() == std::vector<real>{5, 7, 9});
    CHECK(x.grad_vector() == std::vector<real>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("ops: shapes that do not broadcast are rejected", "[ops]") {
    Tensor a = Tensor::zeros({2, 3});
    Tensor b = Tensor::zeros({4});
    const std::string msg = error_of([&] { tf::add(a, b); });
    CHECK_THAT(msg, Catch::Contains("add") && Catch::Contains("(2, 3)") && Catch::Contains("(4)"));
    CHECK_THAT(error_of([&] { tf::mul(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 3, 4})); }),
               Catch::Contains("mul") && Catch::Contains("(2, 3, 4)") && Catch::Contains("(3, 3, 4)"));
    CHECK_THAT(error_of([&] { tf::sub(a, Tensor::zeros({3, 2})); }), Catch::StartsWith("sub"));
    CHECK_THAT(error_of([&] { tf::div(a, Tensor::zeros({2, 2})); }), Catch::StartsWith("div"));
    CHECK_THAT(error_of([&] { tf::add(Tensor(), a); }), Catch::Contains("add") && Catch::Contains("undefined"));
    CHECK_THAT(error_of([&] { tf::scale(Tensor(), real(2)); }), Catch::Contains("scale"));
}

// ---- permute, transpose, concat_last, slice_last ------------------------------------------------------------------

TEST_CASE("ops: transpose of a matrix", "[ops]") {
    Tensor a = Tensor::from({0, 1, 2, 3, 4, 5}, {2, 3});
    Tensor t = tf::transpose(a, 0, 1);
    CHECK(t.shape() == Shape{3, 2});
    CHECK(t.to_vector() == std::vector<real>{0, 3, 1, 4, 2, 5});
    CHECK(tf::transpose(a, -1, -2).to_vector() == t.to_vector());
    CHECK(tf::transpose(a, 1, 1).to_vector() == a.to_vector());
}

TEST_CASE("ops: permute moves every element to its new index", "[ops]") {
    Tensor a = iota({2, 3, 4});  // a[i, j, k] = 12 i + 4 j + k
    Tensor p = tf::permute(a, {2, 0, 1});
    CHECK(p.shape() == Shape{4, 2, 3});  // p[k, i, j] = a[i, j, k]
    const std::vector<real> v = p.to_vector();
    CHECK(v[(1 * 2 + 1) * 3 + 2] == real(21));  // p[1, 1, 2] = a[1, 2, 1] = 12 + 8 + 1
    for (int k = 0; k < 4; ++k)
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 3; ++j) CHECK(v[(k * 2 + i) * 3 + j] == real(12 * i + 4 * j + k));

    // The attention head split: (B, T, H, D) → (B, H, T, D).
    Tensor x = iota({2, 3, 2, 2});
    Tensor heads = tf::permute(x, {0, 2, 1, 3});
    CHECK(heads.shape() == Shape{2, 2, 3, 2});
    const std::vector<real> hv = heads.to_vector();
    for (int b = 0; b < 2; ++b)
        for (int h = 0; h < 2; ++h)
            for (int t = 0; t < 3; ++t)
                for (int d = 0; d < 2; ++d)
                    CHECK(hv[((b * 2 + h) * 3 + t) * 2 + d] == real(((b * 3 + t) * 2 + h) * 2 + d));
    // permute back restores the original order
    CHECK(tf::permute(heads, {0, 2, 1, 3}).to_vector() == x.to_vector());
}

TEST_CASE("ops: permute and transpose reject bad axes", "[ops]") {
    Tensor a = Tensor::zeros({2, 3, 4});
    CHECK_THAT(error_of([&] { tf::permute(a, {0, 1}); }), Catch::Contains("permute") && Catch::Contains("(2, 3, 4)"));
    CHECK_THAT(error_of([&] { tf::permute(a, {0, 1, 1}); }), Catch::Contains("permute") && Catch::Contains("0, 1, 1"));
    CHECK_THAT(error_of([&] { tf::permute(a, {0, 1, 3}); }), Catch::Contains("permute"));
    CHECK_THAT(error_of([&] { tf::transpose(a, 0, 3); }), Catch::Contains("transpose") && Catch::Contains("(2, 3, 4)"));
}

TEST_CASE("ops: concat_last joins along the last axis", "[ops]") {
    Tensor a = Tensor::from({1, 2}, {2, 1});
    Tensor b = Tensor::from({3, 4, 5, 6}, {2, 2});
    Tensor c = Tensor::from({7, 8, 9, 10, 11, 12}, {2, 3});
    Tensor y = tf::concat_last({a, b, c});
    CHECK(y.shape() == Shape{2, 6});
    CHECK(y.to_vector() == std::vector<real>{1, 3, 4, 7, 8, 9, 2, 5, 6, 10, 11, 12});

    CHECK_THAT(error_of([&] { tf::concat_last({a, Tensor::zeros({3, 2})}); }),
               Catch::Contains("concat_last") && Catch::Contains("(2, 1)") && Catch::Contains("(3, 2)"));
    CHECK_THAT(error_of([&] { tf::concat_last({a, Tensor::zeros({1, 2, 1})}); }), Catch::Contains("concat_last"));
    CHECK_THAT(error_of([] { tf::concat_last({}); }), Catch::Contains("concat_last"));
}

TEST_CASE("ops: slice_last takes a[..., begin:end]", "[ops]") {
    Tensor a = iota({2, 4});
    Tensor s = tf::slice_last(a, 1, 3);
    CHECK(s.shape() == Shape{2, 2});
    CHECK(s.to_vector() == std::vector<real>{1, 2, 5, 6});
    CHECK(tf::slice_last(a, 0, 4).to_vector() == a.to_vector());
    CHECK(tf::slice_last(iota({2, 2, 3}), 2, 3).to_vector() == std::vector<real>{2, 5, 8, 11});

    // slice undoes concat
    Tensor b = Tensor::from({-1, -2, -3, -4}, {2, 2});
    Tensor joined = tf::concat_last({a, b});
    CHECK(tf::slice_last(joined, 4, 6).to_vector() == b.to_vector());

    CHECK_THAT(error_of([&] { tf::slice_last(a, 2, 5); }),
               Catch::Contains("slice_last") && Catch::Contains("[2, 5)") && Catch::Contains("(2, 4)"));
    CHECK_THAT(error_of([&] { tf::slice_last(a, -1, 2); }), Catch::Contains("slice_last"));
    CHECK_THAT(error_of([&] { tf::slice_last(a, 3, 3); }), Catch::Contains("slice_last"));
    CHECK_THAT(error_of([] { tf::slice_last(Tensor::scalar(1), 0, 1); }), Catch::Contains("slice_last"));
}

// ---- sum, mean ------------------------------------------------------------------------------------------------------

TEST_CASE("ops: sum and mean over an axis, with and without keepdim", "[ops]") {
    Tensor a = Tensor::from({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor s0 = tf::sum(a, 0);
    CHECK(s0.shape() == Shape{3});
    CHECK(s0.to_vector() == std::vector<real>{5, 7, 9});
    Tensor s1 = tf::sum(a, 1, true);
    CHECK(s1.shape() == Shape{2, 1});
    CHECK(s1.to_vector() == std::vector<real>{6, 15});
    Tensor m = tf::mean(a, -1);
    CHECK(m.shape() == Shape{2});
    check_close(m.to_vector(), {2, 5});
    Tensor m0 = tf::mean(a, 0, true);
    CHECK(m0.shape() == Shape{1, 3});
    check_close(m0.to_vector(), {2.5, 3.5, 4.5});

    Tensor total = tf::sum_all(a);
    CHECK(total.shape() == Shape{});
    CHECK(total.item() == real(21));

    // The middle axis of a 3-D tensor: out[i, k] = Σ_j a[i, j, k]
    Tensor b = iota({2, 3, 2});
    Tensor sb = tf::sum(b, 1);
    CHECK(sb.shape() == Shape{2, 2});
    CHECK(sb.to_vector() == std::vector<real>{0 + 2 + 4, 1 + 3 + 5, 6 + 8 + 10, 7 + 9 + 11});
    Tensor mb = tf::mean(b, 1, true);
    CHECK(mb.shape() == Shape{2, 1, 2});
    check_close(mb.to_vector(), {2, 3, 8, 9});

    CHECK_THAT(error_of([&] { tf::sum(a, 2); }), Catch::Contains("sum") && Catch::Contains("(2, 3)"));
    CHECK_THAT(error_of([&] { tf::mean(a, -3); }), Catch::Contains("mean"));
}

// ---- relu, gelu ------------------------------------------------------------------------------------------------------

TEST_CASE("ops: relu", "[ops]") {
    Tensor x = Tensor::from({-2, -0.0, 0, 0.5, 3}, {5});
    CHECK(tf::relu(x).to_vector() == std::vector<real>{0, 0, 0, 0.5, 3});
}

TEST_CASE("ops: gelu is x·Φ(x) with the exact erf", "[ops]") {
    const std::vector<double> points = {-4, -3, -1, -0.5, -1e-3, 0, 1e-3, 0.5, 1, 2, 3.5};
    std::vector<real> xs(points.begin(), points.end());
    std::vector<double> expected;
    for (double x : points) expected.push_back(0.5 * x * (1 + std::erf(x / std::sqrt(2.0))));
    // The tails lose relative precision in float (1 + erf(x/√2) cancels for x ≪ 0): an absolute
    // margin of 1e-6 covers that, and the tanh approximation (off by ~1e-4 at x = ±1, ±3.5) still fails.
    check_close(tf::gelu(Tensor::from(xs, {std::int64_t(xs.size())})).to_vector(), expected, 1e-6, 1e-6);
    // Two values known by heart: gelu(1) = Φ(1) = 0.8413447..., gelu(-1) = -(1 − Φ(1)).
    const std::vector<real> g = tf::gelu(Tensor::from({1, -1}, {2})).to_vector();
    CHECK(double(g[0]) == Approx(0.8413447460685429).epsilon(1e-6));
    CHECK(double(g[1]) == Approx(-0.15865525393145707).epsilon(1e-6));
}

TEST_CASE("ops: tanh, sigmoid, exp, log and pow at values known by heart", "[ops]") {
    Tensor x = Tensor::from({0, 1, 4}, {3});
    check_close(tf::tanh(x).to_vector(), {0, 0.7615941559557649, 0.999329299739067}, 1e-6, 1e-7);
    check_close(tf::sigmoid(x).to_vector(), {0.5, 0.7310585786300049, 0.9820137900379085}, 1e-6, 1e-7);
    check_close(tf::exp(x).to_vector(), {1, 2.718281828459045, 54.598150033144236}, 1e-6, 1e-7);
    check_close(tf::log(Tensor::from({1, 2.718281828459045, 0.5}, {3})).to_vector(), {0, 1, -0.6931471805599453}, 1e-6, 1e-7);
    check_close(tf::pow(Tensor::from({2, 3, 4}, {3}), 2).to_vector(), {4, 9, 16}, 1e-6, 0);
    check_close(tf::pow(Tensor::from({4, 9}, {2}), real(0.5)).to_vector(), {2, 3}, 1e-6, 0);
}

// ---- softmax, log_softmax -----------------------------------------------------------------------------------------------

TEST_CASE("ops: softmax values and rows summing to 1", "[ops]") {
    // softmax(0, ln 2, ln 3) = (1, 2, 3) / 6
    Tensor x = Tensor::from({0, real(std::log(2.0)), real(std::log(3.0))}, {1, 3});
    check_close(tf::softmax(x).to_vector(), {1.0 / 6, 2.0 / 6, 3.0 / 6});

    // Large logits do not overflow: softmax(1000, 1001) = (1, e) / (1 + e)
    const double e = std::exp(1.0);
    check_close(tf::softmax(Tensor::from({1000, 1001}, {2})).to_vector(), {1 / (1 + e), e / (1 + e)});

    Tensor r = Tensor::from({0.3, -1.2, 2.0, 0.0, 5.0, 4.0, -3.0, 0.5, 1.0, 1.0, 1.0, 1.0}, {3, 4});
    const std::vector<real> p = tf::softmax(r).to_vector();
    for (int row = 0; row < 3; ++row) {
        double total = 0;
        for (int j = 0; j < 4; ++j) {
            total += p[row * 4 + j];
            CHECK(p[row * 4 + j] > 0);
        }
        CHECK(total == Approx(1).epsilon(1e-6));
    }
    check_close({p[8], p[9], p[10], p[11]}, {0.25, 0.25, 0.25, 0.25});
}

TEST_CASE("ops: softmax with a -inf mask gives exactly 0 to masked positions", "[ops]") {
    // Scores (B=2, H=1, T=2, S=3); batch row 1's last key is padding.
    Tensor scores = Tensor::from({0.1, 0.2, 0.3, 1.0, -1.0, 2.0, 0.5, 0.5, 9.0, 3.0, 1.0, -2.0}, {2, 1, 2, 3});
    Tensor key_mask = Tensor::from({0, 0, 0, 0, 0, -kInf}, {2, 1, 1, 3});
    const std::vector<real> p = tf::softmax(scores, key_mask).to_vector();
    const std::vector<real> full = tf::softmax(scores).to_vector();
    for (int i = 0; i < 6; ++i) CHECK(p[i] == Approx(full[i]).epsilon(1e-6));  // batch 0: nothing masked
    CHECK(p[8] == real(0));
    CHECK(p[11] == real(0));
    // The survivors are the softmax over the unmasked keys alone.
    check_close({p[6], p[7]}, {0.5, 0.5});
    const double e2 = std::exp(2.0);
    check_close({p[9], p[10]}, {e2 / (e2 + 1), 1 / (e2 + 1)});

    // A causal mask (T, T) with a row that sees nothing: that row becomes all zeros (not NaN).
    Tensor causal = Tensor::from({-kInf, -kInf, -kInf, 0, -kInf, -kInf, 0, 0, -kInf}, {3, 3});
    Tensor x = Tensor::from({1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {2, 3, 3});
    const std::vector<real> c = tf::softmax(x, causal).to_vector();
    for (int b = 0; b < 2; ++b) {
        const real* row = c.data() + b * 9;
        for (int j = 0; j < 3; ++j) CHECK(row[j] == real(0));              // row 0: fully masked
        CHECK(row[3] == real(1));                                          // row 1 sees key 0 only
        CHECK(row[4] == real(0));
        CHECK(row[5] == real(0));
        CHECK(double(row[6]) == Approx(1 / (1 + std::exp(1.0))).epsilon(1e-6));  // keys 0, 1: logits 7, 8
        CHECK(double(row[7]) == Approx(std::exp(1.0) / (1 + std::exp(1.0))).epsilon(1e-6));
        CHECK(row[8] == real(0));
    }

    // The gradient of a fully masked row is zero as well (no NaN from 0/0).
    tf::tape().clear();
    x.set_requires_grad();
    Tensor y = tf::softmax(x, causal);
    tf::backward(y, std::vector<real>(18, real(1)));
    for (real g : x.grad_vector()) CHECK(std::isfinite(g));
    CHECK(x.grad_vector()[0] == real(0));
}

TEST_CASE("ops: softmax rejects a mask that does not broadcast", "[ops]") {
    Tensor x = Tensor::zeros({2, 3});
    CHECK_THAT(error_of([&] { tf::softmax(x, Tensor::zeros({4})); }),
               Catch::Contains("softmax") && Catch::Contains("(2, 3)") && Catch::Contains("(4)"));
    CHECK_THAT(error_of([&] { tf::softmax(x, Tensor::zeros({2, 2, 3})); }), Catch::Contains("softmax"));
    CHECK_THAT(error_of([&] { tf::softmax(x, Tensor::zeros({3, 3})); }), Catch::Contains("softmax"));
    CHECK_THAT(error_of([] { tf::softmax(Tensor::scalar(1)); }), Catch::Contains("softmax"));
}

TEST_CASE("ops: log_softmax equals log(softmax) and stays finite", "[ops]") {
    Tensor x = Tensor::from({0.3, -1.2, 2.0, 0.0, 5.0, 4.0, -3.0, 0.5, 10.0, -10.0, 0.0, 1.0}, {3, 4});
    const std::vector<real> lp = tf::log_softmax(x).to_vector();
    const std::vector<real> p = tf::softmax(x).to_vector();
    std::vector<double> expected;
    for (real v : p) expected.push_back(std::log(double(v)));
    check_close(lp, expected, 1e-5, 1e-6);
    // Where softmax underflows to 0, log_softmax is still exact: log_softmax(0, 200) = (−200 − log(1 + e⁻²⁰⁰), ≈0)
    const std::vector<real> big = tf::log_softmax(Tensor::from({0, 200}, {2})).to_vector();
    CHECK(double(big[0]) == Approx(-200).epsilon(1e-7));
    CHECK(double(big[1]) == Approx(0).margin(1e-7));
}

// ---- layer_norm ------------------------------------------------------------------------------------------------------------

TEST_CASE("ops: layer_norm gives each row mean 0 and biased variance 1", "[ops]") {
    const std::int64_t N = 5, C = 16;
    Tensor x = Tensor::empty({N, C});
    for (std::int64_t i = 0; i < N * C; ++i) x.data()[i] = real(3 * std::sin(0.7 * double(i * i)) + double(i % 5));
    Tensor y = tf::layer_norm(x, Tensor::full({C}, 1), Tensor::zeros({C}), real(0));
    for (std::int64_t n = 0; n < N; ++n) {
        double mu = 0, var = 0;
        for (std::int64_t c = 0; c < C; ++c) mu += y.data()[n * C + c];
        mu /= double(C);
        for (std::int64_t c = 0; c < C; ++c) var += (y.data()[n * C + c] - mu) * (y.data()[n * C + c] - mu);
        var /= double(C);  // biased: divide by C, not C − 1 (which would give 16/15)
        INFO("row " << n);
        CHECK(mu == Approx(0).margin(1e-6));
        CHECK(var == Approx(1).epsilon(1e-5));
    }
}

TEST_CASE("ops: layer_norm of a hand-computed row", "[ops]") {
    // x = (1, 2, 4): μ = 7/3, x − μ = (−4, −1, 5)/3, σ² = (16 + 1 + 25)/27 = 14/9,
    // so x̂ = (−4, −1, 5)/√14 without eps.
    Tensor x = Tensor::from({1, 2, 4}, {1, 3});
    const double s14 = std::sqrt(14.0);
    check_close(tf::layer_norm(x, Tensor::full({3}, 1), Tensor::zeros({3}), real(0)).to_vector(),
                {-4 / s14, -1 / s14, 5 / s14});
    // With gamma, beta and the default eps = 1e-5 inside the square root.
    Tensor gamma = Tensor::from({1, 2, 0.5}, {3});
    Tensor beta = Tensor::from({0, 1, -1}, {3});
    const double rstd = 1 / std::sqrt(14.0 / 9.0 + 1e-5);
    check_close(tf::layer_norm(x, gamma, beta).to_vector(),
                {-4.0 / 3 * rstd * 1 + 0, -1.0 / 3 * rstd * 2 + 1, 5.0 / 3 * rstd * 0.5 - 1});
    // A constant row: x − μ = 0, so the output is beta (eps keeps it finite).
    check_close(tf::layer_norm(Tensor::full({1, 3}, 7), gamma, beta).to_vector(), {0, 1, -1});
}

TEST_CASE("ops: layer_norm rejects gamma and beta of the wrong width", "[ops]") {
    Tensor x = Tensor::zeros({2, 4});
    CHECK_THAT(error_of([&] { tf::layer_norm(x, Tensor::zeros({3}), Tensor::zeros({4})); }),
               Catch::Contains("layer_norm") && Catch::Contains("(2, 4)") && Catch::Contains("(3)"));
    CHECK_THAT(error_of([&] { tf::layer_norm(x, Tensor::zeros({4}), Tensor::zeros({1, 4})); }), Catch::Contains("layer_norm"));
}

// ---- dropout --------------------------------------------------------------------------------------------------------------------

TEST_CASE("ops: dropout zeroes a fraction p and scales survivors by 1/(1-p)", "[ops]") {
    const std::int64_t n = 100000;
    const real p = real(0.3);
    Tensor x = Tensor::full({n}, real(2));
    tf::Rng rng(42);
    Tensor y = tf::dropout(x, p, rng);
    CHECK(rng.offset == std::uint64_t(n / 2));  // the call reserved n/2 counters: one hash draws two values
    std::int64_t zeros = 0;
    const real survivor = real(2) / (real(1) - p);
    for (real v : y.to_vector()) {
        if (v == real(0)) ++zeros;
        else if (v != survivor) FAIL("a survivor is " << v << ", expected " << survivor);
    }
    // The count of zeros is Binomial(n, 0.3): σ ≈ 145, so ±1500 is over ten σ wide.
    CHECK(zeros > 30000 - 1500);
    CHECK(zeros < 30000 + 1500);
    CHECK(double(survivor) == Approx(2 / 0.7).epsilon(1e-6));
}

TEST_CASE("ops: dropout's draws are the halves of one hash, and the chunked forms agree with them value by value", "[ops]") {
    tf::Rng rng(11, 5);
    const tf::DropoutDraws draws(rng, 1001, real(0.4));
    CHECK(draws.base == 5);
    CHECK(rng.offset == 5 + 501);  // ⌈1001/2⌉ counters
    CHECK(draws.threshold == std::uint32_t(double(real(0.4)) * 0x1.0p32));
    for (std::int64_t k : {0, 1, 250, 500}) {
        const std::uint64_t h = tf::hash64(11, 5 + std::uint64_t(k));
        CHECK(draws.draw(2 * k) == std::uint32_t(h));        // low half
        CHECK(draws.draw(2 * k + 1) == std::uint32_t(h >> 32));  // high half
    }
    // apply_n and keep_flags_n make their draws by chunks of whole hashes: every start (odd ones begin with a
    // high half) and length (across chunks, odd ends with a low half) gives keeps()'s values.
    std::vector<real> x(1001), y(1001);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = real(i) + 1;
    std::vector<std::uint32_t> kept(1001);
    std::int64_t dropped = 0;
    for (std::int64_t first : {0, 1, 2, 255, 256, 257, 300}) {
        for (std::int64_t n : {0, 1, 2, 3, 255, 256, 257, 513, 700}) {
            INFO("first " << first << ", n " << n);
            draws.apply_n(first, n, x.data() + first, y.data());
            draws.keep_flags_n(first, n, kept.data());
            for (std::int64_t j = 0; j < n; ++j) {
                const bool keeps = draws.keeps(first + j);
                REQUIRE(kept[j] == std::uint32_t(keeps));
                REQUIRE(y[j] == (keeps ? x[first + j] * draws.keep_scale : real(0)));
                dropped += !keeps;
            }
        }
    }
    CHECK(dropped > 0);
}

TEST_CASE("ops: dropout masks come from the Rng's seed and offset", "[ops]") {
    Tensor x = Tensor::full({4096}, real(1));
    tf::Rng a(7), b(7), shifted(7, 1000), other_seed(8);
    const std::vector<real> ya = tf::dropout(x, real(0.5), a).to_vector();
    CHECK(tf::dropout(x, real(0.5), b).to_vector() == ya);  // same state, same mask
    auto differences = [&](const std::vector<real>& v) {
        int d = 0;
        for (std::size_t i = 0; i < v.size(); ++i) d += (v[i] == 0) != (ya[i] == 0);
        return d;
    };
    // Independent masks at p = 0.5 disagree on about half the positions.
    CHECK(differences(tf::dropout(x, real(0.5), shifted).to_vector()) > 1500);
    CHECK(differences(tf::dropout(x, real(0.5), other_seed).to_vector()) > 1500);
    // The stream advanced: a second call with the same Rng draws a new mask...
    CHECK(differences(tf::dropout(x, real(0.5), a).to_vector()) > 1500);
    // ...which is the mask of a fresh Rng started at that offset.
    tf::Rng at_4096(7, 4096), again(7, 4096);
    CHECK(tf::dropout(x, real(0.5), at_4096).to_vector() == tf::dropout(x, real(0.5), again).to_vector());

    // The mask does not depend on the number of threads.
    const int threads = tf::num_threads();
    Tensor big = Tensor::full({1 << 16}, real(1));
    tf::set_threads(1);
    tf::Rng r1(3);
    const std::vector<real> one = tf::dropout(big, real(0.2), r1).to_vector();
    tf::set_threads(2);
    tf::Rng r2(3);
    const std::vector<real> two = tf::dropout(big, real(0.2), r2).to_vector();
    tf::set_threads(threads);
    CHECK(one == two);
}

TEST_CASE("ops: dropout is the identity when not training or p = 0", "[ops]") {
    Tensor x = Tensor::from({1, 2, 3, 4}, {2, 2});
    tf::Rng rng(1);
    Tensor eval = tf::dropout(x, real(0.5), rng, /*training=*/false);
    CHECK(eval.to_vector() == x.to_vector());
    CHECK(eval.shape() == x.shape());
    CHECK(rng.offset == 0);  // nothing drawn
    CHECK(tf::dropout(x, real(0), rng).to_vector() == x.to_vector());

    CHECK_THAT(error_of([&] { tf::dropout(x, real(1), rng); }), Catch::Contains("dropout"));
    CHECK_THAT(error_of([&] { tf::dropout(x, real(-0.1), rng); }), Catch::Contains("dropout"));
}

// ---- embedding ---------------------------------------------------------------------------------------------------------------------

TEST_CASE("ops: embedding gathers rows of the table", "[ops]") {
    Tensor table = iota({4, 3});  // row v = (3v, 3v + 1, 3v + 2)
    Tensor y = tf::embedding(table, {2, 0, 3, 2}, {2, 2});
    CHECK(y.shape() == Shape{2, 2, 3});
    CHECK(y.to_vector() == std::vector<real>{6, 7, 8, 0, 1, 2, 9, 10, 11, 6, 7, 8});

    // Backward scatter-adds: id 2 appears twice; the padding id 0 gets nothing.
    tf::tape().clear();
    table.set_requires_grad();
    Tensor e = tf::embedding(table, {2, 0, 3, 2}, {4}, /*padding_idx=*/0);
    std::vector<real> up(12);
    for (int i = 0; i < 12; ++i) up[i] = real(i + 1);
    tf::backward(e, up);
    CHECK(table.grad_vector() == std::vector<real>{0, 0, 0, 0, 0, 0, 1 + 10, 2 + 11, 3 + 12, 7, 8, 9});
}

TEST_CASE("ops: embedding rejects ids outside the table", "[ops]") {
    Tensor table = Tensor::zeros({4, 3});
    CHECK_THAT(error_of([&] { tf::embedding(table, {1, 4}, {2}); }),
               Catch::Contains("embedding") && Catch::Contains("id 4") && Catch::Contains("4 rows"));
    CHECK_THAT(error_of([&] { tf::embedding(table, {-1}, {1}); }), Catch::Contains("embedding") && Catch::Contains("-1"));
    CHECK_THAT(error_of([&] { tf::embedding(table, {1, 2, 3}, {2, 2}); }), Catch::Contains("embedding"));
    CHECK_THAT(error_of([] { tf::embedding(Tensor::zeros({4}), {1}, {1}); }), Catch::Contains("embedding"));
}

// ---- cross_entropy ---------------------------------------------------------------------------------------------------------------

TEST_CASE("ops: cross_entropy with label smoothing and an ignored position", "[ops]") {
    const std::vector<double> x = {1.0, -0.5, 2.0, 0.0,    // row 0, target 2
                                   3.0, 3.0, -1.0, 0.5,    // row 1, ignored
                                   -2.0, 0.25, 1.5, -1.0}; // row 2, target 0
    const std::vector<std::int32_t> target = {2, -100, 0};
    const double eps = 0.1;
    const int V = 4;
    // loss_i = −(1−ε) log p_i,t − (ε/V) Σ_j log p_i,j,  averaged over the two counted rows.
    double loss = 0, nll = 0;
    for (int i : {0, 2}) {
        double total = 0;
        for (int j = 0; j < V; ++j) total += std::exp(x[i * V + j]);
        double sum_logp = 0;
        for (int j = 0; j < V; ++j) sum_logp += std::log(std::exp(x[i * V + j]) / total);
        const double logp_t = std::log(std::exp(x[i * V + target[i]]) / total);
        loss += -(1 - eps) * logp_t - eps / V * sum_logp;
        nll += -logp_t;
    }
    loss /= 2;

    Tensor logits = Tensor::from(std::vector<real>(x.begin(), x.end()), {3, 4});
    tf::CrossEntropyStats stats;
    Tensor out = tf::cross_entropy(logits, target, -100, real(eps), &stats);
    CHECK(out.shape() == Shape{});
    CHECK(double(out.item()) == Approx(loss).epsilon(1e-6));
    CHECK(stats.count == 2);
    CHECK(stats.nll_sum == Approx(nll).epsilon(1e-6));

    // The ignored row does not matter: other logits there give the same loss.
    Tensor changed = logits.clone();
    changed.data()[4] = 100;
    CHECK(tf::cross_entropy(changed, target, -100, real(eps)).item() == out.item());
    // Without smoothing the loss is the mean negative log-likelihood.
    CHECK(double(tf::cross_entropy(logits, target, -100, real(0)).item()) == Approx(nll / 2).epsilon(1e-6));
}

TEST_CASE("ops: cross_entropy of uniform logits is log V, all ignored gives 0", "[ops]") {
    Tensor logits = Tensor::zeros({2, 4});
    CHECK(double(tf::cross_entropy(logits, {1, 3}, -1, real(0.1)).item()) == Approx(std::log(4.0)).epsilon(1e-6));
    tf::CrossEntropyStats stats;
    stats.count = 99;
    CHECK(tf::cross_entropy(logits, {0, 0}, 0, real(0.1), &stats).item() == real(0));
    CHECK(stats.count == 0);
    CHECK(stats.nll_sum == 0);
}

TEST_CASE("ops: cross_entropy gradient is (p − smoothed one-hot)/n and zero on ignored rows", "[ops]") {
    tf::tape().clear();
    Tensor logits = Tensor::zeros({2, 4});  // p = 1/4 everywhere
    logits.set_requires_grad();
    Tensor loss = tf::cross_entropy(logits, {1, -1}, -1, real(0.2));
    tf::backward(loss);
    // one counted row: dx_j = p_j − ε/V − (1−ε)[j = t] = 0.25 − 0.05 − 0.8 [j = 1]
    check_close(logits.grad_vector(), {0.2, -0.6, 0.2, 0.2, 0, 0, 0, 0});
}

TEST_CASE("lanes: lane_sum2 gives each sum lane_sum's bits, and g reads a value before f writes over it", "[ops]") {
    // cross_entropy keeps e^(x − max) over the logits in the pass that also sums them
    const Tensor t = tf::random_tensor({1, 1000}, 3);  // 1000: 62 full blocks of the lanes and a tail
    std::vector<real> x(t.data(), t.data() + t.numel()), y = x;
    const real want_f = tf::lane_sum(1000, [&](std::int64_t j) { return tf::exp_fast(x[j]); });
    const real want_g = tf::lane_sum(1000, [&](std::int64_t j) { return x[j]; });
    real f = 0, g = 0;
    tf::lane_sum2(
        1000, [&](std::int64_t j) { return y[j] = tf::exp_fast(y[j]); }, [&](std::int64_t j) { return y[j]; }, f, g);
    CHECK(f == want_f);
    CHECK(g == want_g);  // the values before f overwrote them
    for (std::size_t j = 0; j < x.size(); ++j) REQUIRE(y[j] == tf::exp_fast(x[j]));
}

namespace {

// x (N, C) · W (V, C)ᵀ + b into cross_entropy, as a model's output layer feeds its loss.
struct OutputLayer {
    Tensor x, w, b;
    std::vector<std::int32_t> target;
    explicit OutputLayer(std::int64_t N, std::int64_t C, std::int64_t V) {
        x = tf::random_tensor({N, C}, 7);
        w = tf::random_tensor({V, C}, 8);
        b = tf::random_tensor({V}, 9);
        for (std::int64_t i = 0; i < N; ++i) target.push_back(i % 5 == 4 ? -1 : static_cast<std::int32_t>((i * 7) % V));
    }
    // The loss's gradients of x, W and b after one backward seeded with `seed`.
    std::vector<std::vector<real>> gradients(bool consume, real seed = 1) {
        for (Tensor* t : {&x, &w, &b}) t->release_grad();
        Tensor loss = tf::cross_entropy(tf::affine(x, w, b), target, -1, real(0.1), nullptr, consume, seed);
        tf::backward(loss, std::vector<real>{seed});
        return {x.grad_vector(), w.grad_vector(), b.grad_vector()};
    }
};

}  // namespace

TEST_CASE("ops: cross_entropy with consume_logits gives the same gradients bit for bit, one (N, V) buffer less",
          "[ops]") {
    tf::tape().clear();
    const std::int64_t N = 96, C = 16, V = 512;
    OutputLayer layer(N, C, V);
    const auto plain = layer.gradients(false);
    auto peak_of = [&](bool consume) {
        tf::pool_reset_peak();
        const std::size_t before = tf::pool_stats().bytes_asked;
        layer.gradients(consume);
        return tf::pool_stats().peak_bytes_asked - before;
    };
    CHECK(layer.gradients(true) == plain);
    const real seed = real(0.3);  // a micro-batch's share of an accumulated step's gradient
    CHECK(layer.gradients(true, seed) == layer.gradients(false, seed));
    const std::size_t with_buffer = peak_of(false), over_logits = peak_of(true);
    INFO("peak above the start: " << with_buffer << " bytes without, " << over_logits << " with consume_logits");
    CHECK(with_buffer - over_logits >= std::size_t(N * V) * sizeof(real));
}

TEST_CASE("ops: cross_entropy with consume_logits: a broken promise is caught in backward, a leaf is left alone",
          "[ops]") {
    // consume_logits writes the gradient over the logits in the forward pass; backward finds out when the caller
    // did not keep its promise (nothing else reads them; backward seeded as promised) and says so.
    tf::tape().clear();
    OutputLayer layer(12, 4, 10);
    auto broken = [](auto run) {  // the std::logic_error's message ("" when nothing is thrown)
        std::string message;
        try {
            run();
        } catch (const std::logic_error& e) {
            message = e.what();
        }
        tf::tape().clear();
        return message;
    };
    SECTION("the caller holds them") {
        Tensor logits = tf::affine(layer.x, layer.w, layer.b);
        Tensor loss = tf::cross_entropy(logits, layer.target, -1, real(0.1), nullptr, true);
        CHECK_THAT(broken([&] { tf::backward(loss); }), Catch::Contains("consume_logits") && Catch::Contains("holds"));
    }
    SECTION("another op read them after the loss") {
        Tensor logits = tf::affine(layer.x, layer.w, layer.b);
        Tensor loss = tf::add(tf::cross_entropy(logits, layer.target, -1, real(0.1), nullptr, true), tf::sum_all(logits));
        logits = Tensor();  // only the tape holds them: affine's output, cross_entropy's and sum_all's input
        CHECK_THAT(broken([&] { tf::backward(loss); }), Catch::Contains("consume_logits"));
    }
    SECTION("backward seeded with another value") {
        Tensor loss = tf::cross_entropy(tf::affine(layer.x, layer.w, layer.b), layer.target, -1, real(0.1), nullptr, true,
                                        real(0.5));
        CHECK_THAT(broken([&] { tf::backward(loss, std::vector<real>{real(0.25)}); }), Catch::Contains("seed"));
    }
    SECTION("they are a leaf, not an op's output") {
        Tensor logits = Tensor::full({2, 3}, real(0.5));
        logits.set_requires_grad();
        Tensor loss = tf::cross_entropy(logits, {0, 2}, -1, real(0), nullptr, true);
        tf::backward(loss);
        CHECK(logits.to_vector() == std::vector<real>(6, real(0.5)));
        // p = 1/3 each: (p − [j = t]) / 2 over the two rows
        check_close(logits.grad_vector(), {-1.0 / 3, 1.0 / 6, 1.0 / 6, 1.0 / 6, 1.0 / 6, -1.0 / 3});
    }
}

TEST_CASE("ops: cross_entropy errors name the op", "[ops]") {
    Tensor logits = Tensor::zeros({2, 4});
    CHECK_THAT(error_of([&] { tf::cross_entropy(logits, {1, 4}, -1, real(0)); }),
               Catch::Contains("cross_entropy") && Catch::Contains("target 4"));
    CHECK_THAT(error_of([&] { tf::cross_entropy(logits, {1}, -1, real(0)); }),
               Catch::Contains("cross_entropy") && Catch::Contains("(2, 4)"));
    CHECK_THAT(error_of([&] { tf::cross_entropy(Tensor::zeros({2, 2, 4}), {1, 1}, -1, real(0)); }),
               Catch::Contains("cross_entropy") && Catch::Contains("(2, 2, 4)"));
    CHECK_THAT(error_of([&] { tf::cross_entropy(logits, {1, 1}, -1, real(1.5)); }), Catch::Contains("cross_entropy"));
}

TEST_CASE("hard_concrete: the evaluation gate by hand, samples open as often as hard_concrete_open says", "[ops][l0]") {
    const real beta = real(0.33), l = real(-0.1), r = real(1.1);
    tf::Rng rng(1);
    // evaluation: z = min(1, max(0, σ(log α)·1.2 − 0.1)): log α = 0 → 0.5; −3 → σ = 0.0474 → 0; 3 → 1.043 → 1
    const Tensor eval = tf::hard_concrete(Tensor::from({0, -3, 3}, {3}), beta, l, r, rng, false);
    CHECK(eval.data()[0] == Approx(0.5).epsilon(1e-6));
    CHECK(eval.data()[1] == 0);
    CHECK(eval.data()[2] == 1);
    CHECK(rng.offset == 0);  // evaluation draws no noise
    // P(open) at log α = 0: σ(−0.33 ln(0.1 / 1.1)) = σ(0.7913) = 0.6881
    const Tensor open = tf::hard_concrete_open(Tensor::from({0, 1.5f}, {2}), beta, l, r);
    CHECK(open.data()[0] == Approx(1 / (1 + std::exp(-0.33 * std::log(11.0)))).epsilon(1e-6));
    CHECK(open.data()[0] == Approx(0.6881).margin(1e-4));
    // 20000 samples of two gates: the share that is not 0 matches P(open) (sd of the share ≈ 0.003), and a
    // fair share is exactly 1 (the stretch makes both ends reachable).
    Tensor alpha = Tensor::from(std::vector<real>(20000, 0), {10000, 2});
    for (std::int64_t i = 0; i < 10000; ++i) alpha.data()[2 * i + 1] = real(1.5);
    const Tensor z = tf::hard_concrete(alpha, beta, l, r, rng);
    CHECK(rng.offset == 20000);
    double nonzero[2] = {0, 0}, ones[2] = {0, 0};
    for (std::int64_t i = 0; i < 20000; ++i) {
        REQUIRE(z.data()[i] >= 0);
        REQUIRE(z.data()[i] <= 1);
        nonzero[i % 2] += z.data()[i] > 0 ? 1e-4 : 0;
        ones[i % 2] += z.data()[i] == 1 ? 1e-4 : 0;
    }
    CHECK(nonzero[0] == Approx(open.data()[0]).margin(0.015));
    CHECK(nonzero[1] == Approx(open.data()[1]).margin(0.015));
    CHECK(ones[0] > 0.2);
    CHECK_THROWS_WITH(tf::hard_concrete(alpha, real(0), l, r, rng), Catch::Contains("hard_concrete") && Catch::Contains("temperature"));
    CHECK_THROWS_WITH(tf::hard_concrete_open(alpha, beta, real(0.1), r), Catch::Contains("stretch"));
}

TEST_CASE("ops: additive attention scores s_ij = v · tanh(q_i + k_j), by hand", "[ops][attention]") {
    // One batch row, one head, D = 2: q = (0.5, −1), k_0 = (0, 1), k_1 = (2, −3), v = (1, 0.5).
    Tensor q = Tensor::from({0.5, -1}, {1, 1, 1, 2});
    Tensor k = Tensor::from({0, 1, 2, -3}, {1, 1, 2, 2});
    Tensor v = Tensor::from({1, 0.5}, {1, 2});
    Tensor s = tf::additive_scores(q, k, v);
    REQUIRE(s.shape() == tf::Shape{1, 1, 1, 2});
    CHECK(s.data()[0] == Approx(std::tanh(0.5) + 0.5 * std::tanh(0.0)).epsilon(1e-6));
    CHECK(s.data()[1] == Approx(std::tanh(2.5) + 0.5 * std::tanh(-4.0)).epsilon(1e-6));
    CHECK_THROWS_WITH(tf::additive_scores(q, k, Tensor::from({1, 2, 3}, {1, 3})), Catch::Contains("additive_scores"));
}

// ---- fused dropout ---------------------------------------------------------------------------------------------

TEST_CASE("ops: relu_dropout and add_dropout_layer_norm give the numbers of the ops they fuse, forward and backward, "
          "and draw the same counters",
          "[ops]") {
    const Shape shape{8, 64, 260};  // 133,120 values: above kParallelGrain (2^17), so the threaded paths run
    auto random = [&](std::uint64_t seed) { return tf::random_tensor(shape, seed, -1, 1, false); };
    Tensor gamma = Tensor::full(Shape{260}, 1.25f), beta = Tensor::full(Shape{260}, -0.5f);
    // loss = Σ y · w for a fixed random w: every output's gradient is a different number.
    const Tensor w = random(99);
    auto grads_of = [&](const std::vector<Tensor>& inputs, const auto& f, tf::Rng& rng) {
        std::vector<Tensor> xs;
        for (const Tensor& t : inputs) xs.push_back(t.clone().set_requires_grad());
        Tensor y = f(xs, rng);
        Tensor loss = tf::sum_all(tf::mul(y, w));
        tf::backward(loss);
        std::vector<std::vector<real>> out = {y.to_vector()};
        for (Tensor& x : xs) out.emplace_back(x.grad(), x.grad() + x.numel());
        return out;
    };
    const real p = 0.3f;
    SECTION("relu_dropout") {
        tf::Rng a(11, 5), b(11, 5);
        const auto fused = grads_of({random(1)}, [&](auto& x, tf::Rng& r) { return tf::relu_dropout(x[0], p, r); }, a);
        const auto split = grads_of({random(1)}, [&](auto& x, tf::Rng& r) { return tf::dropout(tf::relu(x[0]), p, r); }, b);
        CHECK(fused == split);  // float ==: the same values (a zero may differ in sign)
        CHECK(a.offset == b.offset);
        const auto& y = fused[0];
        const auto zeros = std::count(y.begin(), y.end(), real(0));
        CHECK(zeros > 0.55 * double(y.size()));  // about half negative, then 30% of the rest dropped
    }
    SECTION("affine_relu_dropout") {
        // x (8, 64, 96) Wᵀ (96, 260) + b: the output has the shape above
        const std::vector<Tensor> in{tf::random_tensor({8, 64, 96}, 3, -1, 1, false),
                                     tf::random_tensor({260, 96}, 4, -0.2f, 0.2f, false),
                                     tf::random_tensor({260}, 5, -0.5f, 0.5f, false)};
        tf::Rng a(11, 5), b(11, 5);
        const auto fused = grads_of(in, [&](auto& x, tf::Rng& r) {
            return tf::affine_relu_dropout(x[0], x[1], x[2], p, r);
        }, a);
        const auto split = grads_of(in, [&](auto& x, tf::Rng& r) {
            return tf::relu_dropout(tf::affine(x[0], x[1], x[2]), p, r);
        }, b);
        REQUIRE(fused.size() == 4);
        for (std::size_t k = 0; k < fused.size(); ++k) {
            INFO("output 0, gradients of x, W, b: " << k);
            CHECK(fused[k] == split[k]);
        }
        CHECK(a.offset == b.offset);
        const auto& y = fused[0];
        const auto zeros = std::count(y.begin(), y.end(), real(0));
        CHECK(zeros > 0.55 * double(y.size()));
        CHECK(zeros < 0.8 * double(y.size()));
    }
    SECTION("add_dropout_layer_norm") {
        tf::Rng a(11, 5), b(11, 5);
        const auto fused = grads_of({random(1), random(2)}, [&](auto& x, tf::Rng& r) {
            return tf::add_dropout_layer_norm(x[0], x[1], p, r, gamma, beta);
        }, a);
        const auto split = grads_of({random(1), random(2)}, [&](auto& x, tf::Rng& r) {
            return tf::add_layer_norm(x[0], tf::dropout(x[1], p, r), gamma, beta);
        }, b);
        REQUIRE(fused.size() == split.size());
        for (std::size_t k = 0; k < fused.size(); ++k) {
            INFO("output 0, gradients of the inputs 1, 2: " << k);
            CHECK(fused[k] == split[k]);
        }
        CHECK(a.offset == b.offset);
    }
    SECTION("add_dropout_layer_norm with its inputs' values and its output's dropped: the output computed again to "
            "the bit, the same gradients") {
        tf::Rng a(11, 5), b(11, 5);
        const auto kept = grads_of({random(1), random(2)}, [&](auto& x, tf::Rng& r) {
            return tf::add_dropout_layer_norm(x[0], x[1], p, r, gamma, beta);
        }, a);
        const auto dropped = grads_of({random(1), random(2)}, [&](auto& x, tf::Rng& r) {
            Tensor in = tf::scale(x[0], 1), residual = tf::scale(x[1], 1);  // ops' outputs, as in a sublayer
            Tensor y = tf::add_dropout_layer_norm(in, residual, p, r, gamma, beta);
            REQUIRE(y.recomputable());
            // Nothing can compute the inputs again: the norm's backward must not read them (a read would throw).
            for (Tensor* t : {&in, &residual, &y}) t->drop_values();
            return y;  // the loss's forward reads y: computed again from the sum the record kept
        }, b);
        REQUIRE(kept.size() == dropped.size());
        for (std::size_t k = 0; k < kept.size(); ++k) {
            INFO("output 0, gradients of the inputs 1, 2: " << k);
            CHECK(kept[k] == dropped[k]);
        }
    }
    SECTION("without training or with p = 0 they are the plain ops") {
        tf::Rng a(11, 5);
        const Tensor x = random(1), r = random(2);
        CHECK(tf::relu_dropout(x, p, a, false).to_vector() == tf::relu(x).to_vector());
        CHECK(tf::add_dropout_layer_norm(x, r, 0, a, gamma, beta).to_vector() == tf::add_layer_norm(x, r, gamma, beta).to_vector());
        CHECK(a.offset == 5);
        CHECK_THROWS_WITH(tf::relu_dropout(x, 1, a), Catch::Contains("probability must be in [0, 1)"));
    }
}
