// Gradient checks of compositions of primitive ops, in float64: the pieces a Transformer is built from
// (attention, a normalised projection, the loss of a projection) have no backward code of their own,
// so their gradients are right exactly when the tape chains the primitives' backwards correctly.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/ops.h"

using tf::real;
using tf::Shape;
using tf::Tensor;

static_assert(sizeof(real) == sizeof(double), "the gradient-check tests must be built with TAPEFORMER_F64");

namespace {

const real kInf = std::numeric_limits<real>::infinity();

void require_pass(const tf::GradcheckResult& r) {
    INFO(r.name << " " << r.shapes << ": max abs error " << r.max_abs_error << ", max rel error " << r.max_rel_error
                << ", " << r.checked << " elements");
    CHECK(r.passed);
    CHECK(r.max_rel_error <= 1e-6);
}

// Attention(Q, K, V) = softmax(Q Kᵀ / √D + mask) V.  q: (B, H, T, D), k, v: (B, H, S, D).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
    const real D = real(q.size(-1));
    Tensor scores = tf::scale(tf::matmul(q, k, false, true), real(1) / std::sqrt(D));  // (B, H, T, S)
    Tensor p = tf::softmax(tf::add(scores, mask));                                        // (B, H, T, S)
    return tf::matmul(p, v);                                                              // (B, H, T, D)
}

}  // namespace

TEST_CASE("gradcheck: attention core softmax(Q Kᵀ/√D + mask) V", "[gradcheck]") {
    const std::int64_t B = 2, H = 2, T = 3, S = 4, D = 5;
    // A key padding mask (B, 1, 1, S): the last key of batch row 1 is padding.
    Tensor key_mask = Tensor::zeros({B, 1, 1, S});
    key_mask.data()[S + S - 1] = -kInf;
    require_pass(tf::gradcheck(
        "attention + key padding mask", [key_mask](auto& x) { return attention(x[0], x[1], x[2], key_mask); },
        {tf::random_tensor({B, H, T, D}, 1), tf::random_tensor({B, H, S, D}, 2), tf::random_tensor({B, H, S, D}, 3)}));

    // Causal self-attention (T = S) with the mask passed to softmax itself.
    Tensor causal = Tensor::zeros({T, T});
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t s = t + 1; s < T; ++s) causal.data()[t * T + s] = -kInf;
    require_pass(tf::gradcheck(
        "causal attention",
        [causal](auto& x) {
            Tensor scores = tf::scale(tf::matmul(x[0], x[1], false, true), real(1) / std::sqrt(real(D)));  // (B, H, T, T)
            return tf::matmul(tf::softmax(scores, causal), x[2]);                                         // (B, H, T, D)
        },
        {tf::random_tensor({B, H, T, D}, 4), tf::random_tensor({B, H, T, D}, 5), tf::random_tensor({B, H, T, D}, 6)}));
}

TEST_CASE("gradcheck: multi-head self-attention from projections, head split and merge", "[gradcheck]") {
    const std::int64_t B = 2, T = 3, H = 2, D = 2, C = H * D;
    Tensor no_mask = Tensor::zeros({1, 1, 1, T});
    auto mha = [=](auto& x) {
        // x[0]: (B, T, C); x[1..4]: Wq, Wk, Wv, Wo (C, C), applied as x Wᵀ.
        auto heads = [&](const Tensor& w) {                                    // (B, T, C) → (B, H, T, D)
            Tensor y = tf::matmul(x[0], w, false, true);                       // (B, T, C)
            return tf::permute(tf::reshape(y, {B, T, H, D}), {0, 2, 1, 3});    // (B, H, T, D)
        };
        Tensor o = attention(heads(x[1]), heads(x[2]), heads(x[3]), no_mask);   // (B, H, T, D)
        Tensor merged = tf::reshape(tf::permute(o, {0, 2, 1, 3}), {B, T, C});  // (B, T, C)
        return tf::matmul(merged, x[4], false, true);                          // (B, T, C)
    };
    require_pass(tf::gradcheck("multi-head self-attention", mha,
                               {tf::random_tensor({B, T, C}, 10), tf::random_tensor({C, C}, 11), tf::random_tensor({C, C}, 12),
                                tf::random_tensor({C, C}, 13), tf::random_tensor({C, C}, 14)}));
}

TEST_CASE("gradcheck: layer_norm of a matmul", "[gradcheck]") {
    // LayerNorm(x Wᵀ + b): x (B=2, T=3, C=5), W (6, 5), b, gamma, beta (6).
    require_pass(tf::gradcheck(
        "layer_norm(x W^T + b)",
        [](auto& x) { return tf::layer_norm(tf::add(tf::matmul(x[0], x[1], false, true), x[2]), x[3], x[4]); },
        {tf::random_tensor({2, 3, 5}, 20), tf::random_tensor({6, 5}, 21), tf::random_tensor({6}, 22),
         tf::random_tensor({6}, 23, 0.5, 1.5), tf::random_tensor({6}, 24)}));
}

TEST_CASE("gradcheck: cross_entropy of a matmul with label smoothing", "[gradcheck]") {
    // logits = h Wᵀ (N=6, V=7) from h (B=2, T=3, C=4) flattened; target 0 is padding (ignored).
    const std::vector<std::int32_t> target = {3, 0, 6, 1, 1, 0};
    require_pass(tf::gradcheck(
        "cross_entropy(h W^T), eps 0.1, ignore 0",
        [target](auto& x) {
            Tensor logits = tf::matmul(tf::reshape(x[0], {6, 4}), x[1], false, true);  // (N, V)
            return tf::cross_entropy(logits, target, 0, real(0.1));
        },
        {tf::random_tensor({2, 3, 4}, 30, -2, 2), tf::random_tensor({7, 4}, 31, -2, 2)}));
}

TEST_CASE("gradcheck: the fused cross_entropy equals its composition from primitives", "[gradcheck]") {
    // loss = 1/n Σ_i Σ_j w_ij (−log_softmax(x)_ij),  w_ij = (1−ε)[j = t_i] + ε/V: the same value and the
    // same gradient as the fused op, which never stores the softmax.
    const std::vector<std::int32_t> target = {2, 4, -1, 0};  // row 2 is ignored
    const std::int64_t N = 4, V = 5;
    const real eps = real(0.1);
    Tensor w = Tensor::zeros({N, V});
    for (std::int64_t i = 0; i < N; ++i) {
        if (target[i] < 0) continue;  // an ignored row has weight 0
        for (std::int64_t j = 0; j < V; ++j) w.data()[i * V + j] = eps / real(V) + (j == target[i] ? 1 - eps : 0);
    }
    auto composed = [&](const Tensor& x) { return tf::scale(tf::sum_all(tf::mul(tf::log_softmax(x), w)), real(-1.0 / 3)); };
    require_pass(tf::gradcheck("composed cross_entropy", [&](auto& x) { return composed(x[0]); },
                               {tf::random_tensor({N, V}, 32, -2, 2)}));

    Tensor x1 = tf::random_tensor({N, V}, 33, -2, 2), x2 = x1.clone();
    x2.set_requires_grad();
    tf::tape().clear();
    Tensor fused = tf::cross_entropy(x1, target, -1, eps);
    tf::backward(fused);  // one forward and backward at a time: backward clears the tape
    Tensor reference = composed(x2);
    tf::backward(reference);
    CHECK(fused.item() == Approx(reference.item()).epsilon(1e-12));
    const std::vector<real> g1 = x1.grad_vector(), g2 = x2.grad_vector();
    for (std::size_t i = 0; i < g1.size(); ++i) {
        INFO("element " << i);
        CHECK(g1[i] == Approx(g2[i]).epsilon(1e-12).margin(1e-14));
    }
    for (std::int64_t j = 0; j < V; ++j) CHECK(g1[2 * V + j] == 0);  // the ignored row
}

TEST_CASE("gradcheck: a tensor used twice in a composition", "[gradcheck]") {
    // A residual: x + LayerNorm(x) — x reaches the output along two paths.
    require_pass(tf::gradcheck(
        "x + layer_norm(x)", [](auto& x) { return tf::add(x[0], tf::layer_norm(x[0], x[1], x[2])); },
        {tf::random_tensor({3, 4}, 40), tf::random_tensor({4}, 41, 0.5, 1.5), tf::random_tensor({4}, 42)}));
    // A Gram matrix: x on both sides of one matmul.
    require_pass(tf::gradcheck("x x^T", [](auto& x) { return tf::matmul(x[0], x[0], false, true); },
                               {tf::random_tensor({2, 3, 4}, 43)}));
    // x gates its own softmax, and is used again through a reshape view.
    require_pass(tf::gradcheck(
        "x * softmax(x) + sum(view of x)",
        [](auto& x) {
            Tensor gated = tf::mul(x[0], tf::softmax(x[0]));        // (2, 6)
            Tensor rows = tf::sum(tf::reshape(x[0], {2, 2, 3}), -1);  // (2, 2)
            return tf::concat_last({gated, rows});                 // (2, 8)
        },
        {tf::random_tensor({2, 6}, 44)}));
}

TEST_CASE("gradcheck: a feed-forward block with dropout", "[gradcheck]") {
    // FFN(x) = dropout(gelu(x W1ᵀ + b1)) W2ᵀ + b2; the dropout mask comes from a fresh Rng on each call.
    require_pass(tf::gradcheck(
        "feed-forward with dropout",
        [](auto& x) {
            tf::Rng rng(99);
            Tensor h = tf::gelu(tf::add(tf::matmul(x[0], x[1], false, true), x[2]));  // (B, T, F)
            h = tf::dropout(h, real(0.25), rng);
            return tf::add(tf::matmul(h, x[3], false, true), x[4]);  // (B, T, C)
        },
        {tf::random_tensor({2, 3, 4}, 50), tf::random_tensor({8, 4}, 51), tf::random_tensor({8}, 52),
         tf::random_tensor({4, 8}, 53), tf::random_tensor({4}, 54)}));
}
