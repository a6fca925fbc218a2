// What the products of blas.cpp call below them, one file per library: OpenBLAS's sgemm and dgemm
// (blas_openblas.cpp), libxsmm's small-product kernels (blas_xsmm.cpp), oneDNN's tiles, bf16 rounding and
// held matrices (blas_onednn.cpp). Private to those four files: no third-party type appears here.
#pragma once
#include <cstdint>
#include <tuple>

#include "tapeformer/blas.h"

TF_NAMESPACE_BEGIN

// kSmallProduct (blas.h): below it a product is one tile, libxsmm's, and fp32 in bf16 precision.

// ---- OpenBLAS (blas_openblas.cpp) ---------------------------------------------------------------------------
// Whether small fp32 products go to libxsmm: unless OpenBLAS runs its SkylakeX (or Cooperlake) kernels.
bool small_products_on_xsmm();
// One tile, one single-threaded call: libxsmm where it takes the product (xsmm_product), else sgemm; dgemm.
void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
               std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);
void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A,
               std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc);

// ---- libxsmm (blas_xsmm.cpp) --------------------------------------------------------------------------------
// C (M, N) = α op(A) op(B) + β C, row-major, through libxsmm; false where it has no kernel for the shape.
bool xsmm_product(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                  std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc);

// ---- oneDNN, bf16, int8 and held matrices (blas_onednn.cpp) -------------------------------------------------------
extern Precision g_precision;  // set_precision's

// The precision a product of this many multiply-adds runs in: g_precision, but fp32 for a product below
// kSmallProduct in bf16 precision (blas.h). Tiled products (blas.cpp) and held ones (FrozenMatrices) ask it.
inline Precision product_precision(std::int64_t multiply_adds) {
    return g_precision == Precision::BF16 && multiply_adds < kSmallProduct ? Precision::FP32 : g_precision;
}

// x (rows, cols) with row stride ld -> out (rows, cols), dense.
void round_to_bf16(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, bf16_t* out);
// round_to_bf16, and x's column sums into sums (ColumnSums in blas.h: = when overwrite, else +=), rows in order;
// with `gate` (laid out as x), of x through it (ReluGate in blas.h): x·gate_scale where gate > 0, else 0.
void round_to_bf16_summing_columns(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, bf16_t* out,
                                   float* sums, bool overwrite, const float* gate = nullptr, float gate_scale = 1);

// One tile: C (m, n) = α·op(A) (m, K) · op(B) (K, n) + β·C, A and B bf16 (or fp32) with row strides lda, ldb
// as stored.
using TileKey = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                           std::int64_t, float, float, bool, bool>;  // ta, tb, m, n, K, lda, ldb, ldc, α, β, bf16, bias

// C = α·op(A)·op(B) + β·C, or with `bias` (n values; the key says so, and then α = 1 and β = 0), op(A)·op(B)
// + the bias on every row, added in the kernel: one oneDNN matmul on this thread.
void onednn_tile(const TileKey& key, const void* A, const void* B, float* C, const float* bias = nullptr);

#ifndef TAPEFORMER_F64
// Whether a held matrix (FrozenMatrices) took the product: then it is done, computed on this thread.
bool held_product(const GemmCall& c);
// Whether the product is one over a held matrix in int8 precision: reference mode runs it as
// reference::gemm_int8.
bool held_int8(const GemmCall& c);
#endif

TF_NAMESPACE_END
