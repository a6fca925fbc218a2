// The primitive ops: for each, the forward kernel and, right after it, the backward closure it records.
// Kernels are plain loops over contiguous memory; OpenMP splits their outer loop across threads.
#include "tapeformer/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"

TF_NAMESPACE_BEGIN

namespace {

[[noreturn]] void fail(const char* op, const std::string& msg) { throw std::invalid_argument(std::string(op) + ": " + msg); }

void require_defined(const char* op, const Tensor& t, const char* what) {
    if (!t.defined()) fail(op, std::string(what) + " is an undefined tensor");
}

// Only parallelise loops with enough work to pay for waking the threads.
constexpr std::int64_t kParallelGrain = 1 << 14;

// ---- broadcasting ---------------------------------------------------------------------------------------
// Both operands are padded on the left to four axes; a stride of 0 repeats a value along an axis.
struct Broadcast {
    Shape out;
    std::int64_t n[4];
    std::int64_t sa[4], sb[4];
};

void padded_strides(const Shape& s, const std::int64_t (&n)[4], std::int64_t (&stride)[4]) {
    std::int64_t d[4] = {1, 1, 1, 1};
    for (int i = 0; i < s.rank; ++i) d[4 - s.rank + i] = s.dims[i];
    std::int64_t st = 1;
    for (int i = 3; i >= 0; --i) {
        stride[i] = (d[i] == 1 && n[i] != 1) ? 0 : st;
        st *= d[i];
    }
}

Broadcast broadcast(const char* op, const Shape& a, const Shape& b) {
    Broadcast bc;
    int rank = std::max(a.rank, b.rank);
    bc.out.rank = rank;
    for (int i = 0; i < 4; ++i) {
        std::int64_t da = 1, db = 1;
        int ia = i - (4 - a.rank), ib = i - (4 - b.rank);
        if (ia >= 0) da = a.dims[ia];
        if (ib >= 0) db = b.dims[ib];
        if (da != db && da != 1 && db != 1)
            fail(op, "shapes " + a.str() + " and " + b.str() + " do not broadcast");
        bc.n[i] = std::max(da, db);
        if (da == 0 || db == 0) bc.n[i] = 0;
        if (i >= 4 - rank) bc.out.dims[i - (4 - rank)] = bc.n[i];
    }
    padded_strides(a, bc.n, bc.sa);
    padded_strides(b, bc.n, bc.sb);
    return bc;
}

// Calls f(o, ia, ib) for every output element o with the matching offsets into a and b. Rows of the last
// axis are split across threads when `parallel` (only safe when f writes to distinct places for each o).
template <class F>
void for_each_broadcast(const Broadcast& bc, bool parallel, F f) {
    const std::int64_t rows = bc.n[0] * bc.n[1] * bc.n[2], n3 = bc.n[3];
#pragma omp parallel for schedule(static) if (parallel && rows * n3 >= kParallelGrain)
    for (std::int64_t r = 0; r < rows; ++r) {
        std::int64_t i2 = r % bc.n[2], i1 = (r / bc.n[2]) % bc.n[1], i0 = r / (bc.n[2] * bc.n[1]);
        std::int64_t a0 = i0 * bc.sa[0] + i1 * bc.sa[1] + i2 * bc.sa[2];
        std::int64_t b0 = i0 * bc.sb[0] + i1 * bc.sb[1] + i2 * bc.sb[2];
        std::int64_t o = r * n3;
        for (std::int64_t j = 0; j < n3; ++j) f(o + j, a0 + j * bc.sa[3], b0 + j * bc.sb[3]);
    }
}

// The shared body of add / sub / mul / div. `fwd(x, y)` is the value, `da(x, y, g)` and `db(x, y, g)` the
// contributions of one output element to the gradients of its two operands.
template <class Fwd, class DA, class DB>
Tensor binary(const char* op, const Tensor& a, const Tensor& b, Fwd fwd, DA da, DB db) {
    require_defined(op, a, "first operand");
    require_defined(op, b, "second operand");
    Broadcast bc = broadcast(op, a.shape(), b.shape());
    Tensor out = Tensor::empty(bc.out);
    const real *pa = a.data(), *pb = b.data();
    real* po = out.data();
    if (a.shape() == b.shape()) {
        const std::int64_t n = out.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i) po[i] = fwd(pa[i], pb[i]);
    } else {
        for_each_broadcast(bc, true, [&](std::int64_t o, std::int64_t ia, std::int64_t ib) { po[o] = fwd(pa[ia], pb[ib]); });
    }
    if (!needs_grad({&a, &b})) return out;
    return record(op, out, {a, b}, [bc, da, db](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        const real *x0 = in[0].data(), *x1 = in[1].data();
        // An operand that was not stretched receives one contribution per element: safe to parallelise.
        if (in[0].requires_grad()) {
            real* g0 = in[0].grad();
            for_each_broadcast(bc, in[0].numel() == y.numel(), [&](std::int64_t o, std::int64_t ia, std::int64_t ib) {
                g0[ia] += da(x0[ia], x1[ib], g[o]);
            });
        }
        if (in[1].requires_grad()) {
            real* g1 = in[1].grad();
            for_each_broadcast(bc, in[1].numel() == y.numel(), [&](std::int64_t o, std::int64_t ia, std::int64_t ib) {
                g1[ib] += db(x0[ia], x1[ib], g[o]);
            });
        }
    });
}

}  // namespace

// ---- add, sub, mul, div, scale ------------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
    return binary("add", a, b, [](real x, real y) { return x + y; },  //
                  [](real, real, real g) { return g; },               // ∂(x+y)/∂x = 1
                  [](real, real, real g) { return g; });              // ∂(x+y)/∂y = 1
}

Tensor sub(const Tensor& a, const Tensor& b) {
    return binary("sub", a, b, [](real x, real y) { return x - y; },  //
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
        real* dx = in[0].grad();
        const std::int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i) dx[i] += s * g[i];
    });
}

// ---- matmul ----------------------------------------------------------------------------------------------
// C = op(A)·op(B). Backward, with dC the upstream gradient (derivation in the comments at each gemm):
//   d op(A) = dC · op(B)ᵀ,   d op(B) = op(A)ᵀ · dC.

namespace {

struct MatmulDims {
    std::int64_t batch, M, N, K;
    bool shared_b;  // b is one 2-D matrix used for every row of a
};

// Each of the `batch` products, on threads when the products are small (attention); one threaded BLAS
// call after another when they are large.
template <class F>
void over_batch(const MatmulDims& d, F product) {
    const std::int64_t flops_each = d.M * d.N * d.K;
    const bool split = d.batch > 1 && flops_each < (std::int64_t(1) << 22) && d.batch * flops_each >= kParallelGrain;
#pragma omp parallel for schedule(static) if (split)
    for (std::int64_t i = 0; i < d.batch; ++i) product(i);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
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
        d.M = a.shape().rows();
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

    Tensor out = Tensor::empty(out_shape);
    const std::int64_t a_step = d.shared_b ? 0 : d.M * d.K, b_step = d.shared_b ? 0 : d.K * d.N, c_step = d.M * d.N;
    const std::int64_t lda = a.size(-1), ldb = b.size(-1);
    {
        const real *A = a.data(), *B = b.data();
        real* C = out.data();
        over_batch(d, [&](std::int64_t i) {
            gemm(ta, tb, d.M, d.N, d.K, 1, A + i * a_step, lda, B + i * b_step, ldb, 0, C + i * c_step, d.N);
        });
    }
    if (!needs_grad({&a, &b})) return out;
    return record("matmul", out, {a, b}, [d, ta, tb, a_step, b_step, c_step, lda, ldb](Tensor& y, std::vector<Tensor>& in) {
        const real* dC = y.grad();
        const real *A = in[0].data(), *B = in[1].data();
        if (in[0].requires_grad()) {
            real* dA = in[0].grad();
            over_batch(d, [&](std::int64_t i) {
                if (!ta)  // dA (M,K) += dC (M,N) · op(B)ᵀ (N,K)
                    gemm(false, !tb, d.M, d.K, d.N, 1, dC + i * c_step, d.N, B + i * b_step, ldb, 1, dA + i * a_step, lda);
                else      // A stored (K,M): dA += (dC · op(B)ᵀ)ᵀ = op(B) (K,N) · dCᵀ (N,M)
                    gemm(tb, true, d.K, d.M, d.N, 1, B + i * b_step, ldb, dC + i * c_step, d.N, 1, dA + i * a_step, lda);
            });
        }
        if (in[1].requires_grad()) {
            real* dB = in[1].grad();
            if (d.shared_b) {  // one product over all rows: dB += (Σ over rows) — a single large gemm
                if (!tb) gemm(true, false, d.K, d.N, d.M, 1, A, lda, dC, d.N, 1, dB, ldb);   // (K,N) += Aᵀ dC
                else     gemm(true, false, d.N, d.K, d.M, 1, dC, d.N, A, lda, 1, dB, ldb);   // (N,K) += dCᵀ A
                return;
            }
            over_batch(d, [&](std::int64_t i) {
                if (!tb)  // dB (K,N) += op(A)ᵀ (K,M) · dC (M,N)
                    gemm(!ta, false, d.K, d.N, d.M, 1, A + i * a_step, lda, dC + i * c_step, d.N, 1, dB + i * b_step, ldb);
                else      // B stored (N,K): dB += dCᵀ (N,M) · op(A) (M,K)
                    gemm(true, ta, d.N, d.K, d.M, 1, dC + i * c_step, d.N, A + i * a_step, lda, 1, dB + i * b_step, ldb);
            });
        }
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
        real* dx = in[0].grad();
        visit([&](std::int64_t o, std::int64_t i) { dx[i] += g[o]; });  // a permutation: one source per element
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
    const std::int64_t rows = out_shape.rows();
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
            real* dx = in[k].grad();
#pragma omp parallel for schedule(static) if (rows * w >= kParallelGrain)
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t j = 0; j < w; ++j) dx[r * w + j] += g[r * width + col + j];
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
    const std::int64_t w = end - begin, rows = out_shape.rows();
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
        real* dx = in[0].grad();
#pragma omp parallel for schedule(static) if (outer * n * inner >= kParallelGrain)
        for (std::int64_t o = 0; o < outer; ++o)
            for (std::int64_t k = 0; k < n; ++k)
                for (std::int64_t i = 0; i < inner; ++i) dx[(o * n + k) * inner + i] += g[o * inner + i] * factor;
    });
}

}  // namespace

Tensor sum(const Tensor& a, int axis, bool keepdim) { return reduce_axis("sum", a, axis, keepdim, false); }
Tensor mean(const Tensor& a, int axis, bool keepdim) { return reduce_axis("mean", a, axis, keepdim, true); }
Tensor sum_all(const Tensor& a) {
    require_defined("sum_all", a, "input");
    return reduce_axis("sum_all", a.reshape(Shape{a.numel()}), 0, false, false);
}

// ---- relu, gelu ---------------------------------------------------------------------------------------------

namespace {

// y = f(x) elementwise; backward dx += g · f'(x).
template <class F, class DF>
Tensor unary(const char* op, const Tensor& a, F f, DF df) {
    require_defined(op, a, "input");
    Tensor out = Tensor::empty(a.shape());
    const real* x = a.data();
    real* y = out.data();
    const std::int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
    if (!needs_grad({&a})) return out;
    return record(op, out, {a}, [df](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        const real* x = in[0].data();
        real* dx = in[0].grad();
        const std::int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i) dx[i] += g[i] * df(x[i]);
    });
}

}  // namespace

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

// ---- softmax, log_softmax ---------------------------------------------------------------------------------

Tensor softmax(const Tensor& a, const Tensor& mask) {
    require_defined("softmax", a, "input");
    if (a.rank() == 0) fail("softmax", "needs at least one axis");
    const std::int64_t N = a.shape().last(), rows = a.shape().rows();
    // The mask's offset for each row of `a`: broadcast over the leading axes.
    std::int64_t mstride[4] = {0, 0, 0, 0}, n[4] = {1, 1, 1, 1}, mlast = 0;
    if (mask.defined()) {
        if (mask.rank() > a.rank()) fail("softmax", "mask " + mask.shape().str() + " has more axes than input " + a.shape().str());
        Broadcast bc = broadcast("softmax", a.shape(), mask.shape());
        if (bc.out != a.shape()) fail("softmax", "mask " + mask.shape().str() + " does not broadcast to input " + a.shape().str());
        for (int i = 0; i < 4; ++i) { mstride[i] = bc.sb[i]; n[i] = bc.n[i]; }
        mlast = bc.sb[3];
    }
    Tensor out = Tensor::empty(a.shape());
    const real* x = a.data();
    const real* m = mask.defined() ? mask.data() : nullptr;
    real* y = out.data();
#pragma omp parallel for schedule(static) if (rows * N >= kParallelGrain)
    for (std::int64_t r = 0; r < rows; ++r) {
        const real* xr = x + r * N;
        real* yr = y + r * N;
        const real* mr = nullptr;
        if (m) {
            std::int64_t i2 = r % n[2], i1 = (r / n[2]) % n[1], i0 = r / (n[2] * n[1]);
            mr = m + i0 * mstride[0] + i1 * mstride[1] + i2 * mstride[2];
        }
        real mx = -std::numeric_limits<real>::infinity();
        for (std::int64_t j = 0; j < N; ++j) {
            yr[j] = mr ? xr[j] + mr[j * mlast] : xr[j];
            mx = std::max(mx, yr[j]);
        }
        if (mx == -std::numeric_limits<real>::infinity()) {  // everything masked
            std::fill(yr, yr + N, real(0));
            continue;
        }
        real total = 0;
        for (std::int64_t j = 0; j < N; ++j) total += (yr[j] = std::exp(yr[j] - mx));
        const real inv = real(1) / total;
        for (std::int64_t j = 0; j < N; ++j) yr[j] *= inv;
    }
    if (!needs_grad({&a})) return out;
    return record("softmax", out, {a}, [N, rows](Tensor& y, std::vector<Tensor>& in) {
        // dx_j = y_j (g_j − Σ_k g_k y_k)
        const real *g = y.grad(), *p = y.data();
        real* dx = in[0].grad();
#pragma omp parallel for schedule(static) if (rows * N >= kParallelGrain)
        for (std::int64_t r = 0; r < rows; ++r) {
            const real *gr = g + r * N, *pr = p + r * N;
            real dot = 0;
            for (std::int64_t j = 0; j < N; ++j) dot += gr[j] * pr[j];
            for (std::int64_t j = 0; j < N; ++j) dx[r * N + j] += pr[j] * (gr[j] - dot);
        }
    });
}

Tensor log_softmax(const Tensor& a) {
    require_defined("log_softmax", a, "input");
    if (a.rank() == 0) fail("log_softmax", "needs at least one axis");
    const std::int64_t N = a.shape().last(), rows = a.shape().rows();
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
        real* dx = in[0].grad();
#pragma omp parallel for schedule(static) if (rows * N >= kParallelGrain)
        for (std::int64_t r = 0; r < rows; ++r) {
            real total = 0;
            for (std::int64_t j = 0; j < N; ++j) total += g[r * N + j];
            for (std::int64_t j = 0; j < N; ++j) dx[r * N + j] += g[r * N + j] - std::exp(ly[r * N + j]) * total;
        }
    });
}

// ---- layer_norm ----------------------------------------------------------------------------------------------

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, real eps) {
    require_defined("layer_norm", x, "input");
    require_defined("layer_norm", gamma, "gamma");
    require_defined("layer_norm", beta, "beta");
    if (x.rank() == 0) fail("layer_norm", "needs at least one axis");
    const std::int64_t C = x.shape().last(), N = x.shape().rows();
    if (gamma.shape() != Shape{C} || beta.shape() != Shape{C})
        fail("layer_norm", "input " + x.shape().str() + " needs gamma and beta of shape (" + std::to_string(C) + "), got " +
                               gamma.shape().str() + " and " + beta.shape().str());
    Tensor out = Tensor::empty(x.shape());
    Tensor stats = Tensor::empty(Shape{N, 2});  // per row: mean, 1/σ — what backward needs
    const real *px = x.data(), *w = gamma.data(), *b = beta.data();
    real *y = out.data(), *st = stats.data();
#pragma omp parallel for schedule(static) if (N * C >= kParallelGrain)
    for (std::int64_t n = 0; n < N; ++n) {
        const real* xr = px + n * C;
        real mu = 0;
        for (std::int64_t c = 0; c < C; ++c) mu += xr[c];
        mu /= real(C);
        real var = 0;  // biased variance, as in the paper and PyTorch
        for (std::int64_t c = 0; c < C; ++c) var += (xr[c] - mu) * (xr[c] - mu);
        var /= real(C);
        const real rstd = real(1) / std::sqrt(var + eps);  // eps inside the square root
        for (std::int64_t c = 0; c < C; ++c) y[n * C + c] = (xr[c] - mu) * rstd * w[c] + b[c];
        st[2 * n] = mu;
        st[2 * n + 1] = rstd;
    }
    if (!needs_grad({&x, &gamma, &beta})) return out;
    return record("layer_norm", out, {x, gamma, beta}, [N, C, stats](Tensor& y, std::vector<Tensor>& in) {
        // With x̂ = (x − μ)·rstd and y = x̂·γ + β, for one row of C values:
        //   dβ_c  += g_c                 (β adds straight through)
        //   dγ_c  += g_c · x̂_c           (γ scales x̂)
        //   dx̂_c   = g_c · γ_c
        //   dx_c  += rstd · (dx̂_c − mean(dx̂) − x̂_c · mean(dx̂ · x̂))
        // The last line is the chain rule through μ and rstd: the mean(dx̂) term is the path through μ,
        // the x̂·mean(dx̂·x̂) term the path through the variance.
        const real *g = y.grad(), *px = in[0].data(), *w = in[1].data(), *st = stats.data();
        real* dx = in[0].requires_grad() ? in[0].grad() : nullptr;
        real* dw = in[1].requires_grad() ? in[1].grad() : nullptr;
        real* db = in[2].requires_grad() ? in[2].grad() : nullptr;
        // γ and β gradients sum over rows. Each thread sums its own block of rows, and the partial sums
        // are added in thread order afterwards, so the result does not depend on timing (bit-identical
        // reruns and resumes).
        const int threads = (N * C >= kParallelGrain) ? omp_get_max_threads() : 1;
        std::vector<real> partial(std::size_t(threads) * 2 * C, real(0));  // per thread: dγ (C), dβ (C)
#pragma omp parallel num_threads(threads)
        {
            real* dw_local = partial.data() + std::size_t(omp_get_thread_num()) * 2 * C;
            real* db_local = dw_local + C;
#pragma omp for schedule(static)
            for (std::int64_t n = 0; n < N; ++n) {
                const real *gr = g + n * C, *xr = px + n * C;
                const real mu = st[2 * n], rstd = st[2 * n + 1];
                real mean_dxh = 0, mean_dxh_xh = 0;
                for (std::int64_t c = 0; c < C; ++c) {
                    const real xh = (xr[c] - mu) * rstd, dxh = gr[c] * w[c];
                    mean_dxh += dxh;
                    mean_dxh_xh += dxh * xh;
                    dw_local[c] += gr[c] * xh;
                    db_local[c] += gr[c];
                }
                mean_dxh /= real(C);
                mean_dxh_xh /= real(C);
                if (dx)
                    for (std::int64_t c = 0; c < C; ++c) {
                        const real xh = (xr[c] - mu) * rstd;
                        dx[n * C + c] += rstd * (gr[c] * w[c] - mean_dxh - xh * mean_dxh_xh);
                    }
            }
        }
        for (int t = 0; t < threads; ++t) {
            const real* part = partial.data() + std::size_t(t) * 2 * C;
            for (std::int64_t c = 0; dw && c < C; ++c) dw[c] += part[c];
            for (std::int64_t c = 0; db && c < C; ++c) db[c] += part[C + c];
        }
    });
}

// ---- dropout ---------------------------------------------------------------------------------------------------

namespace {
// Element i survives when its 53-bit uniform draw is at least p.
inline bool keeps(std::uint64_t seed, std::uint64_t counter, std::uint64_t threshold) {
    return (hash64(seed, counter) >> 11) >= threshold;
}
}  // namespace

Tensor dropout(const Tensor& a, real p, Rng& rng, bool training) {
    require_defined("dropout", a, "input");
    if (!(p >= 0 && p < 1)) fail("dropout", "probability must be in [0, 1), got " + std::to_string(p));
    if (!training || p == 0) return a;
    const std::int64_t n = a.numel();
    const std::uint64_t seed = rng.seed, base = rng.reserve(static_cast<std::uint64_t>(n));
    const std::uint64_t threshold = static_cast<std::uint64_t>(double(p) * 0x1.0p53);
    const real keep_scale = real(1) / (real(1) - p);
    Tensor out = Tensor::empty(a.shape());
    const real* x = a.data();
    real* y = out.data();
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) y[i] = keeps(seed, base + i, threshold) ? x[i] * keep_scale : real(0);
    if (!needs_grad({&a})) return out;
    // The mask is not stored: backward draws the same counters again.
    return record("dropout", out, {a}, [seed, base, threshold, keep_scale](Tensor& y, std::vector<Tensor>& in) {
        const real* g = y.grad();
        real* dx = in[0].grad();
        const std::int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i)
            if (keeps(seed, base + i, threshold)) dx[i] += g[i] * keep_scale;
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
        // Scatter-add: an id that appears k times receives the sum of its k rows of gradient.
        const real* g = y.grad();
        real* dw = in[0].grad();
        for (std::size_t i = 0; i < ids.size(); ++i) {
            if (ids[i] == padding_idx) continue;
            real* row = dw + std::int64_t(ids[i]) * C;
            const real* gi = g + std::int64_t(i) * C;
            for (std::int64_t c = 0; c < C; ++c) row[c] += gi[c];
        }
    });
}

// ---- cross_entropy ------------------------------------------------------------------------------------------------

Tensor cross_entropy(const Tensor& logits, const std::vector<std::int32_t>& target, std::int32_t ignore_index,
                     real eps, CrossEntropyStats* stats) {
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
    Tensor lse = Tensor::empty(Shape{N});  // log Σ_j exp(x_ij): all that backward needs to rebuild p_ij
    const real* x = logits.data();
    real* l = lse.data();
    // Per-row terms, summed in row order afterwards: the loss is the same bit for bit whatever the threads.
    std::vector<double> row_loss(N, 0.0), row_nll(N, 0.0);
#pragma omp parallel for schedule(static) if (N * V >= kParallelGrain)
    for (std::int64_t i = 0; i < N; ++i) {
        if (target[i] == ignore_index) continue;
        const real* xr = x + i * V;
        real mx = *std::max_element(xr, xr + V);
        double total = 0, row_sum = 0;
        for (std::int64_t j = 0; j < V; ++j) {
            total += std::exp(double(xr[j] - mx));
            row_sum += xr[j];
        }
        const double lse_i = double(mx) + std::log(total);
        l[i] = real(lse_i);
        const double nll = lse_i - xr[target[i]];           // −log p_t
        const double smooth = lse_i - row_sum / double(V);  // (1/V) Σ_j −log p_j
        row_nll[i] = nll;
        row_loss[i] = (1.0 - eps) * nll + eps * smooth;
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
    if (!needs_grad({&logits}) || count == 0) return out;
    return record("cross_entropy", out, {logits}, [target, ignore_index, eps, N, V, count, lse](Tensor& y, std::vector<Tensor>& in) {
        // ∂loss/∂x_ij = (p_ij − (1−ε)·[j = t_i] − ε/V) / n   for counted rows, 0 for ignored ones.
        const real g = y.grad()[0] / real(count);
        const real *x = in[0].data(), *l = lse.data();
        real* dx = in[0].grad();
        const real off = eps / real(V), on = real(1) - eps + off;
#pragma omp parallel for schedule(static) if (N * V >= kParallelGrain)
        for (std::int64_t i = 0; i < N; ++i) {
            if (target[i] == ignore_index) continue;
            const real *xr = x + i * V;
            real* dr = dx + i * V;
            for (std::int64_t j = 0; j < V; ++j) dr[j] += g * (std::exp(xr[j] - l[i]) - off);
            dr[target[i]] -= g * (on - off);
        }
    });
}

TF_NAMESPACE_END
