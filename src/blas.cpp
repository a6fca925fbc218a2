// BLAS and thread settings. This is the one file that includes cblas.h (and omp.h outside kernels).
#include "tapeformer/blas.h"

#include <cblas.h>
#include <omp.h>

#include <thread>

#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" {
void openblas_set_num_threads(int);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

TF_NAMESPACE_BEGIN

static void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                      const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                      std::int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

static void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
                      const double* A, std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C,
                      std::int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, real alpha, const real* A,
          std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {  // BLAS leaves C alone only for beta = 1; make the empty sum explicit
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == real(0) ? real(0) : beta * C[i * ldc + j];
        return;
    }
    gemm_impl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
