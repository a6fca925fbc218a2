// Small fp32 products through libxsmm's kernels, generated for each exact shape. The one file that includes
// libxsmm.h; gemm_impl (blas_openblas.cpp) asks xsmm_product first and falls back to sgemm.
#include "blas_backends.h"

#include <libxsmm.h>

#include <string>
#include <vector>

TF_NAMESPACE_BEGIN

// ---- small fp32 products: libxsmm's kernels ----------------------------------------------------------------
// A small product (attention's per-head 20×64·64×20: 13,800 of them a training step of the benchmark's
// model; everything in toy models) goes to a kernel libxsmm generates for its exact shape,
// with no packing — unless OpenBLAS runs its SkylakeX kernels (or Cooperlake's, built on them), which have
// small-matrix kernels of their own, without packing, 8–21% faster than libxsmm's on attention's products.
// The other kernel sets pack both operands at every call, and libxsmm is 1.8–2.4× faster than their sgemm
// there (Haswell's, which the AMD EPYC machines' environment selects; bench_matmul --only attn on a Zen 5,
// bench/README.md).

// C (M, N) = α op(A) op(B) + β C, row-major, through libxsmm; false where it has no kernel for the shape (a
// CPU older than AVX, or a size past its limits): then sgemm does it. libxsmm is column-major and its kernels
// take α = 1, β ∈ {0, 1} and no transposed first operand, so, read column-major, the product is
// Cᵀ = op(B)ᵀ op(A)ᵀ, with op(B) transposed into a copy where the row-major B is transposed, and α and other
// βs applied to the product held apart.
bool xsmm_product(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                  std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    if (M * N * K >= kSmallProduct || !small_products_on_xsmm()) return false;
    const bool apart = (alpha != 1 && beta != 0) || (beta != 0 && beta != 1);  // the product into `product` first
    const int flags = ta ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
    const float one = 1, kernel_beta = apart ? 0 : beta;
    const libxsmm_blasint m = libxsmm_blasint(N), n = libxsmm_blasint(M), k = libxsmm_blasint(K),
                          ld_first = libxsmm_blasint(tb ? N : ldb), ld_second = libxsmm_blasint(lda),
                          ld_out = libxsmm_blasint(apart ? N : ldc);
    const libxsmm_smmfunction kernel =
        libxsmm_smmdispatch(m, n, k, &ld_first, &ld_second, &ld_out, &one, &kernel_beta, &flags, nullptr);
    if (!kernel) return false;
    thread_local std::vector<float> b_copy, product;
    if (tb) {  // B (N, K) -> its transpose (K, N); column-major, that is (K, N) with stride ldb -> (N, K)
        b_copy.resize(std::size_t(K * N));
        libxsmm_otrans(b_copy.data(), B, sizeof(float), libxsmm_blasint(K), libxsmm_blasint(N), libxsmm_blasint(ldb),
                       libxsmm_blasint(N));
        B = b_copy.data();
    }
    float* out = C;
    if (apart) {
        product.resize(std::size_t(M * N));
        out = product.data();
    }
    kernel(B, A, out);  // out (M, N) row-major = op(A) op(B) (+ C when kernel_beta is 1)
    if (apart) {
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] = alpha * out[i * N + j] + beta * C[i * ldc + j];
    } else if (alpha != 1) {
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] *= alpha;
    }
    return true;
}

std::string small_products_info() {
    if (!small_products_on_xsmm()) return std::string("OpenBLAS (its ") + blas_core() + " small-matrix kernels)";
    const std::string arch = libxsmm_get_target_arch();  // "generic" where it generates no kernels
    if (arch == "generic") return "OpenBLAS (libxsmm " LIBXSMM_VERSION " has no kernels for this CPU)";
    return "libxsmm " LIBXSMM_VERSION " (" + arch + ")";
}

TF_NAMESPACE_END
