// The only door to BLAS. gemm computes C = alpha * op(A) * op(B) + beta * C on row-major matrices,
// op(X) = X or Xᵀ; it is overloaded for float and double, so the float64 build of the library runs the
// same code through dgemm. set_threads sets OpenMP's and OpenBLAS's thread counts together, so that the
// two never oversubscribe the cores.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// op(A): (M, K), op(B): (K, N), C: (M, N); lda/ldb/ldc are the row strides of the stored matrices.
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, real alpha,
          const real* A, std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C, std::int64_t ldc);

// `batch` products of one shape, C_i = α·op(A_i)·op(B_i) + β·C_i with A_i = A + i·a_step, B_i = B + i·b_step,
// C_i = C + i·c_step. Small products (attention's 20×64·64×20) are shared out among the threads, each one
// computed whole by one thread; large ones run one after another, each split into tiles by gemm. In bf16
// the small ones go to oneDNN in a few batched calls instead of one call each.
void gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t M, std::int64_t N, std::int64_t K,
                  real alpha, const real* A, std::int64_t lda, std::int64_t a_step, const real* B, std::int64_t ldb,
                  std::int64_t b_step, real beta, real* C, std::int64_t ldc, std::int64_t c_step);

// The same product with three plain loops: the reference the tests compare gemm (and matmul) against.
void gemm_reference(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, real alpha,
                    const real* A, std::int64_t lda, const real* B, std::int64_t ldb, real beta, real* C,
                    std::int64_t ldc);

// ---- precision of the products ---------------------------------------------------------------------------
// FP32: gemm is sgemm (the default). BF16 (the float build only): every gemm rounds its operands A and B to
// bfloat16 (to nearest, ties to even) and multiplies them with oneDNN's bf16 matmul, summing in fp32 —
// PyTorch's CPU autocast recipe for matmuls. Everything else (the weights and the optimizer's state,
// softmax, layer norm, the loss) stays fp32. The products are split into tiles as sgemm's are, each tile one
// single-threaded oneDNN call, so bf16 results too are the same on any thread count. The float64 build
// (gradient checks) ignores the setting.
enum class Precision { FP32, BF16 };
Precision parse_precision(const std::string& text);  // "fp32" or "bf16"; std::invalid_argument otherwise
const char* precision_name(Precision p);              // "fp32", "bf16"

// Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX), as oneDNN sees it (so that
// ONEDNN_MAX_CPU_ISA=AVX512_CORE hides it).
bool cpu_has_bf16();

// Sets the precision of every later gemm in this process. BF16 on a CPU without bf16 instructions sets
// FP32 instead and returns one line saying so (for the user); otherwise returns "".
std::string set_precision(Precision p);
Precision precision();

// bf16 copies of matrices that do not change for a while — a model's weights while it decodes. While one
// of these lives, a bf16 gemm whose B operand is a matrix added to it reads B from the copy, rounded once
// by add(), instead of rounding the whole matrix again on every call: decoding multiplies the same weight
// matrices by a few rows at every step, and rounded them more often than it multiplied them (the (8000,
// 256) output projection by 64 rows, 20 times a batch). The results are the same bits as without it. The
// matrices must not change while it lives; the caller (decode.h's FrozenWeights) makes sure of that. One
// lives at a time (a second one throws std::logic_error); add() keeps nothing when the precision is fp32.
class FrozenBf16 {
public:
    FrozenBf16();
    ~FrozenBf16();
    FrozenBf16(const FrozenBf16&) = delete;
    FrozenBf16& operator=(const FrozenBf16&) = delete;

    void add(const real* data, std::int64_t rows, std::int64_t cols);  // a dense (rows, cols) matrix
    std::size_t size() const { return matrices_.size(); }               // matrices held

    // The copy of B, a (rows, cols) matrix with row stride ld, if B is one of the matrices held or some of
    // its consecutive rows (the query rows of a fused Q, K, V weight); else null.
    const std::uint16_t* find(const real* B, std::int64_t rows, std::int64_t cols, std::int64_t ld) const;

private:
    struct Matrix {
        std::int64_t rows, cols;
        std::vector<std::uint16_t> bf16;  // (rows, cols), dense
    };
    std::map<const real*, Matrix> matrices_;
};

void set_threads(int n);   // n <= 0: all cores
int num_threads();
const char* blas_info();   // OpenBLAS's configuration string (core, threading)
const char* blas_core();   // the kernel family OpenBLAS picked for this CPU ("SkylakeX", "Haswell", ...)

// Two settings that OpenMP and OpenBLAS read only when the program loads, so they are fixed by setting
// the environment and starting the program again (once; an explicit setting by the user is kept):
// - OMP_WAIT_POLICY=passive: by default idle OpenMP threads spin, which on a busy machine (more runnable
//   threads than cores) made 2-thread training 15-20x slower than passive waiting (604 vs 11,767 target
//   tokens/s on the toy preset at load 8); on an idle machine passive costs a few microseconds per region.
// - OPENBLAS_CORETYPE: OpenBLAS 0.3.21 does not recognise some newer CPUs (e.g. Sapphire Rapids Xeons)
//   and falls back to its generic "Prescott" SSE3 kernels, 2.5-3x slower; with AVX-512 (AVX2) we ask
//   for SkylakeX (Haswell).
// Returns normally when nothing needs doing or the re-exec fails.
void configure_runtime(char** argv);

TF_NAMESPACE_END
