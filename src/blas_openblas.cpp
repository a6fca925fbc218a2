// OpenBLAS and the process's threads: one tile's sgemm or dgemm (gemm_impl), which kernel set OpenBLAS
// runs, the thread counts of OpenMP and OpenBLAS together, and configure_runtime. This is the one file that
// includes cblas.h (STYLE.md item 10); blas.cpp splits the products, blas_xsmm.cpp and blas_onednn.cpp hold
// the other two libraries.
#include "blas_backends.h"
#include "tapeformer/reference_ops.h"

#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <unistd.h>

extern "C" {
void openblas_set_num_threads(int);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

TF_NAMESPACE_BEGIN

// ---- one tile: sgemm or dgemm ---------------------------------------------------------------------------------

bool small_products_on_xsmm() {
    static const bool yes = [] {
        const std::string core = openblas_get_corename();
        return core != "SkylakeX" && core != "Cooperlake";
    }();
    return yes;
}

void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
               std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    if (xsmm_product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

void gemm_impl(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A,
               std::int64_t lda, const double* B, std::int64_t ldb, double beta, double* C, std::int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, ldc);
}

// ---- threads and the runtime ---------------------------------------------------------------------------------

void set_threads(int n) {
    if (reference_mode()) n = 1;  // the reference ops run in order, on one thread
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
