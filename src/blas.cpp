// BLAS and thread settings. This is the one file that includes cblas.h (and omp.h outside kernels).
#include "tapeformer/blas.h"

#include <cblas.h>
#include <omp.h>

#include <thread>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

extern "C" {
void openblas_set_num_threads(int);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

TF_NAMESPACE_BEGIN

[[maybe_unused]] static void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                      const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                      std::int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

[[maybe_unused]] static void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
                      const double* A, std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C,
                      std::int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

// ---- gemm: one product split into tiles of C -------------------------------------------------------------
// Every product is split here, into tiles of C whose sizes depend on the product's shape only — never on
// the thread count — and the tiles are shared out among OpenMP's threads, each tile one single-threaded
// BLAS call over the whole inner dimension. (OpenBLAS's OpenMP build runs single-threaded inside a parallel
// region, and outside one for products below kSmallProduct; larger products always run inside one.) So
// each element of C is computed by the same kernel call, summing the same numbers in the same order, on
// 1, 2 or 16 threads: results are bit-identical whatever the thread count. (OpenBLAS's own threading
// splits a product by the thread count, and its single- and multi-threaded paths block the inner
// dimension differently on some kernel sets, e.g. Haswell with OPENBLAS_L2_SIZE on AMD EPYC.)

// Below this many multiply-adds a product is one tile (waking threads costs more than it saves); OpenBLAS
// keeps products up to this size single-threaded too (interface/gemm.c: 65536 × GEMM_MULTITHREAD_THRESHOLD 4).
namespace {

constexpr std::int64_t kSmallProduct = std::int64_t(1) << 18;
constexpr std::int64_t kMaxTiles = 8;    // enough to share among 1, 2, 4 or 8 threads evenly
constexpr std::int64_t kMinSplit = 256;  // a tile side is halved only while it has at least this much

struct Tiling {
    std::int64_t rows, cols;  // the size of a tile of C (the last row and column of tiles may be smaller)
    std::int64_t row_tiles, col_tiles;
};

// Halves the longer side of the tile while the product has work for more tiles: tiles of at least
// kMinSplit/2 rows or columns keep the cost of packing the operands small next to the multiply-adds.
Tiling tiling(std::int64_t M, std::int64_t N, std::int64_t K) {
    Tiling t{M, N, 1, 1};
    const std::int64_t work = M * N * K;
    std::int64_t tiles = 1;
    while (tiles < kMaxTiles && work >= kSmallProduct * tiles) {
        if (t.rows >= t.cols && t.rows >= kMinSplit) t.rows = (t.rows + 1) / 2;
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

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
          std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {  // BLAS leaves C alone only for beta = 1; make the empty sum explicit
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == real(0) ? real(0) : beta * C[i * ldc + j];
        return;
    }
    const Tiling t = tiling(M, N, K);
    const std::int64_t tiles = t.row_tiles * t.col_tiles;
    auto tile = [&](std::int64_t i) {
        const std::int64_t m0 = (i / t.col_tiles) * t.rows, n0 = (i % t.col_tiles) * t.cols;
        const std::int64_t m = std::min(t.rows, M - m0), n = std::min(t.cols, N - n0);
        const real* Ai = ta ? A + m0 : A + m0 * lda;  // rows m0.. of op(A): columns of A when stored transposed
        const real* Bi = tb ? B + n0 * ldb : B + n0;  // columns n0.. of op(B): rows of B when stored transposed
        gemm_impl(ta, tb, m, n, K, alpha, Ai, lda, Bi, ldb, beta, C + m0 * ldc + n0, ldc);
    };
    // A small product, or one inside another parallel region (attention's many small products), runs its
    // tiles on the calling thread without opening a region: even an inactive nested one costs libgomp a team
    // set-up and, with passive waiting, system calls, which outweighed decoding's 1×64·64×t products.
    if (M * N * K < kSmallProduct || omp_in_parallel()) {
        for (std::int64_t i = 0; i < tiles; ++i) tile(i);
        return;
    }
    // A large product that stays one tile (a thin C with a long inner dimension) still runs in a region, so
    // that OpenBLAS does not split it by the thread count.
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < tiles; ++i) tile(i);
}

void gemm_reference(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
                    std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc) {
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
            double acc = 0;
            for (std::int64_t k = 0; k < K; ++k) {
                real a = ta ? A[k * lda + i] : A[i * lda + k];
                real b = tb ? B[j * ldb + k] : B[k * ldb + j];
                acc += double(a) * double(b);
            }
            real c = beta == real(0) ? real(0) : beta * C[i * ldc + j];
            C[i * ldc + j] = c + alpha * real(acc);
        }
}

void set_threads(int n) {
    if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
    if (n <= 0) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

const char* blas_info() { return openblas_get_config(); }

const char* blas_core() { return openblas_get_corename(); }

void configure_runtime(char** argv) {
    bool changed = false;
    if (!std::getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        changed = true;
    }
    if (!std::getenv("OPENBLAS_CORETYPE") && std::strcmp(openblas_get_corename(), "Prescott") == 0) {
        const char* core = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : nullptr;
        if (core) {
            setenv("OPENBLAS_CORETYPE", core, 1);
            changed = true;
        }
    }
    if (changed) execv("/proc/self/exe", argv);  // only returns on failure: carry on as we are
}

TF_NAMESPACE_END
