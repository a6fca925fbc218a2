// The fused multi-head attention (one (3C, C) in-projection, heads as a batch axis) and the per-head
// "theory" form (separate W_qʰ, W_kʰ, W_vʰ, heads concatenated) are the same function: loaded with the
// slices of the fused weights, the per-head form gives the same outputs and the same gradients.
#include <catch2/catch.hpp>

#include <cmath>

#include "tapeformer/autograd.h"
#include "tapeformer/gradcheck.h"
#include "tapeformer/nn/attention.h"
#include "tapeformer/ops.h"

using namespace tf;

namespace {

double max_abs_diff(const real* a, const real* b, std::int64_t n) {
    double d = 0;
    for (std::int64_t i = 0; i < n; ++i) d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    return d;
}

void compare(bool cross, const Tensor& mask, std::int64_t Tq, std::int64_t Tk) {
    const std::int64_t B = 2, C = 12, H = 3, D = 4;
    MultiHeadAttention fused(C, H, 0);
    Rng rng(11);
    fused.init(rng);
    init_uniform(fused.in_proj_bias, rng, 0.5);  // non-zero biases, so their slices are tested too
    init_uniform(fused.out_proj.bias, rng, 0.5);
    fused.gate.data()[1] = 0.5;                  // a non-trivial head gate
    PerHeadAttention per_head(C, H);
    per_head.load_from(fused);

    Tensor xq = random_tensor({B, Tq, C}, 1);
    Tensor xkv = cross ? random_tensor({B, Tk, C}, 2) : xq;
    Tensor r = random_tensor({B, Tq, C}, 3, -1, 1, false);  // upstream gradient

    Tensor y1 = fused.forward(xq, xkv, mask, Pass{});
    std::vector<real> up = r.to_vector();
    backward(y1, up);
    const std::vector<real> dxq1 = xq.grad_vector(), dxkv1 = xkv.grad_vector();
    xq.zero_grad();
    xkv.zero_grad();

    Tensor y2 = per_head.forward(xq, xkv, mask);
    backward(y2, up);
    CHECK(max_abs_diff(y1.data(), y2.data(), y1.numel()) < 1e-12);
    CHECK(max_abs_diff(dxq1.data(), xq.grad(), xq.numel()) < 1e-12);
    if (cross) CHECK(max_abs_diff(dxkv1.data(), xkv.grad(), xkv.numel()) < 1e-12);

    // The per-head weight gradients are the slices of the fused gradient.
    for (std::int64_t h = 0; h < H; ++h) {
        INFO("head " << h);
        const real* dW = fused.in_proj_weight.grad();
        const real* db = fused.in_proj_bias.grad();
        CHECK(max_abs_diff(dW + (h * D) * C, per_head.wq[h].weight.grad(), D * C) < 1e-12);
        CHECK(max_abs_diff(dW + (C + h * D) * C, per_head.wk[h].weight.grad(), D * C) < 1e-12);
        CHECK(max_abs_diff(dW + (2 * C + h * D) * C, per_head.wv[h].weight.grad(), D * C) < 1e-12);
        CHECK(max_abs_diff(db + h * D, per_head.wq[h].bias.grad(), D) < 1e-12);
        CHECK(max_abs_diff(db + 2 * C + h * D, per_head.wv[h].bias.grad(), D) < 1e-12);
    }
    CHECK(max_abs_diff(fused.out_proj.weight.grad(), per_head.out_proj.weight.grad(), C * C) < 1e-12);
    // A non-zero gradient was compared (the test would pass vacuously on all-zero gradients).
    CHECK(std::fabs(per_head.wq[0].weight.grad()[0]) > 0);
}

}  // namespace

TEST_CASE("fused and per-head attention agree: self-attention with key padding", "[attention]") {
    const std::vector<std::int32_t> ids = {4, 5, 6, 7, 2, 8, 9, 2, 0, 0};
    compare(false, key_padding_mask(ids, 2, 5, 0), 5, 5);
}

TEST_CASE("fused and per-head attention agree: causal self-attention", "[attention]") {
    const std::vector<std::int32_t> ids = {1, 5, 6, 7, 1, 8, 0, 0};
    compare(false, causal_padding_mask(ids, 2, 4, 0), 4, 4);
}

TEST_CASE("fused and per-head attention agree: cross-attention", "[attention]") {
    const std::vector<std::int32_t> src = {4, 5, 6, 2, 0, 8, 2, 0, 0, 0};
    compare(true, key_padding_mask(src, 2, 5, 0), 3, 5);
}

// Decoding feeds one position at a time through a key/value cache; in float64 the outputs are those of
// the whole sequence at once (the causal mask for self-attention), to rounding.
TEST_CASE("attention with a key/value cache, one position at a time, is the same function", "[attention]") {
    const std::int64_t B = 2, T = 18, S = 5, C = 12, H = 3;  // T > 16: the self-attention cache grows once
    MultiHeadAttention attn(C, H, 0);
    Rng rng(13);
    attn.init(rng);
    init_uniform(attn.in_proj_bias, rng, 0.5);
    attn.gate.data()[2] = 0.5;
    NoGradGuard no_grad;
    const Tensor x = random_tensor({B, T, C}, 4, -1, 1, false);
    const Tensor memory = random_tensor({B, S, C}, 5, -1, 1, false);
    const std::vector<std::int32_t> src = {4, 5, 6, 2, 0, 8, 2, 0, 0, 0};
    const Tensor memory_mask = key_padding_mask(src, B, S, 0);
    const Tensor self_full = attn.forward(x, x, causal_mask(T), Pass{});               // (B, T, C)
    const Tensor cross_full = attn.forward(x, memory, memory_mask, Pass{});            // (B, T, C)
    KVCache self_cache, cross_cache;
    double self_err = 0, cross_err = 0;
    for (std::int64_t t = 0; t < T; ++t) {
        Tensor xt = Tensor::empty({B, 1, C});  // position t of every row
        for (std::int64_t b = 0; b < B; ++b)
            std::copy(x.data() + (b * T + t) * C, x.data() + (b * T + t + 1) * C, xt.data() + b * C);
        const Tensor self_t = attn.forward(xt, xt, Tensor(), Pass{}, &self_cache);             // (B, 1, C)
        const Tensor cross_t = attn.forward(xt, memory, memory_mask, Pass{}, &cross_cache);  // (B, 1, C)
        for (std::int64_t b = 0; b < B; ++b) {
            self_err = std::max(self_err, max_abs_diff(self_t.data() + b * C, self_full.data() + (b * T + t) * C, C));
            cross_err = std::max(cross_err, max_abs_diff(cross_t.data() + b * C, cross_full.data() + (b * T + t) * C, C));
        }
    }
    CHECK(self_err < 1e-12);
    CHECK(cross_err < 1e-12);
    CHECK(self_cache.length == T);
    CHECK(self_cache.capacity() == 32);
}
