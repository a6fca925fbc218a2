// The reference ops: what the fast kernels compute, written the way a textbook writes it. Each op's forward
// loops come first and its backward closure right after, with the equation above the loop that computes it.
// No BLAS, no threads, no vector tricks, no fast exp: read it line by line (docs/usage.md, "Reference
// mode"). The fast ops (ops.cpp, fused_ops.cpp) are tested against these (tests/test_reference_ops.cpp).
//
// Shapes: B batch, S/T lengths, C model width, H heads, D head width, V vocabulary, and for the generic ops
// R rows (all leading axes flattened) by N values.
#include "tapeformer/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "blas_backends.h"
#include "ops_kernels.h"

TF_NAMESPACE_BEGIN

// ---- the switch --------------------------------------------------------------------------------------------

namespace {
bool g_reference = false;
int g_threads_before = 0;  // the thread count when reference mode was switched on
}  // namespace

bool reference_mode() { return g_reference; }

void set_reference_mode(bool on) {
    if (on == g_reference) return;
    if (on) {
        g_threads_before = num_threads();
        g_reference = true;
        set_threads(1);  // one thread: the ops' loops run in order, as written
    } else {
        g_reference = false;
        set_threads(g_threads_before);
    }
}

ReferenceModeScope::ReferenceModeScope(bool on) : previous_(reference_mode()) { set_reference_mode(on); }
ReferenceModeScope::~ReferenceModeScope() { set_reference_mode(previous_); }

namespace reference {

// ---- gemm: the three loops ------------------------------------------------------------------------------
// C[i,j] = α · Σ_k op(A)[i,k] · op(B)[k,j] + β · C[i,j]
// op(A)[i,k] is A[i,k], or A[k,i] when A is stored transposed (trans_a); the same for B.

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
          std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc) {
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
            double acc = 0;  // in double: the reference is more exact than the float kernels it checks
            for (std::int64_t k = 0; k < K; ++k) {
                const real a = ta ? A[k * lda + i] : A[i * lda + k];
                const real b = tb ? B[j * ldb + k] : B[k * ldb + j];
                acc += double(a) * double(b);
            }
            const real c = beta == real(0) ? real(0) : beta * C[i * ldc + j];  // β = 0 ignores what C held
            C[i * ldc + j] = c + alpha * real(acc);
        }
}

// ---- the int8 product (--precision int8) -----------------------------------------------------------------
//   s[r] = max_k |X[r,k]| / 127,   q[r,k] = round(X[r,k] · 127 / max_k |X[r,k]|)  (to nearest even, |q| <= 127)
//   C[m,n] = α · float(Σ_k q_a[m,k] · q_w[n,k]) · (s_a[m] · s_w[n]) + β · C[m,n]     (the sum in int32)

namespace {

// Row r of X (rows, cols), row stride ld -> q[r] (cols) and its scale s[r].
void quantize_rows_plain(const float* X, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         std::vector<std::int8_t>& q, std::vector<float>& s) {
    q.assign(std::size_t(rows * cols), 0);
    s.assign(std::size_t(rows), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r) {
        float amax = 0;
        for (std::int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(X[r * ld + k]));
        if (amax == 0) continue;  // a row of zeros: scale 0, q 0
        const float inv = 127.0f / amax;
        s[r] = amax / 127.0f;
        for (std::int64_t k = 0; k < cols; ++k)
            q[r * cols + k] = std::int8_t(std::max(-127.0f, std::min(127.0f, std::nearbyint(X[r * ld + k] * inv))));
    }
}

}  // namespace

void gemm_int8(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, std::int64_t lda,
               const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    std::vector<std::int8_t> qa, qw;  // (M, K), (N, K)
    std::vector<float> sa, sw;        // (M), (N)
    quantize_rows_plain(A, M, K, lda, qa, sa);
    quantize_rows_plain(B, N, K, ldb, qw, sw);
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
            std::int32_t acc = 0;  // exact: |acc| <= K · 127², below 2^31 for K < 133,000
            for (std::int64_t k = 0; k < K; ++k) acc += std::int32_t(qa[i * K + k]) * std::int32_t(qw[j * K + k]);
            const float r = float(acc) * (sa[i] * sw[j]);
            const float c = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];  // β = 0 ignores what C held
            C[i * ldc + j] = c + alpha * r;
        }
}

// ---- matmul ----------------------------------------------------------------------------------------------
// C = α · op(A) · op(B), one product per leading index (batch), or one 2-D B shared by every row of A.
// With dC the upstream gradient:   d op(A) = α · dC · op(B)ᵀ,   d op(B) = α · op(A)ᵀ · dC.

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, real alpha) {
    const bool shared_b = b.rank() == 2 && a.rank() > 2;  // a (..., K) seen as one (rows, K) matrix
    const std::int64_t M = shared_b ? a.shape().leading() : (ta ? a.size(-1) : a.size(-2));
    const std::int64_t K = ta ? a.size(-2) : a.size(-1);
    const std::int64_t N = tb ? b.size(-2) : b.size(-1);
    const std::int64_t batch = shared_b ? 1 : a.numel() / (a.size(-2) * a.size(-1));
    Shape out_shape = a.shape();
    if (!shared_b) out_shape[-2] = M;
    out_shape[-1] = N;
    Tensor out = Tensor::empty(out_shape);                  // (..., M, N)
    const std::int64_t lda = a.size(-1), ldb = b.size(-1);  // row strides as stored
    // where product e starts in a, b and the output
    const std::int64_t a_step = shared_b ? 0 : M * K, b_step = shared_b ? 0 : K * N, c_step = M * N;
    for (std::int64_t e = 0; e < batch; ++e) {  // C_e (M, N) = α · op(A_e) (M, K) · op(B_e) (K, N)
        const real *A = a.data() + e * a_step, *B = b.data() + e * b_step;
#ifndef TAPEFORMER_F64
        // --precision int8, B a weight held for decoding: the int8 product, as gemm computes it there
        if (held_int8(GemmCall{ta, tb, M, N, K, alpha, A, lda, B, ldb, 0, out.data() + e * c_step, N})) {
            reference::gemm_int8(M, N, K, alpha, A, lda, B, ldb, 0, out.data() + e * c_step, N);
            continue;
        }
#endif
        reference::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0, out.data() + e * c_step, N);
    }
    if (!needs_grad({&a, &b})) return out;
    return record("matmul", out, {a, b}, [=](Tensor& y, std::vector<Tensor>& in) {
        const real* dC = y.grad();  // (..., M, N)
        for (std::int64_t e = 0; e < batch; ++e) {
            const real* A = in[0].data() + e * a_step;
            const real* B = in[1].data() + e * b_step;
            const real* dCe = dC + e * c_step;
            if (in[0].requires_grad()) {
                real* dA = in[0].grad() + e * a_step;
                if (!ta)  // dA (M, K) += α · dC (M, N) · op(B)ᵀ (N, K)
                    reference::gemm(false, !tb, M, K, N, alpha, dCe, N, B, ldb, 1, dA, lda);
                else      // A stored (K, M): dA += (α · dC · op(B)ᵀ)ᵀ = α · op(B) (K, N) · dCᵀ (N, M)
                    reference::gemm(tb, true, K, M, N, alpha, B, ldb, dCe, N, 1, dA, lda);
            }
            if (in[1].requires_grad()) {
                real* dB = in[1].grad() + e * b_step;
                if (!tb)  // dB (K, N) += α · op(A)ᵀ (K, M) · dC (M, N)
                    reference::gemm(!ta, false, K, N, M, alpha, A, lda, dCe, N, 1, dB, ldb);
                else      // B stored (N, K): dB += α · dCᵀ (N, M) · op(A) (M, K)
                    reference::gemm(true, ta, N, K, M, alpha, dCe, N, A, lda, 1, dB, ldb);
            }
        }
    });
}

// ---- softmax ---------------------------------------------------------------------------------------------
// Over the last axis, with the (constant) mask added first:  y_j = e^(x_j − m) / Σ_k e^(x_k − m),
// m = max_k x_k. Subtracting m changes nothing in exact arithmetic (it cancels in the quotient) and keeps
// e^x from overflowing. A row whose every position is −∞ (all masked) gives zeros.
// Backward, with g the upstream gradient:  dx_j = y_j · (g_j − Σ_k g_k · y_k).

Tensor softmax(const Tensor& a, const Tensor& mask) {
    const Tensor x = mask.defined() ? add(a, mask) : a;  // the mask: 0 keeps a position, −∞ drops it
    const std::int64_t N = x.shape().last(), R = x.shape().leading();
    Tensor out = Tensor::empty(x.shape());  // (R, N)
    const real minus_inf = -std::numeric_limits<real>::infinity();
    for (std::int64_t r = 0; r < R; ++r) {
        const real* xr = x.data() + r * N;
        real* yr = out.data() + r * N;
        real m = minus_inf;  // m = max_k x_k
        for (std::int64_t j = 0; j < N; ++j) m = std::max(m, xr[j]);
        if (m == minus_inf) {  // every position masked
            for (std::int64_t j = 0; j < N; ++j) yr[j] = 0;
            continue;
        }
        real total = 0;  // Σ_k e^(x_k − m)
        for (std::int64_t j = 0; j < N; ++j) {
            yr[j] = std::exp(xr[j] - m);
            total += yr[j];
        }
        for (std::int64_t j = 0; j < N; ++j) yr[j] /= total;
    }
    if (!needs_grad({&x})) return out;
    return record("softmax", out, {x}, [N, R](Tensor& y, std::vector<Tensor>& in) {
        const real *g = y.grad(), *p = y.data();
        real* dx = in[0].grad();
        for (std::int64_t r = 0; r < R; ++r) {
            real dot = 0;  // Σ_k g_k · y_k
            for (std::int64_t k = 0; k < N; ++k) dot += g[r * N + k] * p[r * N + k];
            for (std::int64_t j = 0; j < N; ++j) dx[r * N + j] += p[r * N + j] * (g[r * N + j] - dot);
        }
    });
}

// ---- layer_norm ------------------------------------------------------------------------------------------
// Over the last axis C of each row:
//   μ = (1/C) Σ_c x_c,   σ² = (1/C) Σ_c (x_c − μ)²   (biased, as the paper and PyTorch),
//   x̂_c = (x_c − μ) / √(σ² + ε),   y_c = γ_c · x̂_c + β_c.

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, real eps) {
    const std::int64_t C = x.shape().last(), R = x.shape().leading();
    Tensor out = Tensor::empty(x.shape());  // (R, C)
    std::vector<real> mean(R), rstd(R);     // per row: μ and 1/√(σ² + ε), all that backward needs with x
    const real *px = x.data(), *w = gamma.data(), *b = beta.data();
    for (std::int64_t r = 0; r < R; ++r) {
        const real* xr = px + r * C;
        real sum = 0;
        for (std::int64_t c = 0; c < C; ++c) sum += xr[c];
        const real mu = sum / real(C);  // μ
        real sq = 0;
        for (std::int64_t c = 0; c < C; ++c) sq += (xr[c] - mu) * (xr[c] - mu);
        const real var = sq / real(C);                     // σ²
        const real inv_std = real(1) / std::sqrt(var + eps);  // ε inside the square root
        for (std::int64_t c = 0; c < C; ++c) {
            const real xhat = (xr[c] - mu) * inv_std;  // x̂_c
            out.data()[r * C + c] = w[c] * xhat + b[c];  // y_c = γ_c · x̂_c + β_c
        }
        mean[r] = mu;
        rstd[r] = inv_std;
    }
    if (!needs_grad({&x, &gamma, &beta})) return out;
    const BrokenGradient broken = broken_gradient();  // None but under gradcheck/explain --break-grad
    return record("layer_norm", out, {x, gamma, beta}, [R, C, mean, rstd, broken](Tensor& y, std::vector<Tensor>& in) {
        // For one row, with g = dy:
        //   dβ_c += g_c                    (β adds straight through)
        //   dγ_c += g_c · x̂_c              (γ scales x̂)
        //   dx̂_c  = g_c · γ_c
        //   dx_c += rstd · (dx̂_c − mean(dx̂) − x̂_c · mean(dx̂ · x̂))
        // The mean(dx̂) term is the path through μ, the x̂ · mean(dx̂ · x̂) term the path through σ².
        const real *g = y.grad(), *px = in[0].data(), *w = in[1].data();
        real* dx = in[0].requires_grad() ? in[0].grad() : nullptr;
        real* dw = in[1].requires_grad() ? in[1].grad() : nullptr;
        real* db = in[2].requires_grad() ? in[2].grad() : nullptr;
        std::vector<real> xhat(C), dxhat(C);
        for (std::int64_t r = 0; r < R; ++r) {
            const real* gr = g + r * C;
            for (std::int64_t c = 0; c < C; ++c) {
                xhat[c] = (px[r * C + c] - mean[r]) * rstd[r];
                dxhat[c] = gr[c] * w[c];
            }
            if (db)
                for (std::int64_t c = 0; c < C; ++c) db[c] += gr[c];
            if (dw)
                for (std::int64_t c = 0; c < C; ++c) dw[c] += gr[c] * xhat[c];
            if (!dx) continue;
            real mean_dxhat = 0, mean_dxhat_xhat = 0;
            for (std::int64_t c = 0; c < C; ++c) {
                mean_dxhat += dxhat[c];
                mean_dxhat_xhat += dxhat[c] * xhat[c];
            }
            mean_dxhat /= real(C);
            mean_dxhat_xhat /= real(C);
            // A BrokenGradientScope leaves one term out, to show gradcheck failing (ops.h).
            if (broken == BrokenGradient::LayerNormMean) mean_dxhat = 0;
            if (broken == BrokenGradient::LayerNormVariance) mean_dxhat_xhat = 0;
            for (std::int64_t c = 0; c < C; ++c)
                dx[r * C + c] += rstd[r] * (dxhat[c] - mean_dxhat - xhat[c] * mean_dxhat_xhat);
        }
    });
}

// ---- cross_entropy (label-smoothed) ----------------------------------------------------------------------
// For each counted row i (target t_i ≠ ignore_index) of logits x (N, V):
//   lse_i = m + log Σ_j e^(x_ij − m)           (log-sum-exp, m = max_j x_ij)
//   −log p_ij = lse_i − x_ij
//   loss_i = (1 − ε) · (−log p_i,t_i) + ε · (1/V) Σ_j (−log p_ij)
// loss = (1/n) Σ_i loss_i over the n counted rows (0 when n = 0).
// Backward:  dx_ij = g/n · (p_ij − (1 − ε)·[j = t_i] − ε/V),   p_ij = e^(x_ij − lse_i).

Tensor cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& target, std::int32_t ignore_index, real eps,
                     CrossEntropyStats* stats) {
    const std::int64_t N = logits.size(0), V = logits.size(1);
    const real* x = logits.data();
    std::vector<double> lse(N, 0.0);  // (N), kept for backward
    double loss_sum = 0, nll_sum = 0;
    std::int64_t count = 0;
    for (std::int64_t i = 0; i < N; ++i) {
        if (target[i] == ignore_index) continue;
        const real* xi = x + i * V;
        real m = xi[0];
        for (std::int64_t j = 1; j < V; ++j) m = std::max(m, xi[j]);
        double sum_exp = 0, sum_x = 0;
        for (std::int64_t j = 0; j < V; ++j) {
            sum_exp += std::exp(double(xi[j] - m));
            sum_x += xi[j];
        }
        lse[i] = double(m) + std::log(sum_exp);
        const double nll = lse[i] - xi[target[i]];         // −log p_t
        const double smooth = lse[i] - sum_x / double(V);  // (1/V) Σ_j −log p_j
        loss_sum += (1.0 - eps) * nll + eps * smooth;
        nll_sum += nll;
        ++count;
    }
    if (stats) {
        stats->nll_sum = nll_sum;
        stats->count = count;
    }
    Tensor out = Tensor::scalar(count ? real(loss_sum / double(count)) : real(0));  // shape ()
    if (!needs_grad({&logits}) || count == 0) return out;
    auto backward_of_loss = [target, ignore_index, eps, N, V, count, lse](Tensor& y, std::vector<Tensor>& in) {
        const real g = y.grad()[0] / real(count);  // g/n
        const real* x = in[0].data();
        real* dx = in[0].grad();
        for (std::int64_t i = 0; i < N; ++i) {
            if (target[i] == ignore_index) continue;  // no gradient
            for (std::int64_t j = 0; j < V; ++j) {
                const real p = real(std::exp(double(x[i * V + j]) - lse[i]));  // p_ij
                const real on_target = j == target[i] ? real(1) - eps : real(0);
                dx[i * V + j] += g * (p - on_target - eps / real(V));
            }
        }
    };
    return record("cross_entropy", out, {logits}, backward_of_loss);
}

// ---- the fused kernels, as the compositions they equal ---------------------------------------------------

// y = x Wᵀ + b: x (..., in), W (out, in), b (out) or undefined.
Tensor affine(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    Tensor y = reference::matmul(x, weight, false, true);  // (..., in) @ (out, in)ᵀ -> (..., out)
    return bias.defined() ? add(y, bias) : y;              // + b on every row
}

// x (B, T, W) -> columns [begin, end) as H heads of D = (end − begin)/H: (B, H, T, D).
Tensor slice_heads(const Tensor& x, std::int64_t begin, std::int64_t end, std::int64_t H) {
    const std::int64_t B = x.size(0), T = x.size(1), D = (end - begin) / H;
    Tensor part = slice_last(x, begin, end);           // (B, T, H·D)
    Tensor heads = reshape(part, Shape{B, T, H, D});   // (B, T, H, D)
    return permute(heads, {0, 2, 1, 3});               // (B, H, T, D)
}

// LN(x + residual): a post-norm sublayer's "Add & Norm".
Tensor add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& gamma, const Tensor& beta, real eps) {
    return reference::layer_norm(add(x, residual), gamma, beta, eps);  // (..., C)
}

// LN(x + dropout(residual)): the same draws from rng as the fused op.
Tensor add_dropout_layer_norm(const Tensor& x, const Tensor& residual, real p, Rng& rng, const Tensor& gamma,
                              const Tensor& beta, real eps, bool training) {
    return reference::layer_norm(add(x, dropout(residual, p, rng, training)), gamma, beta, eps);  // (..., C)
}

// dropout(relu(a)): the feed-forward network's activation.
Tensor relu_dropout(const Tensor& a, real p, Rng& rng, bool training) { return dropout(relu(a), p, rng, training); }

// The feed-forward network's first layer and its activation: relu_dropout(affine(x, W, b)).
Tensor affine_relu_dropout(const Tensor& x, const Tensor& weight, const Tensor& bias, real p, Rng& rng, bool training) {
    return reference::relu_dropout(reference::affine(x, weight, bias), p, rng, training);  // (..., F)
}

// Scaled dot-product attention over H heads (Vaswani et al. 2017, eq. 1), per head:
//   Attention(Q, K, V) = dropout(softmax(Q Kᵀ / √D + mask)) V
// Q: columns [q_at, q_at + H·D) of xq (B, Tq, Wq); K, V: columns [k_at, ...) and [v_at, ...) of xkv (B, Tk, Wkv).
Tensor attention_heads(const Tensor& xq, std::int64_t q_at, const Tensor& xkv, std::int64_t k_at, std::int64_t v_at,
                       std::int64_t H, std::int64_t D, const Tensor& mask, real p, Rng& rng, bool training) {
    const std::int64_t B = xq.size(0), Tq = xq.size(1), C = H * D;
    Tensor q = reference::slice_heads(xq, q_at, q_at + C, H);   // (B, H, Tq, D)
    Tensor k = reference::slice_heads(xkv, k_at, k_at + C, H);  // (B, H, Tk, D)
    Tensor v = reference::slice_heads(xkv, v_at, v_at + C, H);  // (B, H, Tk, D)
    Tensor scores = reference::matmul(q, k, false, true, real(1) / std::sqrt(real(D)));  // Q Kᵀ / √D: (B, H, Tq, Tk)
    Tensor weights = reference::softmax(scores, mask);                          // (B, H, Tq, Tk), rows sum to 1
    Tensor context = reference::matmul(dropout(weights, p, rng, training), v);  // (B, H, Tq, D)
    return reshape(permute(context, {0, 2, 1, 3}), Shape{B, Tq, C});            // heads side by side: (B, Tq, H·D)
}

Tensor band_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask, std::int64_t W,
                      bool causal, real scale, real p, Rng& rng, bool training) {
    const std::int64_t B = q.size(0), H = q.size(1), T = q.size(2), L = band_width(W, causal);
    const real neg_inf = -std::numeric_limits<real>::infinity();
    Tensor mask = Tensor::full({B, 1, T, T}, neg_inf);  // (B, 1, T, T): the key mask inside the band, −∞ outside
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < T; ++i)
            for (std::int64_t j = std::max<std::int64_t>(0, i - W + 1); j < std::min(T, i - W + 1 + L); ++j)
                mask.data()[(b * T + i) * T + j] = key_mask.defined() ? key_mask.data()[b * T + j] : real(0);
    Tensor scores = reference::matmul(q, k, false, true, scale);  // Q Kᵀ·scale: (B, H, T, T)
    Tensor weights = reference::softmax(scores, mask);            // (B, H, T, T), zero outside the band
    if (training && p > 0) {  // band_attention's draws, slot s of row i at column j = i − W + 1 + s
        const DropoutDraws draws(rng, B * H * T * L, p);
        Tensor keep = Tensor::zeros({B, H, T, T});  // (B, H, T, T): 0 or 1/(1−p), a constant
        for (std::int64_t bh = 0; bh < B * H; ++bh)
            for (std::int64_t i = 0; i < T; ++i)
                for (std::int64_t s = 0; s < L; ++s) {
                    const std::int64_t j = i - W + 1 + s;
                    if (j >= 0 && j < T) keep.data()[(bh * T + i) * T + j] = draws.apply((bh * T + i) * L + s, real(1));
                }
        weights = mul(weights, keep);
    }
    return reference::matmul(weights, v);  // (B, H, T, D)
}

}  // namespace reference

TF_NAMESPACE_END
