// The tape (autograd.h): accumulation of gradients, the life of the tape around backward(), no_grad
// scopes and the errors a user can run into.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/ops.h"

using tf::real;
using tf::Shape;
using tf::Tensor;

namespace {

Tensor leaf(const std::vector<real>& values, const Shape& shape) {
    Tensor t = Tensor::from(values, shape);
    t.set_requires_grad();
    return t;
}

}  // namespace

TEST_CASE("autograd: a tensor used twice gets the sum of both gradients", "[autograd]") {
    tf::tape().clear();
    Tensor x = leaf({-2, 0.5, 3}, {3});
    Tensor y = tf::sum_all(tf::add(tf::mul(x, x), x));  // y = Σ x² + x  →  dy/dx = 2x + 1
    tf::backward(y);
    CHECK(y.item() == Approx((4 - 2) + (0.25 + 0.5) + (9 + 3)));
    const std::vector<real> g = x.grad_vector();
    CHECK(g[0] == Approx(-3));
    CHECK(g[1] == Approx(2));
    CHECK(g[2] == Approx(7));
}

TEST_CASE("autograd: a tensor used on both sides of one op and again later", "[autograd]") {
    tf::tape().clear();
    Tensor x = leaf({1, 2}, {2});
    Tensor sq = tf::mul(x, x);                     // x²
    Tensor y = tf::sum_all(tf::mul(sq, x));        // Σ x³  →  3x²
    tf::backward(y);
    CHECK(x.grad_vector()[0] == Approx(3));
    CHECK(x.grad_vector()[1] == Approx(12));
}

TEST_CASE("autograd: gradients accumulate across backward calls until zero_grad", "[autograd]") {
    tf::tape().clear();
    Tensor x = leaf({1, -1, 2}, {3});
    Tensor w = leaf({3, 4, 5}, {3});
    auto step = [&] {
        Tensor loss = tf::sum_all(tf::mul(x, w));  // d/dx = w, d/dw = x
        tf::backward(loss);
    };
    step();
    CHECK(x.grad_vector() == std::vector<real>{3, 4, 5});
    step();
    CHECK(x.grad_vector() == std::vector<real>{6, 8, 10});
    CHECK(w.grad_vector() == std::vector<real>{2, -2, 4});
    x.zero_grad();
    w.zero_grad();
    CHECK(x.grad_vector() == std::vector<real>(3, real(0)));
    step();
    CHECK(x.grad_vector() == std::vector<real>{3, 4, 5});
    CHECK(w.grad_vector() == std::vector<real>{1, -1, 2});
}

TEST_CASE("autograd: leaves keep .grad, the tape is cleared but keeps its capacity", "[autograd]") {
    tf::tape().clear();
    Tensor x = leaf({0.5, 1.5, -2, 1}, {2, 2});
    Tensor y = tf::sum_all(tf::relu(tf::scale(x, real(2))));  // 2·relu(x)'s mask: {2, 2, 0, 2}
    const std::size_t recorded = tf::tape().records().size();
    CHECK(recorded == 3);  // scale, relu, sum_all
    CHECK(x.is_leaf());
    CHECK_FALSE(y.is_leaf());
    CHECK(y.requires_grad());
    CHECK(std::string(tf::tape().records().back().op) == "sum_all");

    const std::size_t capacity = tf::tape().records().capacity();
    REQUIRE(capacity >= recorded);
    tf::backward(y);
    CHECK(tf::tape().records().empty());
    CHECK(tf::tape().records().capacity() == capacity);  // cleared, not shrunk
    REQUIRE(x.has_grad());
    CHECK(x.grad_vector() == std::vector<real>{2, 2, 0, 2});

    // The next step records into the same vector without reallocating.
    Tensor y2 = tf::sum_all(tf::relu(tf::scale(x, real(2))));
    CHECK(tf::tape().records().size() == recorded);
    CHECK(tf::tape().records().capacity() == capacity);
    tf::backward(y2, /*keep_tape=*/true);
    CHECK(tf::tape().records().size() == recorded);  // kept on request
    tf::tape().clear();
}

TEST_CASE("autograd: nothing is recorded under NoGradGuard", "[autograd]") {
    tf::tape().clear();
    Tensor x = leaf({1, 2, 3, 4}, {2, 2});
    Tensor w = leaf({1, 0, 0, 1}, {2, 2});
    {
        tf::NoGradGuard no_grad;
        CHECK_FALSE(tf::tape().recording());
        CHECK_FALSE(tf::needs_grad({&x}));
        Tensor h = tf::gelu(tf::matmul(x, w));
        Tensor y = tf::sum_all(tf::softmax(h));
        CHECK(tf::tape().records().empty());
        CHECK_FALSE(h.requires_grad());
        CHECK_FALSE(y.requires_grad());
        CHECK_THROWS_AS(tf::backward(y), std::invalid_argument);  // nothing to differentiate
        {
            tf::NoGradGuard nested;
        }
        CHECK_FALSE(tf::tape().recording());  // the inner scope restores "off", not "on"
    }
    CHECK(tf::tape().recording());
    CHECK(tf::needs_grad({&x}));
    Tensor y = tf::sum_all(tf::matmul(x, w));
    CHECK(y.requires_grad());
    CHECK(tf::tape().records().size() == 2);
    tf::tape().clear();
}

TEST_CASE("autograd: ops on tensors that do not require grad record nothing", "[autograd]") {
    tf::tape().clear();
    Tensor a = Tensor::from({1, 2}, {2});
    Tensor b = Tensor::from({3, 4}, {2});
    Tensor c = tf::mul(a, b);
    CHECK_FALSE(c.requires_grad());
    CHECK(tf::tape().records().empty());
    CHECK_FALSE(tf::needs_grad({&a, &b, nullptr}));
}

TEST_CASE("autograd: backward needs a scalar or an upstream gradient of the output's size", "[autograd]") {
    tf::tape().clear();
    Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
    Tensor y = tf::scale(x, real(3));
    try {
        tf::backward(y);
        FAIL("backward on a (2, 3) output without an upstream gradient did not throw");
    } catch (const std::invalid_argument& e) {
        CHECK_THAT(std::string(e.what()), Catch::Contains("backward") && Catch::Contains("(2, 3)"));
    }
    CHECK_THROWS_AS(tf::backward(y, std::vector<real>{1, 1}), std::invalid_argument);
    CHECK_FALSE(x.has_grad());  // the failed calls changed nothing

    tf::backward(y, std::vector<real>{1, 0, -1, 2, 0, 0.5});
    CHECK(x.grad_vector() == std::vector<real>{3, 0, -3, 6, 0, 1.5});
}

TEST_CASE("autograd: gradients flow through a chain of reshape views", "[autograd]") {
    tf::tape().clear();
    // (B=2, T=3, C=2) → (N=6, C=2) → matmul → (2, 3, 1) → (6): reshape records nothing, yet the gradient
    // lands in the original buffers because views share them.
    Tensor x = leaf({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});
    Tensor w = leaf({0.5, -1}, {2, 1});
    Tensor flat = tf::reshape(x, {-1, 2});                         // (6, 2)
    Tensor h = tf::matmul(flat, w);                                // (6, 1)
    Tensor h3 = tf::reshape(h, {2, 3, 1});                         // (2, 3, 1)
    Tensor gate = Tensor::from({1, 2, 3}, {3, 1});                 // broadcast over B
    Tensor y = tf::sum_all(tf::reshape(tf::mul(h3, gate), {6}));   // Σ_b,t gate_t · (x_bt · w)
    CHECK(tf::tape().records().size() == 3);                       // matmul, mul, sum_all
    tf::backward(y);
    // dy/dx_btc = gate_t · w_c;  dy/dw_c = Σ_bt gate_t · x_btc
    CHECK(x.grad_vector() == std::vector<real>{0.5, -1, 1, -2, 1.5, -3, 0.5, -1, 1, -2, 1.5, -3});
    CHECK(w.grad_vector()[0] == Approx(1 * 1 + 2 * 3 + 3 * 5 + 1 * 7 + 2 * 9 + 3 * 11));
    CHECK(w.grad_vector()[1] == Approx(1 * 2 + 2 * 4 + 3 * 6 + 1 * 8 + 2 * 10 + 3 * 12));
    CHECK(flat.grad_vector() == x.grad_vector());  // the same buffer seen through the view
}

TEST_CASE("autograd: record() attaches a custom backward", "[autograd]") {
    tf::tape().clear();
    Tensor x = leaf({1, 2, 3}, {3});
    // cube(x) = x³ as a hand-written op, its backward right after the forward.
    Tensor out = Tensor::empty(x.shape());
    for (int i = 0; i < 3; ++i) out.data()[i] = x.data()[i] * x.data()[i] * x.data()[i];
    out = tf::record("cube", out, {x}, [](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        const real* v = in[0].data();
        real* dx = in[0].grad();
        for (int i = 0; i < 3; ++i) dx[i] += g[i] * 3 * v[i] * v[i];
    });
    CHECK(out.requires_grad());
    CHECK_FALSE(out.is_leaf());
    Tensor y = tf::sum_all(out);
    tf::backward(y);
    CHECK(x.grad_vector() == std::vector<real>{3, 12, 27});
}

TEST_CASE("autograd: the per-record hook sees each backward closure once, in reverse order", "[autograd]") {
    tf::tape().clear();
    Tensor x = leaf({1, 2, 3}, {3});
    Tensor y = tf::sum_all(tf::mul(tf::scale(x, 2), x));  // records: scale, mul, sum_all
    std::vector<std::string> seen;
    std::size_t tape_size_during = 0;
    tf::backward(y, /*keep_tape=*/false, [&](const tf::TapeRecord& r) {
        seen.push_back(r.op);
        CHECK(r.out.defined());  // called before the record is freed
        tape_size_during = tf::tape().records().size();
    });
    REQUIRE(seen.size() == 3);
    CHECK(seen.front() != "scale");
    CHECK(seen.back() == "scale");  // recorded first, so its backward runs last
    CHECK(tape_size_during == 3);
    CHECK(tf::tape().records().empty());
    CHECK(x.grad_vector() == std::vector<real>{4, 8, 12});  // d(2x²)/dx = 4x: the hook changes nothing
}
