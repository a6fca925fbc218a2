// The textbook primitives: for each, the forward kernel and, right after it, the backward closure it records.
// Kernels are plain loops over contiguous memory; OpenMP splits their outer loop across threads. The fused
// kernels (each equal to a composition of these) are in fused_ops.cpp, the ops only a head study uses in
// study_ops.cpp; what they share is in ops_kernels.h. In reference mode (reference_ops.h), matmul, softmax,
// layer_norm and cross_entropy check their arguments, then hand the work to their textbook form in
// reference_ops.cpp; the other ops here are plain loops already, and run as they are, on one thread.
#include "tapeformer/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "ops_kernels.h"
#include "tapeformer/reference_ops.h"

TF_NAMESPACE_BEGIN

// ---- add, sub, mul, div, scale ------------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
    return binary<false>("add", a, b, [](real x, real y) { return x + y; },  //
                         [](real, real, real g) { return g; },               // ∂(x+y)/∂x = 1
                         [](real, real, real g) { return g; });              // ∂(x+y)/∂y = 1
}

Tensor sub(const Tensor& a, const Tensor& b) {
    return binary<false>("sub", a, b, [](real x, real y) { return x - y; },  //
                         [](real, real, real g) { return g; },               // ∂(x−y)/∂x = 1
                         [](real, real, real g) { return -g; });             // ∂(x−y)/∂y = −1
}

Tensor mul(const Tensor& a, const Tensor& b) {
    return binary("mul", a, b, [](real x, real y) { return x * y; },  //
                  [](real, real y, real g) { return g * y; },         // ∂(xy)/∂x = y
                  [](real x, real, real g) { return g * x; });        // ∂(xy)/∂y = x
}

Tensor div(const Tensor& a, const Tensor& b) {
    return binary("div", a, b, [](real x, real y) { return x / y; },  //
                  [](real, real y, real g) { return g / y; },         // ∂(x/y)/∂x = 1/y
                  [](real x, real y, real g) { return -g * x / (y * y); });  // ∂(x/y)/∂y = −x/y²
}

Tensor scale(const Tensor& a, real s) {
    require_defined("scale", a, "input");
    Tensor out = Tensor::empty(a.shape());
    const real* x = a.data();
    real* y = out.data();
    const std::int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
    if (!needs_grad({&a})) return out;
    return record("scale", out, {a}, [s](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        write_or_add(in[0].grad_target(), y.numel(), [=](std::int64_t i) { return s * g[i]; });
    });
}

// ---- matmul ----------------------------------------------------------------------------------------------
// C = α·op(A)·op(B). Backward, with dC the upstream gradient (derivation in the comments at each product):
//   d op(A) = α·dC · op(B)ᵀ,   d op(B) = α·op(A)ᵀ · dC.

namespace {

struct MatmulDims {
    std::int64_t batch, M, N, K;
    bool shared_b;  // b is one 2-D matrix used for every row of a
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb, real alpha) {
    require_defined("matmul", a, "first operand");
    require_defined("matmul", b, "second operand");
    const std::string shapes = a.shape().str() + (ta ? "ᵀ" : "") + " @ " + b.shape().str() + (tb ? "ᵀ" : "");
    if (a.rank() < 2 || b.rank() < 2) fail("matmul", "operands need at least 2 axes: " + shapes);
    MatmulDims d;
    d.shared_b = b.rank() == 2 && a.rank() > 2;
    Shape out_shape = a.shape();
    std::int64_t kb;
    if (d.shared_b) {
        if (ta) fail("matmul", "a transposed batched operand cannot share a 2-D second operand: " + shapes);
        d.batch = 1;
        d.M = a.shape().leading();
        d.K = a.shape().last();
    } else {
        if (a.rank() != b.rank()) fail("matmul", "operands need the same number of axes (or a 2-D second one): " + shapes);
        for (int i = 0; i < a.rank() - 2; ++i)
            if (a.shape().dims[i] != b.shape().dims[i]) fail("matmul", "batch axes differ: " + shapes);
        d.batch = a.numel() / (a.size(-1) * a.size(-2));
        d.M = ta ? a.size(-1) : a.size(-2);
        d.K = ta ? a.size(-2) : a.size(-1);
        out_shape[-2] = d.M;
    }
    kb = tb ? b.size(-1) : b.size(-2);
    d.N = tb ? b.size(-2) : b.size(-1);
    if (kb != d.K) fail("matmul", "inner sizes differ (" + std::to_string(d.K) + " vs " + std::to_string(kb) + "): " + shapes);
    out_shape[-1] = d.N;
    if (reference_mode()) return reference::matmul(a, b, ta, tb, alpha);  // three loops (reference_ops.cpp)

    Tensor out = Tensor::empty(out_shape);
    const std::int64_t a_step = d.shared_b ? 0 : d.M * d.K, b_step = d.shared_b ? 0 : d.K * d.N, c_step = d.M * d.N;
    const std::int64_t lda = a.size(-1), ldb = b.size(-1);
    // The batch's products: small ones shared out among the threads, large ones tiled (blas.h).
    gemm_batched(ta, tb, d.batch, d.M, d.N, d.K, alpha, a.data(), lda, a_step, b.data(), ldb, b_step, 0, out.data(), d.N, c_step);
    if (!needs_grad({&a, &b})) return out;
    return record("matmul", out, {a, b}, [d, ta, tb, alpha, a_step, b_step, c_step, lda, ldb](Tensor& y, std::vector<Tensor>& in) {
        const real* dC = y.grad();
        const real *A = in[0].data(), *B = in[1].data();
        // Each product covers the whole of dA (dB), so a gradient not yet written is written (β = 0). The
        // two are independent: one parallel region computes them together (gemm_group).
        GemmCall dA_call, dB_call;  // M = 0: not needed
        if (in[0].requires_grad()) {
            const GradTarget dA = in[0].grad_target();
            if (!ta)  // dA (M,K) += α·dC (M,N) · op(B)ᵀ (N,K)
                dA_call = {false, !tb, d.M, d.K, d.N, alpha, dC, d.N, B, ldb, dA.beta(), dA.data, lda, d.batch, c_step, b_step, a_step};
            else      // A stored (K,M): dA += α·(dC · op(B)ᵀ)ᵀ = α·op(B) (K,N) · dCᵀ (N,M)
                dA_call = {tb, true, d.K, d.M, d.N, alpha, B, ldb, dC, d.N, dA.beta(), dA.data, lda, d.batch, b_step, c_step, a_step};
        }
        if (in[1].requires_grad()) {
            const GradTarget dB = in[1].grad_target();
            if (d.shared_b) {  // one product over all rows: dB += (Σ over rows) — a single large gemm
                if (!tb) dB_call = {true, false, d.K, d.N, d.M, alpha, A, lda, dC, d.N, dB.beta(), dB.data, ldb};   // (K,N) += α·Aᵀ dC
                else     dB_call = {true, false, d.N, d.K, d.M, alpha, dC, d.N, A, lda, dB.beta(), dB.data, ldb};   // (N,K) += α·dCᵀ A
            } else if (!tb) {  // dB (K,N) += α·op(A)ᵀ (K,M) · dC (M,N)
                dB_call = {!ta, false, d.K, d.N, d.M, alpha, A, lda, dC, d.N, dB.beta(), dB.data, ldb, d.batch, a_step, c_step, b_step};
            } else {  // B stored (N,K): dB += α·dCᵀ (N,M) · op(A) (M,K)
                dB_call = {true, ta, d.N, d.K, d.M, alpha, dC, d.N, A, lda, dB.beta(), dB.data, ldb, d.batch, c_step, a_step, b_step};
            }
        }
        if (!in[0].same_storage(in[1])) return gemm_group({dA_call, dB_call});
        gemm_group({dA_call});  // one buffer (a @ a): its two contributions added in turn
        gemm_group({dB_call});
    });
}

// ---- reshape, permute, transpose ------------------------------------------------------------------------

// A view: values and gradient are shared with `a`, so no record is needed — gradients written through
// the view land in a's buffer directly.
Tensor reshape(const Tensor& a, const Shape& shape) {
    require_defined("reshape", a, "input");
    return a.reshape(shape);
}

Tensor permute(const Tensor& a, const std::vector<int>& axes) {
    require_defined("permute", a, "input");
    const int r = a.rank();
    std::string axes_str;
    for (int x : axes) axes_str += (axes_str.empty() ? "" : ", ") + std::to_string(x);
    if (static_cast<int>(axes.size()) != r) fail("permute", "axes {" + axes_str + "} for shape " + a.shape().str());
    std::vector<bool> seen(r, false);
    for (int x : axes) {
        if (x < 0 || x >= r || seen[x]) fail("permute", "axes {" + axes_str + "} are not a permutation for shape " + a.shape().str());
        seen[x] = true;
    }
    Shape out_shape = a.shape();
    for (int i = 0; i < r; ++i) out_shape.dims[i] = a.shape().dims[axes[i]];
    // Pad to four axes: n = output extents, s = the input stride that each output axis walks.
    std::int64_t in_stride[4], n[4] = {1, 1, 1, 1}, s[4] = {0, 0, 0, 0};
    std::int64_t st = 1;
    for (int i = r - 1; i >= 0; --i) { in_stride[i] = st; st *= a.shape().dims[i]; }
    for (int i = 0; i < r; ++i) { n[4 - r + i] = out_shape.dims[i]; s[4 - r + i] = in_stride[axes[i]]; }

    // Visits output element o together with its source offset in the input.
    auto visit = [n, s](auto&& f) {
        const std::int64_t rows = n[0] * n[1] * n[2];
#pragma omp parallel for schedule(static) if (rows * n[3] >= kParallelGrain)
        for (std::int64_t row = 0; row < rows; ++row) {
            std::int64_t i2 = row % n[2], i1 = (row / n[2]) % n[1], i0 = row / (n[2] * n[1]);
            std::int64_t src = i0 * s[0] + i1 * s[1] + i2 * s[2];
            for (std::int64_t j = 0; j < n[3]; ++j) f(row * n[3] + j, src + j * s[3]);
        }
    };
    Tensor out = Tensor::empty(out_shape);
    const real* x = a.data();
    real* y = out.data();
    visit([&](std::int64_t o, std::int64_t i) { y[o] = x[i]; });
    if (!needs_grad({&a})) return out;
    return record("permute", out, {a}, [visit](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        const GradTarget dx = in[0].grad_target();
        visit([&](std::int64_t o, std::int64_t i) { accumulate(dx, i, g[o]); });  // a permutation: one source per element
    });
}

Tensor transpose(const Tensor& a, int i, int j) {
    require_defined("transpose", a, "input");
    const int r = a.rank();
    int ii = i < 0 ? i + r : i, jj = j < 0 ? j + r : j;
    if (ii < 0 || ii >= r || jj < 0 || jj >= r)
        fail("transpose", "axes " + std::to_string(i) + ", " + std::to_string(j) + " out of range for shape " + a.shape().str());
    std::vector<int> axes(r);
    for (int k = 0; k < r; ++k) axes[k] = k;
    std::swap(axes[ii], axes[jj]);
    return permute(a, axes);
}

// ---- concat and slice along the last axis ---------------------------------------------------------------

Tensor concat_last(const std::vector<Tensor>& parts) {
    if (parts.empty()) fail("concat_last", "no tensors to join");
    Shape out_shape = parts[0].shape();
    std::int64_t width = 0;
    std::string shapes;
    for (const Tensor& p : parts) {
        require_defined("concat_last", p, "a part");
        shapes += (shapes.empty() ? "" : ", ") + p.shape().str();
    }
    for (const Tensor& p : parts) {
        Shape s = p.shape();
        if (s.rank != out_shape.rank || s.rank == 0) fail("concat_last", "parts have different ranks: " + shapes);
        for (int i = 0; i + 1 < s.rank; ++i)
            if (s.dims[i] != out_shape.dims[i]) fail("concat_last", "parts differ before the last axis: " + shapes);
        width += s.last();
    }
    out_shape[-1] = width;
    Tensor out = Tensor::empty(out_shape);
    const std::int64_t rows = out_shape.leading();
    std::int64_t col = 0;
    std::vector<std::int64_t> offsets;
    for (const Tensor& p : parts) {
        const std::int64_t w = p.shape().last();
        const real* x = p.data();
        real* y = out.data();
#pragma omp parallel for schedule(static) if (rows * w >= kParallelGrain)
        for (std::int64_t r = 0; r < rows; ++r) std::memcpy(y + r * width + col, x + r * w, w * sizeof(real));
        offsets.push_back(col);
        col += w;
    }
    bool any = false;
    for (const Tensor& p : parts) any = any || needs_grad({&p});
    if (!any) return out;
    return record("concat_last", out, parts, [offsets, width, rows](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        for (std::size_t k = 0; k < in.size(); ++k) {
            if (!in[k].requires_grad()) continue;
            const std::int64_t w = in[k].shape().last(), col = offsets[k];
            const GradTarget dx = in[k].grad_target();
#pragma omp parallel for schedule(static) if (rows * w >= kParallelGrain)
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t j = 0; j < w; ++j) accumulate(dx, r * w + j, g[r * width + col + j]);
        }
    });
}

Tensor slice_last(const Tensor& a, std::int64_t begin, std::int64_t end) {
    require_defined("slice_last", a, "input");
    if (a.rank() == 0) fail("slice_last", "cannot slice a scalar");
    const std::int64_t width = a.shape().last();
    if (begin < 0 || end > width || begin >= end)
        fail("slice_last", "range [" + std::to_string(begin) + ", " + std::to_string(end) + ") is not inside the last axis of " +
                               a.shape().str());
    Shape out_shape = a.shape();
    const std::int64_t w = end - begin, rows = out_shape.leading();
    out_shape[-1] = w;
    Tensor out = Tensor::empty(out_shape);
    const real* x = a.data();
    real* y = out.data();
#pragma omp parallel for schedule(static) if (rows * w >= kParallelGrain)
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(y + r * w, x + r * width + begin, w * sizeof(real));
    if (!needs_grad({&a})) return out;
    return record("slice_last", out, {a}, [begin, w, width, rows](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        real* dx = in[0].grad();
#pragma omp parallel for schedule(static) if (rows * w >= kParallelGrain)
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t j = 0; j < w; ++j) dx[r * width + begin + j] += g[r * w + j];
    });
}

// ---- sum, mean ---------------------------------------------------------------------------------------------
// Seen as (outer, n, inner) with the reduced axis in the middle: out[o, i] = Σ_k x[o, k, i] · factor.

namespace {

Tensor reduce_axis(const char* op, const Tensor& a, int axis, bool keepdim, bool average) {
    require_defined(op, a, "input");
    const int r = a.rank();
    const int ax = axis < 0 ? axis + r : axis;
    if (ax < 0 || ax >= r) fail(op, "axis " + std::to_string(axis) + " out of range for shape " + a.shape().str());
    std::int64_t outer = 1, inner = 1, n = a.shape().dims[ax];
    for (int i = 0; i < ax; ++i) outer *= a.shape().dims[i];
    for (int i = ax + 1; i < r; ++i) inner *= a.shape().dims[i];
    std::vector<std::int64_t> dims;
    for (int i = 0; i < r; ++i)
        if (i != ax) dims.push_back(a.shape().dims[i]);
        else if (keepdim) dims.push_back(1);
    const real factor = average ? (n > 0 ? real(1) / real(n) : real(0)) : real(1);
    Tensor out = Tensor::zeros(Shape::of(dims));
    const real* x = a.data();
    real* y = out.data();
#pragma omp parallel for schedule(static) if (outer * n * inner >= kParallelGrain)
    for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t k = 0; k < n; ++k)
            for (std::int64_t i = 0; i < inner; ++i) y[o * inner + i] += x[(o * n + k) * inner + i] * factor;
    if (!needs_grad({&a})) return out;
    return record(op, out, {a}, [outer, n, inner, factor](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        const GradTarget dx = in[0].grad_target();
#pragma omp parallel for schedule(static) if (outer * n * inner >= kParallelGrain)
        for (std::int64_t o = 0; o < outer; ++o)
            for (std::int64_t k = 0; k < n; ++k)
                for (std::int64_t i = 0; i < inner; ++i) accumulate(dx, (o * n + k) * inner + i, g[o * inner + i] * factor);
    });
}

}  // namespace

Tensor sum(const Tensor& a, int axis, bool keepdim) { return reduce_axis("sum", a, axis, keepdim, false); }
Tensor mean(const Tensor& a, int axis, bool keepdim) { return reduce_axis("mean", a, axis, keepdim, true); }
Tensor sum_all(const Tensor& a) {
    require_defined("sum_all", a, "input");
    return reduce_axis("sum_all", a.reshape(Shape{a.numel()}), 0, false, false);
}

// ---- relu, gelu, tanh, sigmoid, exp, log, pow ------------------------------------------------------------

Tensor relu(const Tensor& a) {
    return unary("relu", a, [](real x) { return x > 0 ? x : real(0); },  //
                 [](real x) { return x > 0 ? real(1) : real(0); });
}

Tensor gelu(const Tensor& a) {
    // gelu(x) = x Φ(x), Φ(x) = ½(1 + erf(x/√2));  gelu'(x) = Φ(x) + x φ(x), φ(x) = e^(−x²/2) / √(2π)
    return unary("gelu", a, [](real x) { return real(0.5) * x * (real(1) + std::erf(x * real(M_SQRT1_2))); },
                 [](real x) {
                     real cdf = real(0.5) * (real(1) + std::erf(x * real(M_SQRT1_2)));
                     real pdf = std::exp(real(-0.5) * x * x) * real(0.5 * M_2_SQRTPI * M_SQRT1_2);
                     return cdf + x * pdf;
                 });
}

Tensor tanh(const Tensor& a) {
    // tanh'(x) = 1 − tanh²(x) = 1 / cosh²(x): the second form keeps its digits where tanh(x) is near ±1 and
    // 1 − tanh² would cancel (at x = 4, float's 1 − tanh² is off in the 4th digit), and tends to 0 as cosh → ∞.
    return unary("tanh", a, [](real x) { return std::tanh(x); },
                 [](real x) {
                     const real c = std::cosh(x);
                     return real(1) / (c * c);
                 });
}

Tensor sigmoid(const Tensor& a) {
    // σ'(x) = σ(x) (1 − σ(x))
    auto s = [](real x) { return real(1) / (real(1) + std::exp(-x)); };
    return unary("sigmoid", a, s, [s](real x) { return s(x) * (real(1) - s(x)); });
}

Tensor exp(const Tensor& a) {
    return unary("exp", a, [](real x) { return std::exp(x); }, [](real x) { return std::exp(x); });  // (eˣ)' = eˣ
}

Tensor log(const Tensor& a) {
    return unary("log", a, [](real x) { return std::log(x); }, [](real x) { return real(1) / x; });  // (ln x)' = 1/x
}

Tensor pow(const Tensor& a, real p) {
    // (xᵖ)' = p xᵖ⁻¹
    return unary("pow", a, [p](real x) { return std::pow(x, p); }, [p](real x) { return p * std::pow(x, p - 1); });
}

// ---- additive attention scores ---------------------------------------------------------------------------

Tensor additive_scores(const Tensor& q, const Tensor& k, const Tensor& v) {
    require_defined("additive_scores", q, "q");
    require_defined("additive_scores", k, "k");
    require_defined("additive_scores", v, "v");
    if (q.rank() != 4 || k.rank() != 4 || v.rank() != 2 || q.size(0) != k.size(0) || q.size(1) != k.size(1) ||
        q.size(3) != k.size(3) || v.size(0) != q.size(1) || v.size(1) != q.size(3))
        fail("additive_scores", "needs q (B, H, Tq, D), k (B, H, Tk, D) and v (H, D), got " + q.shape().str() + ", " +
                                    k.shape().str() + " and " + v.shape().str());
    const std::int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
    Tensor out = Tensor::empty({B, H, Tq, Tk});
    const real *Q = q.data(), *K = k.data(), *Vs = v.data();
    real* S = out.data();
    // s[b,h,i,j] = Σ_d v[h,d] tanh(q[b,h,i,d] + k[b,h,j,d])
#pragma omp parallel for schedule(static) if (B * H * Tq * Tk * D >= kParallelGrain)
    for (std::int64_t row = 0; row < B * H * Tq; ++row) {  // row = (b·H + h)·Tq + i
        const std::int64_t bh = row / Tq, h = bh % H;
        const real *qi = Q + row * D, *vh = Vs + h * D;
        for (std::int64_t j = 0; j < Tk; ++j) {
            const real* kj = K + (bh * Tk + j) * D;
            real s = 0;
            for (std::int64_t d = 0; d < D; ++d) s += vh[d] * std::tanh(qi[d] + kj[d]);
            S[row * Tk + j] = s;
        }
    }
    if (!needs_grad({&q, &k, &v})) return out;
    return record("additive_scores", out, {q, k, v}, [B, H, Tq, Tk, D](Tensor& y, std::vector<Tensor>& in) {
        // With t = tanh(q_i + k_j):  ∂s_ij/∂q_i = ∂s_ij/∂k_j = v ⊙ (1 − t²),  ∂s_ij/∂v = t.
        // Each (b, h) writes its own rows of dq and dk; dv sums over b in a fixed order afterwards, so
        // the result does not depend on the number of threads.
        const real *g = y.grad(), *Q = in[0].data(), *K = in[1].data(), *Vs = in[2].data();
        real* dq = in[0].requires_grad() ? in[0].grad() : nullptr;
        real* dk = in[1].requires_grad() ? in[1].grad() : nullptr;
        std::vector<real> dv_part(in[2].requires_grad() ? static_cast<std::size_t>(B * H * D) : 0, real(0));  // (B, H, D)
#pragma omp parallel for schedule(static) if (B * H * Tq * Tk * D >= kParallelGrain)
        for (std::int64_t bh = 0; bh < B * H; ++bh) {
            const real* vh = Vs + (bh % H) * D;
            real* dvh = dv_part.empty() ? nullptr : dv_part.data() + bh * D;
            for (std::int64_t i = 0; i < Tq; ++i) {
                const real* qi = Q + (bh * Tq + i) * D;
                for (std::int64_t j = 0; j < Tk; ++j) {
                    const real gij = g[(bh * Tq + i) * Tk + j];
                    if (gij == 0) continue;  // masked keys: softmax sends them no gradient
                    const real* kj = K + (bh * Tk + j) * D;
                    for (std::int64_t d = 0; d < D; ++d) {
                        const real t = std::tanh(qi[d] + kj[d]);
                        const real dpre = gij * vh[d] * (1 - t * t);
                        if (dq) dq[(bh * Tq + i) * D + d] += dpre;
                        if (dk) dk[(bh * Tk + j) * D + d] += dpre;
                        if (dvh) dvh[d] += gij * t;
                    }
                }
            }
        }
        if (!dv_part.empty()) {
            real* dv = in[2].grad();
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t hd = 0; hd < H * D; ++hd) dv[hd] += dv_part[b * H * D + hd];
        }
    });
}

// ---- softmax, log_softmax ---------------------------------------------------------------------------------

Tensor softmax(const Tensor& a, const Tensor& mask) {
    require_defined("softmax", a, "input");
    if (a.rank() == 0) fail("softmax", "needs at least one axis");
    const std::int64_t N = a.shape().last(), rows = a.shape().leading();
    // The mask's offset for each row of `a`: broadcast over the leading axes.
    std::int64_t mstride[4] = {0, 0, 0, 0}, n[4] = {1, 1, 1, 1}, mlast = 0;
    if (mask.defined()) {
        if (mask.rank() > a.rank()) fail("softmax", "mask " + mask.shape().str() + " has more axes than input " + a.shape().str());
        Broadcast bc = broadcast("softmax", a.shape(), mask.shape());
        if (bc.out != a.shape()) fail("softmax", "mask " + mask.shape().str() + " does not broadcast to input " + a.shape().str());
        for (int i = 0; i < 4; ++i) { mstride[i] = bc.sb[i]; n[i] = bc.n[i]; }
        mlast = bc.sb[3];
    }
    if (reference_mode()) return reference::softmax(a, mask);  // std::exp, max-subtraction written out
    Tensor out = Tensor::empty(a.shape());
    const real* x = a.data();
    const real* m = mask.defined() ? mask.data() : nullptr;
    real* y = out.data();
#pragma omp parallel for schedule(static) if (rows * N >= kParallelGrain)
    for (std::int64_t r = 0; r < rows; ++r) {
        const real* mr = nullptr;
        if (m) {
            std::int64_t i2 = r % n[2], i1 = (r / n[2]) % n[1], i0 = r / (n[2] * n[1]);
            mr = m + i0 * mstride[0] + i1 * mstride[1] + i2 * mstride[2];
        }
        softmax_row(x + r * N, mr, mlast, N, y + r * N);
    }
    if (!needs_grad({&a})) return out;
    return record("softmax", out, {a}, [N, rows](Tensor& y, std::vector<Tensor>& in) {
        const real *g = y.grad(), *p = y.data();
        const GradTarget dx = in[0].grad_target();
#pragma omp parallel for schedule(static) if (rows * N >= kParallelGrain)
        for (std::int64_t r = 0; r < rows; ++r) softmax_backward_row(g + r * N, p + r * N, N, dx.data + r * N, dx.overwrite);
    });
}

Tensor log_softmax(const Tensor& a) {
    require_defined("log_softmax", a, "input");
    if (a.rank() == 0) fail("log_softmax", "needs at least one axis");
    const std::int64_t N = a.shape().last(), rows = a.shape().leading();
    Tensor out = Tensor::empty(a.shape());
    const real* x = a.data();
    real* y = out.data();
#pragma omp parallel for schedule(static) if (rows * N >= kParallelGrain)
    for (std::int64_t r = 0; r < rows; ++r) {
        const real* xr = x + r * N;
        real mx = *std::max_element(xr, xr + N);
        real total = 0;
        for (std::int64_t j = 0; j < N; ++j) total += std::exp(xr[j] - mx);
        const real lse = mx + std::log(total);
        for (std::int64_t j = 0; j < N; ++j) y[r * N + j] = xr[j] - lse;
    }
    if (!needs_grad({&a})) return out;
    return record("log_softmax", out, {a}, [N, rows](Tensor& y, std::vector<Tensor>& in) {
        // y = x − lse(x):  dx_j = g_j − softmax_j · Σ_k g_k,  softmax_j = exp(y_j)
        const real *g = y.grad(), *ly = y.data();
        const GradTarget dx = in[0].grad_target();
#pragma omp parallel for schedule(static) if (rows * N >= kParallelGrain)
        for (std::int64_t r = 0; r < rows; ++r) {
            real total = 0;
            for (std::int64_t j = 0; j < N; ++j) total += g[r * N + j];
            for (std::int64_t j = 0; j < N; ++j) accumulate(dx, r * N + j, g[r * N + j] - std::exp(ly[r * N + j]) * total);
        }
    });
}

// ---- layer_norm, add_layer_norm ------------------------------------------------------------------------------

namespace {

// Row n of v = x + r, or of v = x + dropout(r) with `drop`, into vr (C values). The dropped-out residual is
// rounded to float before the sum, as dropout's output would be: the barrier keeps the compiler from fusing its
// product and the sum into one multiply-add.
void residual_sum_row(std::int64_t n, std::int64_t C, const real* px, const real* pr, const DropoutDraws* drop,
                      real* vr) {
    px += n * C;
    pr += n * C;
    if (drop) {
        drop->apply_n(n * C, C, pr, vr);
        asm volatile("" ::: "memory");
        for (std::int64_t c = 0; c < C; ++c) vr[c] = px[c] + vr[c];
    } else {
        for (std::int64_t c = 0; c < C; ++c) vr[c] = px[c] + pr[c];
    }
}

// y = (v − μ)·rstd·γ + β over one row. Not inlined: the forward pass and the output's recomputation after
// drop_values run this one copy of the code, so the recomputed values are the forward's to the bit whatever
// the compiler would have made of the loop in each place.
[[gnu::noinline]] void normalize_row(std::int64_t C, const real* vr, real mu, real rstd, const real* w, const real* b,
                                     real* y) {
    for (std::int64_t c = 0; c < C; ++c) y[c] = (vr[c] - mu) * rstd * w[c] + b[c];
}

}  // namespace

void check_layer_norm(const char* op, const Tensor& x, const Tensor* r, const Tensor& gamma, const Tensor& beta) {
    require_defined(op, x, "input");
    if (r) require_defined(op, *r, "residual");
    require_defined(op, gamma, "gamma");
    require_defined(op, beta, "beta");
    if (x.rank() == 0) fail(op, "needs at least one axis");
    if (r && r->shape() != x.shape()) fail(op, "input " + x.shape().str() + " and residual " + r->shape().str() + " differ");
    const std::int64_t C = x.shape().last();
    if (gamma.shape() != Shape{C} || beta.shape() != Shape{C})
        fail(op, "input " + x.shape().str() + " needs gamma and beta of shape (" + std::to_string(C) + "), got " +
                     gamma.shape().str() + " and " + beta.shape().str());
}

// The kernel of the three ops: y = LN(v) with v = x, or v = x + r when a residual r is given (x and r both
// receive dv), or v = x + dropout(r) with `drop` (r receives dropout's backward of dv). With a residual the
// record keeps the sum v, so that backward reads neither x's values nor r's: a post-norm stack lets the
// sublayer's output r go after the forward (Tensor::drop_values). The output y may go too: the record knows
// how to compute it again from v (or x) and the row statistics. One (N, C) tensor a layer norm instead of two.
Tensor layer_norm_impl(const char* op, const Tensor& x, const Tensor* r, const Tensor& gamma, const Tensor& beta,
                       real eps, const DropoutDraws* drop) {  // arguments checked by the op (check_layer_norm)
    const std::int64_t C = x.shape().last(), N = x.shape().leading();
    const bool recording = needs_grad({&x, r, &gamma, &beta});
    Tensor out = Tensor::empty(x.shape());
    Tensor stats = Tensor::empty(Shape{N, 2});  // per row: mean, 1/σ — with v, all that backward needs
    // v = x + (dropout of) r, kept when recording; otherwise summed row by row into a scratch row
    Tensor sum = r && recording ? Tensor::empty(x.shape()) : Tensor();
    const real *px = x.data(), *pr = r ? r->data() : nullptr, *w = gamma.data(), *b = beta.data();
    real *y = out.data(), *st = stats.data(), *v = sum.defined() ? sum.data() : nullptr;
#pragma omp parallel if (N * C >= kParallelGrain)
    {
        std::vector<real> row(pr && !v ? C : 0);  // v of one row, when it is a sum not kept
#pragma omp for schedule(static)
        for (std::int64_t n = 0; n < N; ++n) {
            const real* vr = px + n * C;
            if (pr) {
                real* into = v ? v + n * C : row.data();
                residual_sum_row(n, C, px, pr, drop, into);
                vr = into;
            }
            const real mu = lane_sum(C, [&](std::int64_t c) { return vr[c]; }) / real(C);
            // biased variance, as in the paper and PyTorch
            const real var = lane_sum(C, [&](std::int64_t c) { return (vr[c] - mu) * (vr[c] - mu); }) / real(C);
            const real rstd = real(1) / std::sqrt(var + eps);  // eps inside the square root
            normalize_row(C, vr, mu, rstd, w, b, y + n * C);
            st[2 * n] = mu;
            st[2 * n + 1] = rstd;
        }
    }
    if (!recording) return out;
    std::vector<Tensor> inputs{x, gamma, beta};
    if (r) inputs.push_back(*r);
    // y again, should its values be dropped: from the kept sum, or from x, which backward reads anyway
    out.recompute_with([N, C, v = sum.defined() ? sum : x, stats, gamma, beta](real* values) {
        const real *pv = v.data(), *st = stats.data(), *w = gamma.data(), *b = beta.data();
#pragma omp parallel for schedule(static) if (N * C >= kParallelGrain)
        for (std::int64_t n = 0; n < N; ++n) normalize_row(C, pv + n * C, st[2 * n], st[2 * n + 1], w, b, values + n * C);
    });
    const std::optional<DropoutDraws> dropped = drop ? std::optional<DropoutDraws>(*drop) : std::nullopt;
    const BrokenGradient broken = broken_gradient();  // None but under gradcheck/explain --break-grad
    return record(op, out, std::move(inputs), [N, C, stats, sum, dropped, broken](Tensor& y, std::vector<Tensor>& in) {
        // With x̂ = (v − μ)·rstd and y = x̂·γ + β, for one row of C values:
        //   dβ_c  += g_c                 (β adds straight through)
        //   dγ_c  += g_c · x̂_c           (γ scales x̂)
        //   dx̂_c   = g_c · γ_c
        //   dv_c   = rstd · (dx̂_c − mean(dx̂) − x̂_c · mean(dx̂ · x̂))
        // The last line is the chain rule through μ and rstd: the mean(dx̂) term is the path through μ,
        // the x̂·mean(dx̂·x̂) term the path through the variance. dv is added to x's gradient, and to the
        // residual's when there is one (v = x + r, kept by the forward).
        const real *g = y.grad(), *w = in[1].data(), *st = stats.data();
        const real* pv = sum.defined() ? sum.data() : in[0].data();  // v: the kept sum, or x itself
        const DropoutDraws* drop = dropped ? &*dropped : nullptr;
        // Every row gives each value of dx and dr one contribution; x and r may be one tensor (x + x), then
        // dr, taken second, adds to what dx wrote in the same iteration.
        const GradTarget none{nullptr, false};
        const GradTarget dx = in[0].requires_grad() ? in[0].grad_target() : none;
        const GradTarget dr = sum.defined() && in[3].requires_grad() ? in[3].grad_target() : none;
        real* dw = in[1].requires_grad() ? in[1].grad() : nullptr;
        real* db = in[2].requires_grad() ? in[2].grad() : nullptr;
        // γ and β gradients sum over rows: each block of kRowBlock rows sums into its own partial, and the
        // partials are added in block order afterwards. The blocks do not depend on the thread count, so
        // neither does the result (bit-identical on any number of threads, reruns and resumes).
        constexpr std::int64_t kRowBlock = 32;
        const std::int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
        std::vector<real> partial(std::size_t(blocks) * 2 * C, real(0));  // per block: dγ (C), dβ (C)
#pragma omp parallel if (N * C >= kParallelGrain)
        {
            // the row's dropout mask for dr; 32-bit flags, as wide as the floats they select, so that the loop below
            // vectorises
            std::vector<std::uint32_t> kept(drop && dr.data ? C : 0);
#pragma omp for schedule(static)
            for (std::int64_t blk = 0; blk < blocks; ++blk) {
                real* dw_part = partial.data() + std::size_t(blk) * 2 * C;
                real* db_part = dw_part + C;
                for (std::int64_t n = blk * kRowBlock; n < std::min(N, (blk + 1) * kRowBlock); ++n) {
                    const real* gr = g + n * C;
                    const real* vr = pv + n * C;
                    if (!kept.empty()) drop->keep_flags_n(n * C, C, kept.data());
                    const real mu = st[2 * n], rstd = st[2 * n + 1];
                    for (std::int64_t c = 0; c < C; ++c) {
                        dw_part[c] += gr[c] * (vr[c] - mu) * rstd;
                        db_part[c] += gr[c];
                    }
                    // A BrokenGradientScope drops one of the two terms (to show gradcheck failing).
                    const real mean_dxh = broken == BrokenGradient::LayerNormMean
                                              ? real(0)
                                              : lane_sum(C, [&](std::int64_t c) { return gr[c] * w[c]; }) / real(C);
                    const real mean_dxh_xh =
                        broken == BrokenGradient::LayerNormVariance
                            ? real(0)
                            : lane_sum(C, [&](std::int64_t c) { return gr[c] * w[c] * (vr[c] - mu) * rstd; }) / real(C);
                    const auto dv = [&](std::int64_t c) {
                        return rstd * (gr[c] * w[c] - mean_dxh - (vr[c] - mu) * rstd * mean_dxh_xh);
                    };
                    for (int k = 0; k < 2; ++k) {  // dx first: see above
                        const GradTarget& t = k == 0 ? dx : dr;
                        if (!t.data) continue;
                        real* out = t.data + n * C;
                        if (k == 1 && drop) {  // through the residual's dropout: × 1/(1−p) where it survived
                            const real scale = drop->keep_scale;
                            // dv of every value, dropped or not: a select, not masked loads (GCC 12 leaves those scalar)
                            if (t.overwrite)
                                for (std::int64_t c = 0; c < C; ++c) {
                                    const real d = dv(c) * scale;
                                    out[c] = kept[c] ? d : real(0);
                                }
                            else
                                for (std::int64_t c = 0; c < C; ++c) {
                                    const real d = dv(c) * scale;
                                    out[c] += kept[c] ? d : real(0);
                                }
                        } else if (t.overwrite) {
                            for (std::int64_t c = 0; c < C; ++c) out[c] = dv(c);
                        } else {
                            for (std::int64_t c = 0; c < C; ++c) out[c] += dv(c);
                        }
                    }
                }
            }
        }
        for (std::int64_t blk = 0; blk < blocks; ++blk) {
            const real* part = partial.data() + std::size_t(blk) * 2 * C;
            for (std::int64_t c = 0; dw && c < C; ++c) dw[c] += part[c];
            for (std::int64_t c = 0; db && c < C; ++c) db[c] += part[C + c];
        }
    });
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, real eps) {
    check_layer_norm("layer_norm", x, nullptr, gamma, beta);
    if (reference_mode()) return reference::layer_norm(x, gamma, beta, eps);  // term by term
    return layer_norm_impl("layer_norm", x, nullptr, gamma, beta, eps);
}

// ---- deliberately wrong gradients (read by layer_norm_impl above) ------------------------------------------

namespace {
BrokenGradient g_broken_gradient = BrokenGradient::None;
}  // namespace

const char* to_string(BrokenGradient b) {
    switch (b) {
        case BrokenGradient::None: return "none";
        case BrokenGradient::LayerNormMean: return "layernorm-mean";
        case BrokenGradient::LayerNormVariance: return "layernorm-variance";
    }
    return "?";
}

std::vector<std::string> broken_gradient_names() { return {"layernorm-mean", "layernorm-variance"}; }

BrokenGradient parse_broken_gradient(const std::string& name) {
    for (BrokenGradient b : {BrokenGradient::None, BrokenGradient::LayerNormMean, BrokenGradient::LayerNormVariance})
        if (name == to_string(b)) return b;
    throw std::invalid_argument("broken gradient '" + name + "' is not one of: layernorm-mean, layernorm-variance");
}

std::string broken_gradient_description(BrokenGradient b) {
    switch (b) {
        case BrokenGradient::None: return "every backward as derived";
        case BrokenGradient::LayerNormMean:
            return "LayerNorm's backward without its mean term: dv = rstd * (dxh - xh * mean(dxh * xh)), the path through "
                   "the mean left out";
        case BrokenGradient::LayerNormVariance:
            return "LayerNorm's backward without its variance term: dv = rstd * (dxh - mean(dxh)), the path through the "
                   "variance left out";
    }
    return "";
}

BrokenGradient broken_gradient() { return g_broken_gradient; }

BrokenGradientScope::BrokenGradientScope(BrokenGradient b) : previous_(g_broken_gradient) { g_broken_gradient = b; }
BrokenGradientScope::~BrokenGradientScope() { g_broken_gradient = previous_; }

// ---- dropout ---------------------------------------------------------------------------------------------------

Tensor dropout(const Tensor& a, real p, Rng& rng, bool training) {
    require_defined("dropout", a, "input");
    check_dropout_probability("dropout", p);
    if (!training || p == 0) return a;
    const DropoutDraws draws(rng, a.numel(), p);
    Tensor out = Tensor::empty(a.shape());
    dropout_in_pieces(draws, a.numel(), a.data(), out.data(), [](real*, std::int64_t) {});
    if (!needs_grad({&a})) return out;
    // The mask is not stored: backward draws the same counters again.
    return record("dropout", out, {a}, [draws](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        write_or_add(in[0].grad_target(), y.numel(), [=](std::int64_t i) { return draws.apply(i, g[i]); });
    });
}

// ---- embedding --------------------------------------------------------------------------------------------------

Tensor embedding(const Tensor& table, const std::vector<std::int32_t>& ids, const Shape& ids_shape,
                 std::int32_t padding_idx) {
    require_defined("embedding", table, "table");
    if (table.rank() != 2) fail("embedding", "table must be (V, C), got " + table.shape().str());
    if (static_cast<std::int64_t>(ids.size()) != ids_shape.numel())
        fail("embedding", std::to_string(ids.size()) + " ids for ids shape " + ids_shape.str());
    if (ids_shape.rank >= Shape::kMaxRank) fail("embedding", "ids shape " + ids_shape.str() + " has too many axes");
    const std::int64_t V = table.size(0), C = table.size(1), n = ids_shape.numel();
    for (std::int64_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= V)
            fail("embedding", "id " + std::to_string(ids[i]) + " at position " + std::to_string(i) + " is outside the table of " +
                                  std::to_string(V) + " rows");
    Shape out_shape = ids_shape;
    out_shape.dims[out_shape.rank++] = C;
    Tensor out = Tensor::empty(out_shape);  // (..., C)
    const real* w = table.data();
    real* y = out.data();
#pragma omp parallel for schedule(static) if (n * C >= kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) std::memcpy(y + i * C, w + std::int64_t(ids[i]) * C, C * sizeof(real));
    if (!needs_grad({&table})) return out;
    return record("embedding", out, {table}, [ids, C, padding_idx](Tensor& y, std::vector<Tensor>& in) {
        // Scatter-add: an id that appears k times receives the sum of its k rows of gradient. Threads split
        // the columns (a repeated id would make two threads meet on one row), each adding in id order.
        const real* g = y.grad();
        real* dw = in[0].grad();
        const std::int64_t n = static_cast<std::int64_t>(ids.size());
        over_column_blocks(C, n * C, [&](std::int64_t c0, std::int64_t c1) {
            for (std::int64_t i = 0; i < n; ++i) {
                if (ids[i] == padding_idx) continue;
                real* row = dw + std::int64_t(ids[i]) * C;
                const real* gi = g + i * C;
#pragma omp simd
                for (std::int64_t c = c0; c < c1; ++c) row[c] += gi[c];
            }
        });
    });
}

// ---- cross_entropy ------------------------------------------------------------------------------------------------

Tensor cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& target, std::int32_t ignore_index,
                     real eps, CrossEntropyStats* stats, bool consume_logits, real seed) {
    require_defined("cross_entropy", logits, "logits");
    if (logits.rank() != 2) fail("cross_entropy", "logits must be (N, V), got " + logits.shape().str());
    const std::int64_t N = logits.size(0), V = logits.size(1);
    if (static_cast<std::int64_t>(target.size()) != N)
        fail("cross_entropy", std::to_string(target.size()) + " targets for logits " + logits.shape().str());
    if (!(eps >= 0 && eps <= 1)) fail("cross_entropy", "label smoothing must be in [0, 1], got " + std::to_string(eps));
    std::int64_t count = 0;
    for (std::int64_t i = 0; i < N; ++i) {
        if (target[i] == ignore_index) continue;
        if (target[i] < 0 || target[i] >= V)
            fail("cross_entropy", "target " + std::to_string(target[i]) + " at row " + std::to_string(i) + " is outside [0, " +
                                      std::to_string(V) + ")");
        ++count;
    }
    if (reference_mode()) return reference::cross_entropy(logits, target, ignore_index, eps, stats);
    // ∂loss/∂x_ij = (p_ij − (1−ε)·[j = t_i] − ε/V) / n   for counted rows, 0 for ignored ones; times the seed;
    // p_ij = e^(x_ij − max_i) · (1 / Σ_j e^(x_ij − max_i)), softmax as PyTorch computes it. Written over x row by
    // row (after the row's loss has read it) here when the caller consumes the logits, else in backward.
    const real off = eps / real(V), on = real(1) - eps + off;
    // One row's gradient from its exponentials e_j, kept in dr by the forward pass (e_in_dr), or computed again
    // from x: the same bits either way.
    auto gradient_row = [=](real g, real mx, real inv_total, std::int32_t t, const real* xr, real* dr, bool overwrite,
                            bool e_in_dr) {
        if (t == ignore_index) {  // no gradient: a row not yet written is zeroed
            if (overwrite) std::fill(dr, dr + V, real(0));
            return;
        }
        if (e_in_dr)  // one pointer: the loop vectorises without an overlap check
            for (std::int64_t j = 0; j < V; ++j) dr[j] = g * (dr[j] * inv_total - off);
        else if (overwrite)
            for (std::int64_t j = 0; j < V; ++j) dr[j] = g * (exp_fast(xr[j] - mx) * inv_total - off);
        else
            for (std::int64_t j = 0; j < V; ++j) dr[j] += g * (exp_fast(xr[j] - mx) * inv_total - off);
        dr[t] -= g * (on - off);
    };
    const bool grad = needs_grad({&logits}) && count > 0;
    const bool grad_now = grad && consume_logits && !logits.is_leaf();  // a leaf's values are the caller's own
    const real g_now = seed / real(count);
    // Per row: max_j x_ij and 1 / Σ_j e^(x_ij − max): all that backward needs to rebuild p_ij
    Tensor row_stats = Tensor::empty(Shape{N, 2});
    real* x = Tensor(logits).data();  // written only with grad_now
    real* st = row_stats.data();
    // Per-row terms, summed in row order afterwards: the loss is the same bit for bit whatever the threads.
    std::vector<double> row_loss(N, 0.0), row_nll(N, 0.0);
#pragma omp parallel for schedule(static) if (N * V >= kParallelGrain)
    for (std::int64_t i = 0; i < N; ++i) {
        real* xr = x + i * V;
        if (target[i] == ignore_index) {
            if (grad_now) gradient_row(g_now, 0, 0, target[i], xr, xr, true, false);
            continue;
        }
        const real mx = lane_max(xr, V), x_target = xr[target[i]];
        real total, row_sum;  // Σ_j e^(x_ij − max), Σ_j x_ij
        // With grad_now e^(x_ij − max) is kept over x_ij (after Σ x has read it): the gradient reads it instead
        // of computing it again.
        const auto x_j = [&](std::int64_t j) { return xr[j]; };
        if (grad_now)
            lane_sum2(V, [&](std::int64_t j) { return xr[j] = exp_fast(xr[j] - mx); }, x_j, total, row_sum);
        else
            lane_sum2(V, [&](std::int64_t j) { return exp_fast(xr[j] - mx); }, x_j, total, row_sum);
        const double lse_i = double(mx) + std::log(double(total));
        st[2 * i] = mx;
        st[2 * i + 1] = real(1) / total;
        const double nll = lse_i - x_target;                          // −log p_t
        const double smooth = lse_i - double(row_sum) / double(V);  // (1/V) Σ_j −log p_j
        row_nll[i] = nll;
        row_loss[i] = (1.0 - eps) * nll + eps * smooth;
        if (grad_now) gradient_row(g_now, mx, st[2 * i + 1], target[i], xr, xr, true, true);
    }
    double loss_sum = 0, nll_sum = 0;
    for (std::int64_t i = 0; i < N; ++i) {
        loss_sum += row_loss[i];
        nll_sum += row_nll[i];
    }
    if (stats) {
        stats->nll_sum = nll_sum;
        stats->count = count;
    }
    Tensor out = Tensor::scalar(count ? real(loss_sum / double(count)) : real(0));
    if (!grad) return out;
    return record("cross_entropy", out, {logits}, [gradient_row, target, N, V, count, row_stats, grad_now, g_now](
                                                       Tensor& y, std::vector<Tensor>& in) {
        const real g = y.grad()[0] / real(count);
        if (grad_now) {  // the logits' buffer holds the gradient for the promised seed: it becomes theirs
            // Held by anyone but the tape, or given a gradient by an op that read them after the loss, or seeded
            // otherwise: a promise broken, which the values written over the logits cannot undo.
            if (g != g_now || !in[0].grad_over_value().data)
                throw std::logic_error("cross_entropy: consume_logits was given, but " +
                                       std::string(g != g_now ? "backward's seed is not the one promised"
                                                              : "something besides the loss holds or read the logits"));
            return;
        }
        const real* st = row_stats.data();
        const real* x = in[0].data();
        GradTarget dx = in[0].grad_target();
#pragma omp parallel for schedule(static) if (N * V >= kParallelGrain)
        for (std::int64_t i = 0; i < N; ++i)
            gradient_row(g, st[2 * i], st[2 * i + 1], target[i], x + i * V, dx.data + i * V, dx.overwrite, false);
    });
}

TF_NAMESPACE_END
