// Local (sliding-window) attention as one op that never builds a T×T matrix: query i sees the keys
// j = i − W + 1 + s for the band's slots s ∈ [0, band), band = W causal (j ≤ i) or 2W − 1 (|i − j| < W).
// Scores, weights and their gradients are (B, H, T, band): time and memory O(T·W·D), not O(T²). Its plain
// form, the composition over the full (T, T) scores under a band mask, is reference::band_attention
// (reference_ops.cpp); the two are tested equal (tests/test_efficient_attention.cpp).
#include "tapeformer/ops.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops_kernels.h"
#include "tapeformer/reference_ops.h"

TF_NAMESPACE_BEGIN

namespace {
const real kNegInf = -std::numeric_limits<real>::infinity();
}  // namespace

std::int64_t band_width(std::int64_t W, bool causal) { return causal ? W : 2 * W - 1; }

Tensor band_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask, std::int64_t W,
                      bool causal, real scale, real p, Rng& rng, bool training) {
    const char* op = "band_attention";
    require_defined(op, q, "q");
    require_defined(op, k, "k");
    require_defined(op, v, "v");
    if (q.rank() != 4 || k.shape() != q.shape() || v.shape() != q.shape())
        fail(op, "q, k, v must be the same (B, H, T, D), got " + q.shape().str() + ", " + k.shape().str() + ", " +
                     v.shape().str());
    if (W < 1) fail(op, "window must be >= 1, got " + std::to_string(W));
    const std::int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
    if (key_mask.defined() && (key_mask.rank() != 4 || key_mask.size(0) != B || key_mask.size(1) != 1 ||
                               key_mask.size(2) != 1 || key_mask.size(3) != T))
        fail(op, "key mask must be (B, 1, 1, T) = (" + std::to_string(B) + ", 1, 1, " + std::to_string(T) + "), got " +
                     key_mask.shape().str());
    check_dropout_probability(op, p);
    if (reference_mode()) return reference::band_attention(q, k, v, key_mask, W, causal, scale, p, rng, training);

    const std::int64_t L = band_width(W, causal);  // the band's slots; key j = i − W + 1 + s
    const DropoutDraws draws = training && p > 0 ? DropoutDraws(rng, B * H * T * L, p) : DropoutDraws();
    const bool drop = training && p > 0;
    Tensor weights = Tensor::empty({B, H, T, L});  // (B, H, T, band): softmax over the band, before dropout
    Tensor out = Tensor::zeros({B, H, T, D});      // (B, H, T, D)
    const real *pq = q.data(), *pk = k.data(), *pv = v.data(), *pm = key_mask.defined() ? key_mask.data() : nullptr;
    real *pw = weights.data(), *po = out.data();
    const std::int64_t work = B * H * T * L * D;
    // s_is = q_i·k_j·scale + mask_j (−∞ outside [0, T)), w_i = softmax(s_i), out_i = Σ_s drop(w_is) v_j
#pragma omp parallel for schedule(static) if (work >= kParallelGrain && B * H > 1)
    for (std::int64_t bh = 0; bh < B * H; ++bh) {
        const std::int64_t b = bh / H, at = bh * T * D;
        for (std::int64_t i = 0; i < T; ++i) {
            real* w = pw + (bh * T + i) * L;  // (band)
            for (std::int64_t s = 0; s < L; ++s) {
                const std::int64_t j = i - W + 1 + s;
                if (j < 0 || j >= T) { w[s] = kNegInf; continue; }
                real dot = 0;
                for (std::int64_t d = 0; d < D; ++d) dot += pq[at + i * D + d] * pk[at + j * D + d];
                w[s] = dot * scale + (pm ? pm[b * T + j] : real(0));
            }
            softmax_row(w, nullptr, 0, L, w);  // an all-masked row gives zeros, as softmax does
            real* o = po + at + i * D;
            for (std::int64_t s = 0; s < L; ++s) {
                const std::int64_t j = i - W + 1 + s;
                const real ws = drop ? draws.apply((bh * T + i) * L + s, w[s]) : w[s];
                if (ws == 0) continue;  // out of range, masked or dropped
                for (std::int64_t d = 0; d < D; ++d) o[d] += ws * pv[at + j * D + d];
            }
        }
    }
    if (!needs_grad({&q, &k, &v})) return out;
    // Backward, with u = drop(w) and g = ∂L/∂out_i:
    //   ∂L/∂v_j += u_is g_i;  ∂L/∂u_is = g_i·v_j;  ∂L/∂w_is = drop(∂L/∂u_is) (the same mask and 1/(1−p));
    //   ∂L/∂s_is = w_is (∂L/∂w_is − Σ_s' w_is' ∂L/∂w_is')  (softmax);  ∂L/∂q_i += scale Σ_s ∂L/∂s_is k_j;
    //   ∂L/∂k_j += scale ∂L/∂s_is q_i.
    return record(op, out, {q, k, v}, [weights, draws, drop, B, H, T, D, W, L, scale](Tensor& y, std::vector<Tensor>& in) {
        const real *g = y.grad(), *pq = in[0].data(), *pk = in[1].data(), *pv = in[2].data(), *pw = weights.data();
        std::vector<real> dq(static_cast<std::size_t>(B * H * T * D), 0), dk(dq.size(), 0), dv(dq.size(), 0);
#pragma omp parallel for schedule(static) if (B * H * T * L * D >= kParallelGrain && B * H > 1)
        for (std::int64_t bh = 0; bh < B * H; ++bh) {
            const std::int64_t at = bh * T * D;
            std::vector<real> dw(static_cast<std::size_t>(L));  // (band)
            for (std::int64_t i = 0; i < T; ++i) {
                const real* w = pw + (bh * T + i) * L;
                const real* gi = g + at + i * D;
                for (std::int64_t s = 0; s < L; ++s) {
                    const std::int64_t j = i - W + 1 + s;
                    dw[s] = 0;
                    if (j < 0 || j >= T || w[s] == 0) continue;
                    const std::int64_t n = (bh * T + i) * L + s;
                    const real u = drop ? draws.apply(n, w[s]) : w[s];
                    real du = 0;
                    for (std::int64_t d = 0; d < D; ++d) {
                        du += gi[d] * pv[at + j * D + d];
                        dv[at + j * D + d] += u * gi[d];
                    }
                    dw[s] = drop ? draws.apply(n, du) : du;
                }
                real dot = 0;
                for (std::int64_t s = 0; s < L; ++s) dot += dw[s] * w[s];
                for (std::int64_t s = 0; s < L; ++s) {
                    const std::int64_t j = i - W + 1 + s;
                    if (j < 0 || j >= T || w[s] == 0) continue;
                    const real ds = w[s] * (dw[s] - dot) * scale;
                    for (std::int64_t d = 0; d < D; ++d) {
                        dq[at + i * D + d] += ds * pk[at + j * D + d];
                        dk[at + j * D + d] += ds * pq[at + i * D + d];
                    }
                }
            }
        }
        const std::int64_t n = B * H * T * D;
        const real *a = dq.data(), *b = dk.data(), *c = dv.data();
        if (in[0].requires_grad()) write_or_add(in[0].grad_target(), n, [=](std::int64_t x) { return a[x]; });
        if (in[1].requires_grad()) write_or_add(in[1].grad_target(), n, [=](std::int64_t x) { return b[x]; });
        if (in[2].requires_grad()) write_or_add(in[2].grad_target(), n, [=](std::int64_t x) { return c[x]; });
    });
}

TF_NAMESPACE_END
