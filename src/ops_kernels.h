// What the op files share (ops.cpp, fused_ops.cpp, study_ops.cpp): argument checks, gradient accumulation,
// broadcasting, the column-blocked sums over rows, softmax's rows, dropout's counter-based draws, and the
// layer-norm kernel. Private to those files; in an anonymous namespace as they were in ops.cpp, but for what
// layer_norm_impl's signature names.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "tapeformer/autograd.h"
#include "tapeformer/blas.h"
#include "tapeformer/error.h"
#include "tapeformer/lanes.h"
#include "tapeformer/ops.h"
#include "tapeformer/parallel.h"

TF_NAMESPACE_BEGIN

namespace {

inline void require_defined(const char* op, const Tensor& t, const char* what) {
    if (!t.defined()) fail(op, std::string(what) + " is an undefined tensor");
}

constexpr std::int64_t kColumnBlock = 64;

inline std::int64_t column_blocks(std::int64_t Cn) { return (Cn + kColumnBlock - 1) / kColumnBlock; }

// Calls f(c0, c1) for blocks of 64 of the Cn columns, the blocks split across threads when `work` (the
// values touched) is worth it. Sums that a thread keeps to its own columns, adding rows in order, do not
// depend on the thread count.
template <class F>
void over_column_blocks(std::int64_t Cn, std::int64_t work, F f) {
    const std::int64_t blocks = column_blocks(Cn);
#pragma omp parallel for schedule(static) if (work >= kParallelGrain && blocks > 1)
    for (std::int64_t blk = 0; blk < blocks; ++blk) f(blk * kColumnBlock, std::min(Cn, (blk + 1) * kColumnBlock));
}

// dst.data[i] = v for a gradient not yet written, else += v (Tensor::grad_target): for a backward that
// gives each value of its operand's gradient exactly one contribution. In a hot loop, use write_or_add
// (the branch outside the loop, so that both loops vectorise).
inline void accumulate(const GradTarget& dst, std::int64_t i, real v) {
    dst.data[i] = dst.overwrite ? v : dst.data[i] + v;
}

// dst[i] (=|+=) f(i) for i in [0, n), in parallel. f captures by value ([=]) and each thread takes its own
// copy (firstprivate): with f shared, GCC reloads the operands' pointers from it in every iteration and
// vectorises with gathers, four times slower (seen in relu's and dropout's backward).
template <class F>
void write_or_add(const GradTarget& dst, std::int64_t n, F f) {
    real* d = dst.data;
    if (dst.overwrite) {
#pragma omp parallel for simd schedule(static) firstprivate(f) if (n >= kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i) d[i] = f(i);
    } else {
#pragma omp parallel for simd schedule(static) firstprivate(f) if (n >= kParallelGrain)
        for (std::int64_t i = 0; i < n; ++i) d[i] += f(i);
    }
}

// dst[c] (=|+=) Σ_r f(r, c) for columns [c0, c1) of an (R, ·) layout, adding rows in order: each column's sum
// is the same whatever range it is summed in.
template <class F>
void sum_columns(std::int64_t R, std::int64_t c0, std::int64_t c1, const GradTarget& dst, F f) {
    real* out = dst.data;
    std::int64_t r = 0;
    if (dst.overwrite && R > 0) {
#pragma omp simd
        for (std::int64_t c = c0; c < c1; ++c) out[c] = f(0, c);
        r = 1;
    }
    for (; r < R; ++r)
#pragma omp simd
        for (std::int64_t c = c0; c < c1; ++c) out[c] += f(r, c);
}

// sum_columns over the columns of block `blk` (column_blocks) of an (R, Cn) layout.
template <class F>
void sum_column_block(std::int64_t R, std::int64_t Cn, std::int64_t blk, const GradTarget& dst, F f) {
    sum_columns(R, blk * kColumnBlock, std::min(Cn, (blk + 1) * kColumnBlock), dst, f);
}

// dst[c] += Σ_r f(r, c) for an (R, Cn) layout: the gradient of something broadcast over rows (a bias).
template <class F>
void sum_over_rows(std::int64_t R, std::int64_t Cn, GradTarget dst, F f) {
    const std::int64_t blocks = column_blocks(Cn);
#pragma omp parallel for schedule(static) if (R * Cn >= kParallelGrain && blocks > 1)
    for (std::int64_t blk = 0; blk < blocks; ++blk) sum_column_block(R, Cn, blk, dst, f);
}

// ---- broadcasting ---------------------------------------------------------------------------------------
// Both operands are padded on the left to four axes; a stride of 0 repeats a value along an axis.
struct Broadcast {
    Shape out;
    std::int64_t n[4];
    std::int64_t sa[4], sb[4];
};

inline void padded_strides(const Shape& s, const std::int64_t (&n)[4], std::int64_t (&stride)[4]) {
    std::int64_t d[4] = {1, 1, 1, 1};
    for (int i = 0; i < s.rank; ++i) d[4 - s.rank + i] = s.dims[i];
    std::int64_t st = 1;
    for (int i = 3; i >= 0; --i) {
        stride[i] = (d[i] == 1 && n[i] != 1) ? 0 : st;
        st *= d[i];
    }
}

inline Broadcast broadcast(const char* op, const Shape& a, const Shape& b) {
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

// True when `small`, without its leading 1s, is the trailing part of `out`: (C) or (1, C) of (B, T, C).
inline bool is_trailing(const Shape& small, const Shape& out) {
    int first = 0;
    while (first < small.rank && small.dims[first] == 1) ++first;
    const int kept = small.rank - first;
    if (kept > out.rank) return false;
    for (int i = 0; i < kept; ++i)
        if (small.dims[first + i] != out.dims[out.rank - kept + i]) return false;
    return true;
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
        write_or_add(in[0].grad_target(), y.numel(), [=](std::int64_t i) { return g[i] * df(x[i]); });
    });
}

// The shared body of add / sub / mul / div. `fwd(x, y)` is the value, `da(x, y, g)` and `db(x, y, g)` the
// contributions of one output element to the gradients of its two operands. With `reads_values` false (add,
// sub: derivatives that are constants) backward never asks for the operands' values, so that they may have
// been dropped (Tensor::drop_values): da and db are handed the gradient's own values in their place, unread.
template <bool reads_values = true, class Fwd, class DA, class DB>
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
        // (g has n ≥ either operand's values: every index below stays inside it)
        const real *x0 = reads_values ? in[0].data() : g, *x1 = reads_values ? in[1].data() : g;
        const std::int64_t n = y.numel();
        // An operand that was not stretched receives one contribution per element: safe to parallelise.
        // One stretched along leading axes only ((C) or (T, C) against (B, T, C)) while the other is full
        // size gets a sum over the rows of an (n / Cn, Cn) layout: split by columns (sum_over_rows).
        // Any other stretched operand adds several contributions to one element in no fixed pattern: its
        // gradient is zeroed first (grad()) and the loop stays serial.
        if (in[0].requires_grad()) {
            const std::int64_t cols = in[0].numel();
            if (cols < n && in[1].numel() == n && is_trailing(in[0].shape(), bc.out)) {
                sum_over_rows(n / cols, cols, in[0].grad_target(), [&](std::int64_t r, std::int64_t c) {
                    return da(x0[c], x1[r * cols + c], g[r * cols + c]);
                });
            } else if (cols == n && in[1].numel() == n) {  // the same shape
                write_or_add(in[0].grad_target(), n, [=](std::int64_t i) { return da(x0[i], x1[i], g[i]); });
            } else if (cols == n) {
                const GradTarget g0 = in[0].grad_target();
                for_each_broadcast(bc, true, [&](std::int64_t o, std::int64_t ia, std::int64_t ib) {
                    accumulate(g0, ia, da(x0[ia], x1[ib], g[o]));
                });
            } else {
                real* g0 = in[0].grad();
                for_each_broadcast(bc, false, [&](std::int64_t o, std::int64_t ia, std::int64_t ib) {
                    g0[ia] += da(x0[ia], x1[ib], g[o]);
                });
            }
        }
        if (in[1].requires_grad()) {
            const std::int64_t cols = in[1].numel();
            if (cols < n && in[0].numel() == n && is_trailing(in[1].shape(), bc.out)) {
                sum_over_rows(n / cols, cols, in[1].grad_target(), [&](std::int64_t r, std::int64_t c) {
                    return db(x0[r * cols + c], x1[c], g[r * cols + c]);
                });
            } else if (cols == n && in[0].numel() == n) {
                write_or_add(in[1].grad_target(), n, [=](std::int64_t i) { return db(x0[i], x1[i], g[i]); });
            } else if (cols == n) {
                const GradTarget g1 = in[1].grad_target();
                for_each_broadcast(bc, true, [&](std::int64_t o, std::int64_t ia, std::int64_t ib) {
                    accumulate(g1, ib, db(x0[ia], x1[ib], g[o]));
                });
            } else {
                real* g1 = in[1].grad();
                for_each_broadcast(bc, false, [&](std::int64_t o, std::int64_t ia, std::int64_t ib) {
                    g1[ib] += db(x0[ia], x1[ib], g[o]);
                });
            }
        }
    });
}

// ---- softmax's rows (softmax and log_softmax in ops.cpp, attention_heads in fused_ops.cpp) --------------------

// One row: y = softmax(x + mask) over N values, the mask read with stride mstride (mask may be null). In
// place when y == x. A row masked everywhere gives zeros.
inline void softmax_row(const real* x, const real* mask, std::int64_t mstride, std::int64_t N, real* y) {
    if (mask)
        for (std::int64_t j = 0; j < N; ++j) y[j] = x[j] + mask[j * mstride];
    else if (y != x)
        std::memcpy(y, x, N * sizeof(real));
    const real mx = lane_max(y, N);
    if (mx == -std::numeric_limits<real>::infinity()) {  // everything masked
        std::fill(y, y + N, real(0));
        return;
    }
    const real total = lane_sum(N, [&](std::int64_t j) { return y[j] = exp_fast(y[j] - mx); });
    const real inv = real(1) / total;
    for (std::int64_t j = 0; j < N; ++j) y[j] *= inv;
}

// One row of softmax's backward, dx_j (=|+=) y_j (g_j − Σ_k g_k y_k), from the output y and its gradient g.
inline void softmax_backward_row(const real* g, const real* y, std::int64_t N, real* dx, bool overwrite) {
    const real dot = lane_sum(N, [&](std::int64_t j) { return g[j] * y[j]; });
    if (overwrite)
        for (std::int64_t j = 0; j < N; ++j) dx[j] = y[j] * (g[j] - dot);
    else
        for (std::int64_t j = 0; j < N; ++j) dx[j] += y[j] * (g[j] - dot);
}

}  // namespace

// ---- dropout's draws (dropout in ops.cpp; relu_dropout, add_dropout_layer_norm, attention_heads) -------------
// Outside the anonymous namespace: layer_norm_impl, shared by the files, takes one.

// Inverted dropout's mask, drawn from counters: element i of an op's n values survives when its 32-bit
// uniform draw is at least p·2³². Draws 2k and 2k + 1 are the low and the high half of one 64-bit hash,
// hash64(seed, base + k) (random.h): one hash serves two values, which halves the draws' cost where
// the hash's 64-bit multiplies are emulated (AVX2 has none). Constructing one reserves ⌈n/2⌉ counters from the
// Rng; backward draws the same counters again instead of storing the mask.
struct DropoutDraws {
    std::uint64_t seed = 0, base = 0;
    std::uint32_t threshold = 0;  // p·2³², rounded down: below 2³² for every p < 1
    real keep_scale = 1;          // 1/(1−p)
    DropoutDraws() = default;     // draws nothing: for an op that does not drop
    DropoutDraws(Rng& rng, std::int64_t n, real p)
        : seed(rng.seed), base(rng.reserve((static_cast<std::uint64_t>(n) + 1) / 2)),
          threshold(static_cast<std::uint32_t>(double(p) * 0x1.0p32)), keep_scale(real(1) / (real(1) - p)) {}
    std::uint32_t draw(std::int64_t i) const {
        return static_cast<std::uint32_t>(hash64(seed, base + std::uint64_t(i) / 2) >> (32 * (i & 1)));
    }
    bool keeps(std::int64_t i) const { return draw(i) >= threshold; }
    real apply(std::int64_t i, real v) const { return keeps(i) ? v * keep_scale : real(0); }
    // y[j] = apply(first + j, x[j]) for j in [0, n); y may be x. apply's bits, in chunks whose draws are made
    // first (draws_n), so that both loops vectorise.
    void apply_n(std::int64_t first, std::int64_t n, const real* x, real* y) const {
        const std::uint32_t th = threshold;
        const real k = keep_scale;
        alignas(64) std::uint32_t u[kChunk];
        for (std::int64_t c = 0; c < n; c += kChunk) {
            const std::int64_t m = std::min(kChunk, n - c);
            draws_n(first + c, m, u);
#pragma omp simd
            for (std::int64_t j = 0; j < m; ++j) y[c + j] = u[j] >= th ? x[c + j] * k : real(0);
        }
    }
    // kept[j] = 1 where value first + j survives, else 0, for j in [0, n): keeps() as 32-bit flags, as wide as
    // the floats they select later, so that a loop over both vectorises.
    void keep_flags_n(std::int64_t first, std::int64_t n, std::uint32_t* kept) const {
        const std::uint32_t th = threshold;
        for (std::int64_t c = 0; c < n; c += kChunk) {
            const std::int64_t m = std::min(kChunk, n - c);
            std::uint32_t* u = kept + c;
            draws_n(first + c, m, u);
#pragma omp simd
            for (std::int64_t j = 0; j < m; ++j) u[j] = u[j] >= th;
        }
    }

  private:
    static constexpr std::int64_t kChunk = 256;  // values a chunk: their draws stay in L1
    // u[j] = draw(first + j) for j in [0, n), n <= kChunk. The whole hashes are written as they fall, low half
    // first (the byte order of x86 and every other little-endian CPU), after a first value that is a high half.
    void draws_n(std::int64_t first, std::int64_t n, std::uint32_t* u) const {
        if (n <= 0) return;
        std::int64_t j = 0;
        if (first & 1) u[j++] = draw(first);
        const std::uint64_t s = seed, at = base + std::uint64_t(first + j) / 2;
        const std::int64_t pairs = (n - j) / 2;
        alignas(64) std::uint64_t h[kChunk / 2];
#pragma omp simd
        for (std::int64_t k = 0; k < pairs; ++k) h[k] = hash64(s, at + std::uint64_t(k));
        static_assert(sizeof h[0] == 2 * sizeof u[0] && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
        std::memcpy(u + j, h, std::size_t(pairs) * sizeof h[0]);
        j += 2 * pairs;
        if (j < n) u[j] = draw(first + j);
    }
};

// y = dropout(x) over n values (y may be x), in pieces of 4096 values split over the threads; then, while the
// piece is still in L1, then(y + c0, m) on each (a fused op's own step: relu_dropout's ReLU).
template <class Then>
void dropout_in_pieces(const DropoutDraws& draws, std::int64_t n, const real* x, real* y, Then then) {
    constexpr std::int64_t kPiece = 4096;
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (std::int64_t c0 = 0; c0 < n; c0 += kPiece) {
        const std::int64_t m = std::min(kPiece, n - c0);
        draws.apply_n(c0, m, x + c0, y + c0);
        then(y + c0, m);
    }
}

inline void check_dropout_probability(const char* op, real p) {
    if (!(p >= 0 && p < 1)) fail(op, "probability must be in [0, 1), got " + std::to_string(p));
}

// The argument checks of layer_norm, add_layer_norm and add_dropout_layer_norm (r: the residual or null), made
// before either form runs (layer_norm_impl, or the reference one in reference mode).
void check_layer_norm(const char* op, const Tensor& x, const Tensor* r, const Tensor& gamma, const Tensor& beta);

// The kernel of layer_norm, add_layer_norm and add_dropout_layer_norm (ops.cpp, beside layer_norm).
Tensor layer_norm_impl(const char* op, const Tensor& x, const Tensor* r, const Tensor& gamma, const Tensor& beta,
                       real eps, const DropoutDraws* drop = nullptr);

TF_NAMESPACE_END
