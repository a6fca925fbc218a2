// Every product of the library: split into tiles of C whose sizes depend on its shape (and the library that
// runs it) only, planned in groups, and shared out among OpenMP's threads, each tile one single-threaded call
// to the library below it (blas_backends.h: OpenBLAS, libxsmm, oneDNN). And the product timer of `bench train
// --profile`.
#include "tapeformer/blas.h"
#include "tapeformer/parallel.h"
#include "tapeformer/pool.h"
#include "tapeformer/reference_ops.h"

#include "blas_backends.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

TF_NAMESPACE_BEGIN

// ---- gemm: one product split into tiles of C -------------------------------------------------------------
// Every product is split here, into tiles of C whose sizes depend on the product's shape only (and on which
// library runs its tiles: tiling's rows_first) — never on the thread count — and the tiles are shared out
// among OpenMP's threads, each tile one single-threaded BLAS call over the whole inner dimension: libxsmm or
// sgemm for small products (kSmallProduct, blas.h), oneDNN's matmul for the others where it has AVX-512
// kernels (cpu_has_avx512 below). (OpenBLAS's OpenMP build runs single-threaded inside a parallel region, and
// outside one for small products; larger products always run inside one.) So each element of C is computed
// by the same kernel call, summing the same numbers in the same order, on 1, 2 or 16 threads: results are
// bit-identical whatever the thread count. (OpenBLAS's own threading splits a product by the thread count,
// and its single- and multi-threaded paths block the inner dimension differently on some kernel sets, e.g.
// Haswell with OPENBLAS_L2_SIZE on AMD EPYC.)

namespace {

constexpr std::int64_t kMaxTiles = 4;    // shared evenly among 1, 2 or 4 threads; more tiles cost more packing
constexpr std::int64_t kMinSplit = 256;  // a tile side is halved only while it has at least this much

struct Tiling {
    std::int64_t rows, cols;  // the size of a tile of C (the last row and column of tiles may be smaller)
    std::int64_t row_tiles, col_tiles;
};

// Halves the longer side of the tile while the product has work for more tiles: tiles of at least
// kMinSplit/2 rows or columns keep the cost of packing the operands small next to the multiply-adds.
// `rows_first`: halves the rows while they have kMinSplit, whichever side is longer. A band of whole rows of
// C and of A (not transposed) is dense where the matrices are, and oneDNN 2.6 runs a dense fp32 product with
// its brgemm kernel, in the scratch space run_product hands it, where a strided one goes to its gemm:jit,
// which mallocs packing buffers on every call: glibc keeps them, some 25 MB at the large benchmark config's
// peak (bench/README.md, 2026-11-28 evening). Only for oneDNN's fp32 tiles: a bf16 step ran 14% slower so.
Tiling tiling(std::int64_t M, std::int64_t N, std::int64_t K, bool rows_first) {
    Tiling t{M, N, 1, 1};
    const std::int64_t work = M * N * K;
    std::int64_t tiles = 1;
    while (tiles < kMaxTiles && work >= kSmallProduct * tiles) {
        if ((rows_first || t.rows >= t.cols) && t.rows >= kMinSplit) t.rows = (t.rows + 1) / 2;
        else if (t.cols >= kMinSplit) t.cols = (t.cols + 1) / 2;
        else if (t.rows >= kMinSplit / 8) t.rows = (t.rows + 1) / 2;  // a small C with a long inner dimension
        else break;
        t.row_tiles = (M + t.rows - 1) / t.rows;
        t.col_tiles = (N + t.cols - 1) / t.cols;
        tiles = t.row_tiles * t.col_tiles;
    }
    return t;
}

}  // namespace

// ---- product timing ----------------------------------------------------------------------------------

namespace {

ProductTimer* g_timer = nullptr;  // the one that lives, if any
thread_local bool t_in_product = false;

// Wall time since `start` in ms, over the size of the team this thread is in (1 outside a parallel region):
// what each of the team's threads adds, so that their shares sum to the wall time once.
double team_share_ms(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / omp_get_num_threads();
}

// Adds the wall time of the product it spans to g_timer, unless a product encloses it; inside a parallel
// region, that time over the team's size (ProductTimer). `is_call`: false for a product's own work done apart
// (a Bf16Copy's rounding), timed but not counted as a call.
class TimedProduct {
public:
    explicit TimedProduct(bool is_call = true) : on_(g_timer && !t_in_product), is_call_(is_call) {
        if (!on_) return;
        t_in_product = true;
        start_ = std::chrono::steady_clock::now();
    }
    ~TimedProduct() {
        if (!on_) return;
        const double ms = team_share_ms(start_);
        double& total = g_timer->ms;
        std::int64_t& calls = g_timer->calls;
#pragma omp atomic
        total += ms;
        if (is_call_) {
#pragma omp atomic
            ++calls;
        }
        t_in_product = false;
    }
    TimedProduct(const TimedProduct&) = delete;
    TimedProduct& operator=(const TimedProduct&) = delete;

private:
    bool on_, is_call_;
    std::chrono::steady_clock::time_point start_;
};

// Adds the wall time of the bf16 rounding it spans to g_timer's rounding_ms, as TimedProduct adds its time
// (rounding is done within a product's span, so counted in its time too).
class TimedRounding {
public:
    TimedRounding() : on_(g_timer != nullptr), start_(std::chrono::steady_clock::now()) {}
    ~TimedRounding() {
        if (!on_) return;
        const double ms = team_share_ms(start_);
        double& total = g_timer->rounding_ms;
#pragma omp atomic
        total += ms;
    }
    TimedRounding(const TimedRounding&) = delete;
    TimedRounding& operator=(const TimedRounding&) = delete;

private:
    bool on_;
    std::chrono::steady_clock::time_point start_;
};

}  // namespace

ProductTimer::ProductTimer() {
    if (g_timer) throw std::logic_error("ProductTimer: another one is alive; only one may live at a time");
    g_timer = this;
}

ProductTimer::~ProductTimer() { g_timer = nullptr; }

// ---- products, alone or in groups ----------------------------------------------------------------------
// Every product goes through gemm_group: gemm and gemm_batched are groups of one. A group is planned on
// the calling thread (products over held matrices run there and then; bf16 operands of large products are
// rounded), then its work items — tiles of large products, chunks of small batched ones, and the caller's
// jobs — run in one parallel region, or on this thread when it is already in one or the work is small.

namespace {

constexpr std::int64_t kBatchChunk = 16;  // small products of a batch taken together as one work item

// One product of a group, planned.
struct Planned {
    GemmCall call;
    bool large = false;   // each product of the batch has at least kSmallProduct multiply-adds: tiled
    Tiling tiling{};      // of one product of the batch (large only)
    std::int64_t items = 0;
    const bf16_t* A16 = nullptr;  // bf16 precision, large products: the rounded operands, dense, by product
    const bf16_t* B16 = nullptr;
};

[[maybe_unused]] std::int64_t a_rows(const GemmCall& c) { return c.trans_a ? c.K : c.M; }  // A as stored
[[maybe_unused]] std::int64_t a_cols(const GemmCall& c) { return c.trans_a ? c.M : c.K; }
[[maybe_unused]] std::int64_t b_rows(const GemmCall& c) { return c.trans_b ? c.N : c.K; }  // B as stored
[[maybe_unused]] std::int64_t b_cols(const GemmCall& c) { return c.trans_b ? c.K : c.N; }

// Whether large fp32 products run as oneDNN tiles (on CPUs with AVX-512) rather than sgemm's.
bool onednn_fp32_tiles() {
#ifndef TAPEFORMER_F64
    return g_precision != Precision::BF16 && cpu_has_avx512();
#else
    return false;
#endif
}

// Rows [m0, m0 + m) and columns [n0, n0 + n) of C_e, the e-th product of the batch: α·op(A)·op(B) + β·C,
// or + the bias. One single-threaded call.
void compute_block(const Planned& p, std::int64_t e, std::int64_t m0, std::int64_t n0, std::int64_t m, std::int64_t n) {
    const GemmCall& c = p.call;
    real* C = c.C + e * c.c_step + m0 * c.ldc + n0;
    real beta = c.beta;
#ifndef TAPEFORMER_F64
    // oneDNN adds a bias in its kernel; elsewhere C starts as the bias rows, and the product is added to them
    // (the same sum, rounded by other kernels: the last bits differ).
    const bool onednn = p.large && (g_precision == Precision::BF16 || onednn_fp32_tiles());
#else
    const bool onednn = false;
#endif
    // (oneDNN 2.x scales its bias by an output scale α: only for α = 1, a linear layer's.)
    const bool kernel_bias = c.bias && onednn && c.alpha == real(1);
    if (c.bias && !kernel_bias) {
        for (std::int64_t i = 0; i < m; ++i) std::memcpy(C + i * c.ldc, c.bias + n0, std::size_t(n) * sizeof(real));
        beta = 1;
    }
    if (c.K == 0) {  // BLAS leaves C alone only for beta = 1; make the empty sum explicit
        for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) C[i * c.ldc + j] = beta == real(0) ? real(0) : beta * C[i * c.ldc + j];
        return;
    }
#ifndef TAPEFORMER_F64
    if (product_precision(c.M * c.N * c.K) == Precision::BF16) {  // (A may be null: its copy is all there is)
        const std::int64_t ac = a_cols(c), bc = b_cols(c);
        const bf16_t* A16 = p.A16 + e * a_rows(c) * ac;
        const bf16_t* B16 = p.B16 + e * b_rows(c) * bc;
        const bf16_t* A16i = c.trans_a ? A16 + m0 : A16 + m0 * ac;
        const bf16_t* B16i = c.trans_b ? B16 + n0 * bc : B16 + n0;
        return onednn_tile(TileKey{c.trans_a, c.trans_b, m, n, c.K, ac, bc, c.ldc, c.alpha, kernel_bias ? 0 : beta, true, kernel_bias},
                           A16i, B16i, C, kernel_bias ? c.bias + n0 : nullptr);
    }
#endif
    const real* A = c.A + e * c.a_step;
    const real* B = c.B + e * c.b_step;
    const real* Ai = c.trans_a ? A + m0 : A + m0 * c.lda;  // rows m0.. of op(A): columns of A when stored transposed
    const real* Bi = c.trans_b ? B + n0 * c.ldb : B + n0;  // columns n0.. of op(B): rows of B when stored transposed
#ifndef TAPEFORMER_F64
    if (onednn)
        return onednn_tile(TileKey{c.trans_a, c.trans_b, m, n, c.K, c.lda, c.ldb, c.ldc, c.alpha, kernel_bias ? 0 : beta, false, kernel_bias},
                           Ai, Bi, C, kernel_bias ? c.bias + n0 : nullptr);
#endif
    gemm_impl(c.trans_a, c.trans_b, m, n, c.K, c.alpha, Ai, c.lda, Bi, c.ldb, beta, C, c.ldc);
}

// Work item i of a planned product: a tile of one product of the batch (large), or kBatchChunk products.
void run_item(const Planned& p, std::int64_t i) {
    const GemmCall& c = p.call;
    if (!p.large) {
        for (std::int64_t e = i * kBatchChunk; e < std::min(c.batch, (i + 1) * kBatchChunk); ++e) compute_block(p, e, 0, 0, c.M, c.N);
        return;
    }
    const Tiling& t = p.tiling;
    const std::int64_t tiles = t.row_tiles * t.col_tiles, e = i / tiles, tile = i % tiles;
    const std::int64_t m0 = (tile / t.col_tiles) * t.rows, n0 = (tile % t.col_tiles) * t.cols;
    compute_block(p, e, m0, n0, std::min(t.rows, c.M - m0), std::min(t.cols, c.N - n0));
}

#ifndef TAPEFORMER_F64
// The bf16 copy of an operand of a large product: X (rows, cols) with row stride ld, `batch` of them `step`
// apart: the caller's (`given`, bf16_copy's), or the copy an earlier product of the group made of the same
// matrices (a linear layer's backward multiplies dy by W and, transposed, by x: dy is rounded once), or
// rounded here into `buffer`.
const bf16_t* round_operand(const float* X, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                            std::int64_t step, const Bf16Copy* given, std::vector<bf16_t>& buffer, const Planned* plans,
                            std::size_t planned) {
    if (given) {
        if (batch != 1 || given->rows() != rows || given->cols() != cols)
            throw std::logic_error("gemm: a bf16 copy of " + std::to_string(given->rows()) + "x" + std::to_string(given->cols()) +
                                   " given for an operand of " + std::to_string(batch) + "x" + std::to_string(rows) + "x" +
                                   std::to_string(cols));
        return given->data();
    }
    for (std::size_t k = 0; k < planned; ++k) {
        const GemmCall& o = plans[k].call;
        if (!plans[k].large || o.batch != batch) continue;
        if (o.A == X && a_rows(o) == rows && a_cols(o) == cols && o.lda == ld && o.a_step == step) return plans[k].A16;
        if (o.B == X && b_rows(o) == rows && b_cols(o) == cols && o.ldb == ld && o.b_step == step) return plans[k].B16;
    }
    const TimedRounding timed;
    const std::int64_t n = rows * cols;
    buffer.resize(std::size_t(batch * n));
    for (std::int64_t e = 0; e < batch; ++e) round_to_bf16(X + e * step, rows, cols, ld, buffer.data() + e * n);
    return buffer.data();
}
#endif

}  // namespace

void gemm_group(std::initializer_list<GemmCall> products, std::int64_t jobs, const std::function<void(std::int64_t)>& job) {
    const TimedProduct timed;
    if (reference_mode()) {  // every product as three loops, one after another, on this thread (reference_ops.cpp)
        for (const GemmCall& c : products)
            for (std::int64_t e = 0; e < c.batch; ++e) {
                real* C = c.C + e * c.c_step;
                real beta = c.beta;
                if (c.bias) {  // C starts as the bias on every row
                    for (std::int64_t i = 0; i < c.M; ++i) std::memcpy(C + i * c.ldc, c.bias, std::size_t(c.N) * sizeof(real));
                    beta = 1;
                }
#ifndef TAPEFORMER_F64
                if (held_int8(c)) {  // --precision int8 over a held weight: the int8 product, plainly
                    reference::gemm_int8(c.M, c.N, c.K, c.alpha, c.A, c.lda, c.B, c.ldb, beta, C, c.ldc);
                    continue;
                }
#endif
                reference::gemm(c.trans_a, c.trans_b, c.M, c.N, c.K, c.alpha, c.A + e * c.a_step, c.lda, c.B + e * c.b_step,
                                c.ldb, beta, C, c.ldc);
            }
        for (std::int64_t i = 0; i < jobs; ++i) job(i);
        return;
    }
    // The plans, on the stack: a group is a few products, and attention_heads calls gemm thousands of times a
    // step, where a heap allocation per call would show.
    constexpr std::size_t kMaxProducts = 8;
    if (products.size() > kMaxProducts) throw std::logic_error("gemm_group: more than 8 products in one group");
    std::array<Planned, kMaxProducts> plans;
    std::size_t planned_count = 0;
    // bf16 copies of large products' operands, kept for the thread's next call (jobs must not call gemm).
    thread_local std::vector<std::vector<bf16_t>> rounded;
    std::int64_t items = 0, small_work = 0;
    bool any_large = false;
    for (const GemmCall& c : products) {
        if (c.M == 0 || c.N == 0 || c.batch == 0) continue;
        Planned p{c};
#ifndef TAPEFORMER_F64
        if (held_product(c)) continue;  // a bias, if any, is in C already, and the product added to it
#endif
        const std::int64_t work = c.M * c.N * c.K;
        p.large = work >= kSmallProduct;
        if (p.large) {
            p.tiling = tiling(c.M, c.N, c.K, onednn_fp32_tiles());
            p.items = c.batch * p.tiling.row_tiles * p.tiling.col_tiles;
            any_large = true;
#ifndef TAPEFORMER_F64
            if (product_precision(work) == Precision::BF16) {  // A and B rounded into dense bf16 copies
                const std::size_t slot = 2 * planned_count;
                if (rounded.size() < slot + 2) rounded.resize(slot + 2);
                p.A16 = round_operand(c.A, a_rows(c), a_cols(c), c.lda, c.batch, c.a_step, c.a16, rounded[slot], plans.data(),
                                      planned_count);
                p.B16 = round_operand(c.B, b_rows(c), b_cols(c), c.ldb, c.batch, c.b_step, c.b16, rounded[slot + 1], plans.data(),
                                      planned_count);
            }
#endif
        } else {
            p.items = (c.batch + kBatchChunk - 1) / kBatchChunk;
            small_work += c.batch * work;
        }
        items += p.items;
        plans[planned_count++] = p;
    }
    // Item i: the products' items in order, then the jobs.
    auto run = [&](std::int64_t i) {
        for (std::size_t k = 0; k < planned_count; ++k) {
            if (i < plans[k].items) return run_item(plans[k], i);
            i -= plans[k].items;
        }
        job(i);
    };
    const std::int64_t total = items + jobs;
    // A region unless this thread is in one already or the work is small (waking the threads costs as much
    // as a small product). A large product always runs in one, so that OpenBLAS, inside it, does not split
    // a tile by the thread count.
    // (A plain loop otherwise: even an inactive region costs a team's setup, which shows on the small
    // products of attention_heads.)
    const bool threaded = !omp_in_parallel() && (any_large || (total > 1 && small_work >= kParallelGrain));
    if (!threaded) {
        for (std::int64_t i = 0; i < total; ++i) run(i);
        return;
    }
#pragma omp parallel for schedule(dynamic)
    for (std::int64_t i = 0; i < total; ++i) run(i);
}

// ---- bf16 copies shared by products -----------------------------------------------------------------------

Bf16Copy::Bf16Copy(const real* X, std::int64_t rows, std::int64_t cols, std::int64_t ld, ColumnSums sums, ReluGate gate)
    : rows_(rows), cols_(cols) {
#ifndef TAPEFORMER_F64
    const TimedProduct timed(false);  // the products' own work: they would round X themselves
    const TimedRounding rounding;
    storage_ = pool_alloc((std::size_t(rows * cols) * sizeof(bf16_t) + sizeof(real) - 1) / sizeof(real));
    bf16_t* values = reinterpret_cast<bf16_t*>(storage_);
    values_ = values;
    if (sums.data || gate.output) {
        std::vector<real> unasked;  // the gated pass always sums; sums nobody asked for go here
        if (!sums.data) {
            unasked.resize(std::size_t(cols));
            sums = {unasked.data(), true};
        }
        round_to_bf16_summing_columns(X, rows, cols, ld, values, sums.data, sums.overwrite, gate.output, gate.scale);
    } else {
        round_to_bf16(X, rows, cols, ld, values);
    }
#else
    (void)X, (void)ld, (void)sums, (void)gate;
    throw std::logic_error("Bf16Copy: the float64 build has no bf16 products");
#endif
}

Bf16Copy::~Bf16Copy() { pool_free(storage_); }

std::shared_ptr<const Bf16Copy> bf16_copy(const real* X, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                          std::int64_t multiply_adds, ColumnSums sums, ReluGate gate) {
#ifndef TAPEFORMER_F64
    if (!reference_mode() && product_precision(multiply_adds) == Precision::BF16)  // (fp32 below kSmallProduct)
        return std::make_shared<const Bf16Copy>(X, rows, cols, ld, sums, gate);
#endif
    (void)X, (void)rows, (void)cols, (void)ld, (void)multiply_adds, (void)sums, (void)gate;
    return nullptr;
}

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
          std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc) {
    gemm_group({GemmCall{ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc}});
}

void gemm_batched(bool ta, bool tb, std::int64_t batch, std::int64_t M, std::int64_t N, std::int64_t K, real alpha,
                  const real* A, std::int64_t lda, std::int64_t a_step, const real* B, std::int64_t ldb,
                  std::int64_t b_step, real beta, real* C, std::int64_t ldc, std::int64_t c_step) {
    gemm_group({GemmCall{ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, a_step, b_step, c_step}});
}

TF_NAMESPACE_END
